# Helpers shared by the rules: the study's settings and the input functions.
# STUDY (the validated, expanded config) comes from the Snakefile.
import json
import sys
from pathlib import Path

from workflow_scripts import collectives, envs, images, jobs, snakemake_timers
from workflow_scripts.cluster import sizing
from workflow_scripts.plan import far, order, progress, rounds, study_estimate
from workflow_scripts.study import replan

SETTINGS = STUDY.settings
# Where the records, collectives, summary and report go: results/, a pre-flight's apart.
RESULTS = STUDY.results
LOGS = STUDY.logs
# One pending re-evaluation timer in Snakemake's scheduler instead of a chain per job
# event (they took a core beside the trials after ~400 jobs): workflow_scripts/snakemake_timers.py
snakemake_timers.install()
# When this run started: set by the main process, inherited by every job (progress lines).
progress.started_at()
# The interpreter running Snakemake runs the workflow's own scripts.
PYTHON = sys.executable
# Every experiment runs `trials` trials; up to `max_trials` where a comparison is still
# undecided (the adaptive rounds, round_experiments below).
MIN_TRIALS = SETTINGS["trials"]
TRIALS = list(range(rounds.cap(SETTINGS)))
# The allreduce microbenchmark's process-group variants (gloo, ccl-shm, ...), each a job.
COLLECTIVES = SETTINGS["collectives"]["variants"]
ENVS = sorted({*STUDY.envs, *(collectives.env_of(v) for v in COLLECTIVES)})
IMAGE_FOLDER = "resources/image_folder"
DIGITS = "resources/digits"
# Where the experiments run: local virtualenvs, or podman/docker images ("auto" picks).
try:
    RUNTIME, _note = images.resolve_runtime(SETTINGS["runtime"], SETTINGS["container_engine_conf"])
except images.ImageError as exc:
    raise WorkflowError(str(exc)) from None
if _note:
    print(_note, file=sys.stderr)
IN_CONTAINERS = RUNTIME in images.ENGINES
# In virtualenvs here, the allocators run_cpu preloads come from this machine (the
# images install them): say before the study which runs would fail without them.
_missing = None if IN_CONTAINERS else envs.missing_allocators(STUDY.experiments)
if _missing:
    print(_missing, file=sys.stderr)
CONTAINERS = SETTINGS["containers"]
WHEELHOUSE = CONTAINERS["wheelhouse"]
# In containers the study builds every image (oneccl too, for the distributed runs),
# parents first; the locks their builds install, and their installer's.
IMAGES = list(images.IMAGES) if IN_CONTAINERS else []
# Where the images are saved for a cluster's nodes (containers.archive; None: nowhere).
ARCHIVES = CONTAINERS["archive"] if IN_CONTAINERS else None
LOCKS = sorted({lock for i in IMAGES for lock in images.locks_of(i)})
LOCKS += [images.INSTALLER_LOCK] if LOCKS else []


PROBE_SIZES = sorted({s["probe_size"] for s in STUDY.experiments if s["probe_size"] > 0})

# Scheduling order. Snakemake starts the ready job of the highest priority first
# (with either scheduler, ilp or greedy). Trial k of every experiment runs before
# trial k+1 of any: the trial's priority falls with its index, and the jobs that
# experiments wait for (environments, image folder, calibration) come before all of
# them, so no trial k+1 can start while a trial k still waits for its environment.
# Within a round the question comes first (workflow_scripts/plan/order.py): the
# headline's group (its second trials too, in the first round: EARLY below), then each
# other group's first run, then the rest cheapest first. Priorities change no job's
# inputs, so they never cause a rerun.
RUN_ORDER = order.run_order(STUDY.experiments, study_estimate.trial_seconds(STUDY))
ORDER_RANK = {experiment: i for i, experiment in enumerate(RUN_ORDER)}
# A budget's plan made again (STUDY.replan; workflow_scripts/study/replan.py): its reserve
# runs after every trial of the plan's own experiments (PLANNED), each reserve's trials
# together, in the run order, as far as the plan made after the calibrations and the
# first trials of its own keeps it (the checkpoint budget_plan).
RESERVE = [e for e in RUN_ORDER if STUDY.replan and e in STUDY.replan["reserve"]]
RESERVE_RANK = {experiment: i for i, experiment in enumerate(RESERVE)}
RESERVE_LEVELS = len(RESERVE) * MIN_TRIALS
PLANNED = [e for e in STUDY.ids if e not in RESERVE_RANK]
# the first round's provisional reports (results/rounds/<stage>/): their experiments
STAGES = order.stages(STUDY.experiments, MIN_TRIALS)
# Below the minimum: a seed sweep's seeds are its replicates (FIRST_TRIALS), and an
# experiment whose first trial stopped far slower than its baseline, by its far_stop
# squared, runs no other (FAR_STOPS: those that may, their far_stop beyond the margin;
# the first round's report, a checkpoint, comes after every trial 0). A budget's reserve aside: the plan's
# own seeds are counted among themselves (workflow_scripts/study/replan.py).
FIRST_TRIALS = replan.first_trials(STUDY, RESERVE, MIN_TRIALS)
FAR_STOPS = {
    e["id"]
    for e in STUDY.experiments
    if far.baseline_of(e, STUDY.experiments) and rounds.one_trial_when_far(e, SETTINGS["margin"])
}
# The headline's intervals early: its group's second trials run right after its first,
# before any other experiment's first (those that run a second: EARLY), in the
# first round's priorities; the stage "headline" reports them.
HEAD = len(STAGES.get("first", []))
EARLY = [e for e in STAGES.get("headline", []) if FIRST_TRIALS[e] > 1 and e not in RESERVE_RANK]
EARLY_RANK = {experiment: i for i, experiment in enumerate(EARLY)}
if not EARLY:  # (a seed sweep's seeds, or a budget's reserve: its report would add nothing)
    STAGES.pop("headline", None)
# the priorities of one round: its trials' (1 .. n, and the headline's second trials in
# the first), and the report after it
ROUND_LEVELS = len(RUN_ORDER) + len(EARLY) + 1
SETUP_PRIORITY = (len(TRIALS) + 1) * ROUND_LEVELS + RESERVE_LEVELS


wildcard_constraints:
    env="|".join(ENVS) or "none",
    image="|".join(images.IMAGES),
    lock="|".join(LOCKS) or "none",
    experiment="|".join(STUDY.ids),
    trial=r"\d+",
    round=r"\d+",
    stage="|".join(STAGES) or "none",
    variant="|".join(COLLECTIVES) or "none",


# The reference noise probes, made by the calibrate jobs, one per environment, measured
# in that environment (or its image), because the torch releases differ in their
# matmul kernels (here torch 2.8's fp32 matmul ran at less than half of torch 2.14's:
# against one shared reference every IPEX trial looked disturbed). For the probe
# sizes the experiments use and for 1, 2, 4, ... and all CPUs (the launcher scales
# the nearest count for others).
def calibration(env):
    return f"results/calibration/{env}.json"


def trial_priority(wildcards):
    """Trial 0 highest, the question first within a round: each round has its level of
    ROUND_LEVELS priorities, trial 0's the highest. Positive: the ilp scheduler's
    objective rewards starting a job by its priority, and would rather start nothing
    than a job of negative priority. A budget's reserve below all of them (1 ..
    RESERVE_LEVELS), each one's trials together."""
    trial = int(wildcards.trial)
    if wildcards.experiment in RESERVE_RANK:
        return (len(RESERVE) - RESERVE_RANK[wildcards.experiment]) * MIN_TRIALS - trial
    k, slot = round_slot(wildcards.experiment, trial)
    return round_level(k) + ROUND_LEVELS - 1 - slot


def round_level(k):
    """The base of round k's priorities (every trial k above every trial k+1)."""
    return (len(TRIALS) - k) * ROUND_LEVELS + RESERVE_LEVELS


def round_slot(experiment, trial):
    """A trial's round and its place in that round (0 first): the run order, the
    headline's second trials in the first round, right after its first ones."""
    if trial == 1 and experiment in EARLY_RANK:
        return 0, HEAD + EARLY_RANK[experiment]
    rank = ORDER_RANK[experiment]
    return trial, rank + (len(EARLY) if trial == 0 and rank >= HEAD else 0)


def round_experiments(k):
    """The experiments with a trial k: every one in the first round; below the minimum
    (``trials``), every one but a seed sweep's beyond its share and those whose first
    trial stopped far slower than their baseline; then, of those that ran the minimum,
    the ones that a comparison still undecided after round k-1 names (one the cap may
    still decide: futility), or one the headline states whose interval is not yet within
    the margin (that round's report is a checkpoint; workflow_scripts/plan/rounds.py),
    also one that sat out a round (its trial numbers then have a gap); none once a round
    ran none."""
    if k == 0:
        return PLANNED
    if k < MIN_TRIALS:
        going = [e for e in PLANNED if FIRST_TRIALS[e] > k]
        if FAR_STOPS.intersection(going):
            checkpoints.round_report.get(round=0)
            far_ones = rounds.stopped_far(f"{RESULTS}/records", FAR_STOPS.intersection(going))
            going = [e for e in going if e not in far_ones]
        return going
    if not round_experiments(k - 1):
        return []
    decided_by = checkpoints.round_report.get(round=k - 1).output.comparisons
    return rounds.going_on(decided_by, round_experiments(MIN_TRIALS - 1), SETTINGS, k - 1)


def reserve_records():
    """The trials of the budget's reserve that the plan made again runs (its minimum
    each; none where the plan was not made again)."""
    if not RESERVE:
        return []
    runs = replan.admitted(checkpoints.budget_plan.get().output.plan)
    return [f"{RESULTS}/records/{e}/trial{k}.json" for e in runs for k in range(FIRST_TRIALS[e])]


def replan_json():
    """What the plan made again chooses from: its must-runs and its reserve."""
    return json.dumps(STUDY.replan or {}, sort_keys=True)


def budget_plan_inputs(wildcards):
    """What the plan made again goes by: every calibration, and the first trial of each
    of the plan's own experiments."""
    return {
        "calibrations": [calibration(env) for env in STUDY.envs],
        "records": [f"{RESULTS}/records/{e}/trial0.json" for e in PLANNED] if RESERVE else [],
    }


def budget_plan_file(wildcards):
    """The plan made again, for the report to state (none where there is none)."""
    return [str(replan.path(RESULTS))] if STUDY.replan else []


def report_progress():
    """A trial's progress line, of the study as this run plans it (the budget's plan made
    again, where it was; before it, with what its reserve may add)."""
    progress.report(replan.applied(STUDY), reserve_s=replan.pending_s(STUDY))


def all_records(last=None):
    """Every trial record of the study (of its first ``last`` rounds), trial k of every
    experiment before trial k+1 (the order of the report's rows; the run order comes
    from trial_priority)."""
    records = [
        f"{RESULTS}/records/{experiment}/trial{trial}.json"
        for trial in TRIALS[:last]
        for experiment in round_experiments(trial)
    ]
    return records if last else records + reserve_records()


def report_records(wildcards):
    return all_records()


# The answer early: after each round but the last (trial k of every experiment it
# runs), a provisional report of the rounds so far, in results/rounds/<k>/; the last
# round's is the report. Its priority is the round's: it runs as soon as the round
# ends, before any trial of the next. From round trials-1 on, its comparisons.csv
# decides who runs the next round.
ROUNDS = TRIALS[:-1]


def round_records(wildcards):
    return all_records(int(wildcards.round) + 1)


def round_early_records(wildcards):
    """Round 0's report holds the headline's second trials too, which ran before it (a
    provisional report holds every trial the study has: the headline's intervals stay in
    the newer reports). An input of its own: its list may wait for the first stage's
    report, a checkpoint, which the round's records must not (else a dry run would not
    see them)."""
    return early_records() if int(wildcards.round) == 0 else []


def round_priority(wildcards):
    """Above every trial of its round, below every trial of the round before (which
    have all run when it can): it runs as soon as its round ends."""
    return round_level(int(wildcards.round)) + ROUND_LEVELS


# The question first: provisional reports of the first round's stages (STAGES: the
# headline's group, its second trials, then every group's baseline and ladder besides)
# as soon as their trials have run, before the rest of the study.
def stage_experiments(stage):
    """Its experiments of the study's (a budget's reserve, not yet planned, in none)."""
    return [e for e in STAGES[stage] if e not in RESERVE_RANK]


def stage_records(wildcards):
    return [f"{RESULTS}/records/{e}/trial0.json" for e in stage_experiments(wildcards.stage)]


def stage_early_records(wildcards):
    """The headline's second trials, in the stages from the headline's on (as
    round_early_records)."""
    return early_records() if order.headline_trials(wildcards.stage, MIN_TRIALS) > 1 else []


def early_records():
    """The records of the headline's second trials that run in the first round (none
    where none does)."""
    return [f"{RESULTS}/records/{e}/trial1.json" for e in early_seconds()] if EARLY else []


def early_seconds():
    """The headline's experiments that run their second trial early: EARLY, but those
    whose first trial stopped far slower than its baseline (they run no other; the
    first stage's report, a checkpoint, comes after those first trials)."""
    maybe_far = FAR_STOPS.intersection(EARLY)
    if not maybe_far:
        return EARLY
    checkpoints.stage_report.get(stage="first")
    far_ones = rounds.stopped_far(f"{RESULTS}/records", maybe_far)
    return [e for e in EARLY if e not in far_ones]


def stage_priority(wildcards):
    """Above every trial after the stage's own (they lead the round's order); the last
    of its own it waits for anyway."""
    stage = wildcards.stage
    last = max(round_slot(e, 0)[1] for e in STAGES[stage])
    if EARLY and order.headline_trials(stage, MIN_TRIALS) > 1:
        last = max(last, round_slot(EARLY[-1], 1)[1])
    return round_level(0) + ROUND_LEVELS - 1 - last


def stage_title(wildcards):
    """What a stage's report holds, of how many of the study's experiments."""
    words = order.STAGE_WORDS[wildcards.stage]
    n = len(stage_experiments(wildcards.stage))
    more = "; more once the study plans again" if RESERVE else ""
    return (
        f"{order.PROVISIONAL}: {words} ({n} of {len(RUN_ORDER) - len(RESERVE)} experiments"
        f"{more}; the study goes on; its report: results/report/index.html)"
    )


def stage_reports():
    return [f"{RESULTS}/rounds/{stage}/report/index.html" for stage in STAGES]


def round_title(wildcards):
    k = int(wildcards.round) + 1
    if len(TRIALS) > MIN_TRIALS:
        planned = f"{MIN_TRIALS} to {len(TRIALS)} trials (more where undecided)"
    else:
        planned = f"{len(TRIALS)} trials"
    early = ", the headline's group's first 2" if k == 1 and EARLY else ""
    return (
        f"{order.PROVISIONAL}: the first {k} of {planned} of every experiment{early} "
        "(the study goes on; its report: results/report/index.html)"
    )


def round_look(wildcards):
    """Which look at the comparisons a round's report is: the first after the
    minimum's trials (the provisional ones before: the first too)."""
    return rounds.look_of(int(wildcards.round), SETTINGS)


def round_reports():
    """The provisional reports of the rounds every experiment runs (but the last); the
    adaptive rounds' reports come in as the checkpoints the report's records wait for."""
    return [f"{RESULTS}/rounds/{k}/report/index.html" for k in ROUNDS[:MIN_TRIALS]]


def experiment_inputs(wildcards):
    """The environment an experiment runs in, the image folder if it reads one, the
    reference probe if it runs the noise probe (ancient(), so that a new calibration
    reruns no experiment), the record of the run whose trained weights it serves, a
    later trial's first trial's record (ancient(): a rerun of trial 0 reruns no other)
    and its far pointer, to the first trial's record of the run it stops early against
    (far_stop; plan/far.py)."""
    spec = STUDY.by_id[wildcards.experiment]
    if IN_CONTAINERS:
        inputs = image_inputs_of(images.image_for(spec))
    else:
        inputs = {"env": f"results/envs/{spec['env']}.json"}
    if spec["data"] == "image_folder" and not spec["data_dir"]:
        inputs["images"] = IMAGE_FOLDER
    if spec["data"] == "digits":
        inputs["digits"] = DIGITS
    if spec["probe_size"] > 0:
        inputs["reference_probe"] = ancient(calibration(spec["env"]))
    if spec["weights_from"]:  # the served weights: those its first trial trained
        inputs["weights_from"] = f"{RESULTS}/records/{spec['weights_from']}/trial0.json"
    if int(wildcards.trial) > 0:  # what a later trial carries from its first (carry.py)
        inputs["first_trial"] = ancient(f"{RESULTS}/records/{spec['id']}/trial0.json")
    if far.has_pointer(spec, STUDY.experiments):  # far from it, a trial stops early
        inputs["far_baseline"] = ancient(far_pointer(spec["id"]))
    return inputs


def far_pointer(experiment):
    return f"{RESULTS}/far/{experiment}.json"


def far_baseline_id(wildcards):
    return far.baseline_of(STUDY.by_id[wildcards.experiment], STUDY.experiments) or ""


def far_baseline_inputs(wildcards):
    """The first trial's record of the run a trial stops early against (ancient: a rerun
    of it reruns nothing else); none where no earlier run of the group does its work."""
    baseline = far_baseline_id(wildcards)
    return {"record": ancient(f"{RESULTS}/records/{baseline}/trial0.json")} if baseline else {}


def env_inputs(wildcards):
    """An environment's lock, and the sources of the extensions built into it."""
    lock = f"envs/{wildcards.env}.txt"
    return {"requirements": lock, "extensions": envs.extension_sources(lock)}


def collectives_inputs(wildcards):
    """The environment (or image) of a collectives variant: gloo in upstream's, ccl in
    oneccl's."""
    if IN_CONTAINERS:
        return image_inputs_of(collectives.image_of(wildcards.variant))
    return {"env": f"results/envs/{collectives.env_of(wildcards.variant)}.json"}


def collectives_results():
    return expand(f"{RESULTS}/collectives/{{variant}}.json", variant=COLLECTIVES)


def collectives_json():
    return json.dumps(SETTINGS["collectives"], sort_keys=True)


def image_json(image):
    return f"results/images/{image}.json"


def image_inputs_of(image, mark=None):
    """A measured job's image record (``mark``: ancient, for a calibration) and, on a
    cluster, its archive in the shared folder (ancient: a new archive reruns nothing)."""
    inputs = {"image": mark(image_json(image)) if mark else image_json(image)}
    if ARCHIVES:
        inputs["image_archive"] = ancient(f"{ARCHIVES}/{image}.tar")
    return inputs


def calibration_inputs(wildcards):
    """The probe runs where the trials run: the environment, or its image. ancient():
    a rebuilt environment or image keeps its reference (while calibrate has to run,
    Snakemake would hold back the experiments behind it that have their own reason
    to rerun until the next invocation); recalibrate with -R calibrate."""
    if IN_CONTAINERS:
        return image_inputs_of(images.env_image(wildcards.env), ancient)
    return {"env": ancient(f"results/envs/{wildcards.env}.json")}


def image_inputs(wildcards):
    """An image's build inputs: its build context, its parent's record (a rebuilt
    parent rebuilds its children) and the lock it installs, from the wheelhouse."""
    parent, lock = images.IMAGES[wildcards.image]
    inputs = {}
    if parent:
        context = f"containers/{wildcards.image}"
        inputs["context"] = sorted(str(p) for p in Path(context).iterdir() if p.is_file())
        inputs["parent"] = image_json(parent)
    if lock:
        inputs["lock"] = f"{WHEELHOUSE}/locks/{lock}.txt"
        # (and the installer's own, which install-env takes from the wheelhouse too)
        inputs["installer"] = f"{WHEELHOUSE}/locks/{images.INSTALLER_LOCK}.txt"
    return inputs


def base_image_json():
    return json.dumps(CONTAINERS["base"], sort_keys=True)


def experiment_spec(wildcards):
    """The resolved spec as JSON: a param, so editing an experiment reruns exactly it."""
    return STUDY.spec_json(wildcards.experiment)


def experiment_data_path(wildcards):
    """The folder the experiment's data is read from (mounted into its container)."""
    spec = STUDY.by_id[wildcards.experiment]
    if spec["data"] == "digits":
        return DIGITS
    if spec["data"] != "image_folder":
        return ""
    return spec["data_dir"] or IMAGE_FOLDER


def env_python():
    return SETTINGS["python"] or PYTHON


def prices_json():
    return json.dumps(SETTINGS["prices"])


def budget_plan_json():
    """What a budget's plan left out before any trial ran (study/entry.py plan_budget),
    for the report to say: {} where it left out nothing."""
    if not STUDY.left_out:
        return "{}"
    planned = len(STUDY.experiments) + len(STUDY.left_out)
    return json.dumps(
        {"budget": str(SETTINGS["budget"]), "planned": planned, "left_out": STUDY.left_out}
    )


# ---- what each job asks for (workflow_scripts/cluster/sizing.py) ----
# On a cluster (snakemake --profile profiles/slurm) the resources become sbatch options:
# measured jobs take whole nodes, with their CPUs (cpus_per_task), memory and time
# limit. Locally they limit nothing, and a measured job's threads are every core
# Snakemake was given (workflow.cores): a lock, so that no two measurements ever
# overlap (overlapping runs on a small machine skewed timings up to 10x). A job's
# threads reach no command line: on a cluster they are only Snakemake's bookkeeping.
def experiment_resources(wildcards):
    return sizing.experiment(STUDY.by_id[wildcards.experiment], SETTINGS)


def experiment_resource(name):
    """One resource of a trial's job, by name (a named function per resource)."""

    def resource(wildcards):
        return experiment_resources(wildcards)[name]

    resource.__name__ = f"experiment_{name}"
    return resource


def trial_slurm_extra(wildcards, attempt):
    """A trial's sbatch options: whole nodes, and where the study blocks its trials by
    node (cluster.block_by_node), the node of its block (workflow_scripts/cluster/sizing.py)."""
    spec = STUDY.by_id[wildcards.experiment]
    index = STUDY.ids.index(wildcards.experiment)
    node = sizing.block_node(SETTINGS, spec, index, int(wildcards.trial), attempt)
    return experiment_resources(wildcards)["slurm_extra"] + node


def job_attempt(wildcards, attempt):
    """Which attempt of its job this is (1; 2 when the profile's retry submits a job
    again that failed while Snakemake ran): a trial's retry records how an earlier job
    of this run was lost, where a resumed study's first attempt runs a trial again that
    Snakemake itself stopped (workflow_scripts/trial/lost.py)."""
    return attempt


def measured_threads(wildcards):
    """A measured job's threads (a trial, a calibration, the allreduce benchmark): every
    core Snakemake was given."""
    return workflow.cores


# The partition, account and node features of the measured jobs (the cluster setting's;
# unset ones leave a profile's --default-resources in force).
PLACEMENT = sizing.placement(SETTINGS)
CALIBRATION_RESOURCES = sizing.calibration(SETTINGS)
COLLECTIVES_RESOURCES = sizing.collectives(SETTINGS)
BUILD_ENV_RESOURCES = sizing.setup("build_env")
BUILD_IMAGE_RESOURCES = sizing.setup("build_image")
WHEELHOUSE_RESOURCES = sizing.setup("wheelhouse")
DATA_RESOURCES = sizing.setup("data")
REPORT_RESOURCES = sizing.setup("report")


# Preparation runs on the submit host, never in a cluster job: it downloads (wheels,
# packages), which compute nodes often cannot, and it writes the environments and
# images onto the filesystem the nodes share. Only measured jobs go to the cluster;
# and the environment builds where a site keeps heavy work off its login nodes
# (cluster.build_on: compute; the build rules' localrule: BUILDS_LOCAL).
localrules:
    wheelhouse,
    budget_plan,
    far_baseline,
    image_folder,
    digits,
    report,
    round_report,
    stage_report,


BUILDS_LOCAL = sizing.builds_local(SETTINGS)
_build_problem = sizing.build_problem(SETTINGS, IN_CONTAINERS)
if _build_problem:
    raise WorkflowError(_build_problem)
