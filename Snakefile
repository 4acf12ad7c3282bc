# A reproducible study of PyTorch training performance on CPUs.
# The experiments are listed in config.yaml; the code behind the rules lives in
# workflow_scripts/. Run: snakemake --cores all   (see README.md)
import sys

from snakemake.utils import min_version

min_version("9.0")

sys.path.insert(0, workflow.basedir)
from workflow_scripts.study import check_config_files, load_for_snakemake

# The config files' YAML syntax, with line and column, before Snakemake reads them.
check_config_files(workflow, "config.yaml")


configfile: "config.yaml"


# One validation pass, by the study's own loader: every error at once, each naming the
# field, the value and what is allowed (the schema is derived from workflow_scripts/study),
# then the checks that need this machine (CPUs, memory, files); --config wins over a preset.
STUDY = load_for_snakemake(workflow, config)


include: "rules/common.smk"
include: "rules/envs.smk"
include: "rules/images.smk"
include: "rules/experiments.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        summary=f"{RESULTS}/summary.csv",
        report=f"{RESULTS}/report/index.html",
        images=expand("results/images/{image}.json", image=IMAGES),
