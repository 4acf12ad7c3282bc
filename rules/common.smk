# Helpers shared by the rules: the expanded study and the input functions.
import json
import sys

sys.path.insert(0, workflow.basedir)

from workflow_scripts.study import StudyConfigError, load_study  # noqa: E402

try:
    STUDY = load_study(config, workflow.basedir)
except StudyConfigError as exc:
    raise WorkflowError(str(exc)) from None

SETTINGS = STUDY.settings
# The interpreter running Snakemake runs the workflow's own scripts.
PYTHON = sys.executable
TRIALS = list(range(SETTINGS["trials"]))
ENVS = STUDY.envs
IMAGE_FOLDER = "resources/image_folder"


wildcard_constraints:
    env="|".join(ENVS) or "none",
    experiment="|".join(STUDY.ids),
    trial=r"\d+",


def all_records():
    """Every trial record of the study, trial k of every experiment before trial k+1."""
    return [
        f"results/records/{exp['id']}/trial{trial}.json"
        for trial in TRIALS
        for exp in STUDY.experiments
    ]


def experiment_inputs(wildcards):
    """The environment an experiment runs in, and the image folder if it reads one."""
    spec = STUDY.by_id[wildcards.experiment]
    inputs = {"env": f"results/envs/{spec['env']}.json"}
    if spec["data"] == "image_folder" and not spec["data_dir"]:
        inputs["images"] = IMAGE_FOLDER
    return inputs


def experiment_spec(wildcards):
    """The resolved spec as JSON: a param, so editing an experiment reruns exactly it."""
    return STUDY.spec_json(wildcards.experiment)


def experiment_image_folder(wildcards):
    spec = STUDY.by_id[wildcards.experiment]
    if spec["data"] != "image_folder":
        return ""
    return spec["data_dir"] or IMAGE_FOLDER


def env_python():
    return SETTINGS["python"] or PYTHON


def prices_json():
    return json.dumps(SETTINGS["prices"])
