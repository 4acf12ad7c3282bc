# A reproducible study of PyTorch training performance on CPUs.
# The experiments are listed in config.yaml; the code behind the rules lives in
# workflow_scripts/. Run from the repository root: snakemake --cores all   (README.md)
import os
import sys

from snakemake.utils import min_version

# 9.17: a rule's priority may be a function (the trials' rounds, rules/common.smk);
# 9.0.1 stops at "Priority values have to be numeric". Tested: 9.17.0 and 9.27.1.
min_version("9.17")

# The workflow's code, in the working directory (where Snakemake reads config.yaml).
sys.path.insert(0, os.getcwd())
from workflow_scripts.study import (
    command_line_config,
    configfiles_given,
    load_for_snakemake,
    runs_jobs,
)

# What the command line set (--configfile files, then --config): Snakemake's `config`
# holds it until the configfile statement below merges config.yaml under it. It wins
# over a preset, as over config.yaml. (Also: config.yaml and the --configfile files read
# as plain data, bounded, a duplicate key with both lines.)
COMMAND_LINE = command_line_config(config, "config.yaml", configfiles_given(sys.argv))


configfile: "config.yaml"


# One validation pass, by the study's own loader: every error at once, each naming the
# field, the value and what is allowed (the schema is derived from workflow_scripts/study),
# then the checks that need this machine (CPUs, memory, files). A run that runs jobs
# (not -n) first forgets the trials the budget's clock left out last time.
STUDY = load_for_snakemake(config, COMMAND_LINE, runs_jobs(sys.argv))


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
        stages=stage_reports(),
        rounds=round_reports(),
        images=expand("results/images/{image}.json", image=IMAGES),
