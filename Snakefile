# A reproducible study of PyTorch training performance on CPUs.
# The experiments are listed in config.yaml; the code behind the rules lives in
# workflow_scripts/. Run: snakemake --cores all   (see README.md)
import sys

from snakemake.utils import min_version

min_version("9.0")

sys.path.insert(0, workflow.basedir)
from workflow_scripts.study import load_for_snakemake


configfile: "config.yaml"


# One validation pass, by the study's own loader: every error at once, each naming the
# field, the value and what is allowed (the schema is derived from workflow_scripts/study).
STUDY = load_for_snakemake(config, workflow.basedir)


include: "rules/common.smk"
include: "rules/envs.smk"
include: "rules/images.smk"
include: "rules/experiments.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        summary="results/summary.csv",
        report="results/report/index.html",
        images=expand("results/images/{image}.json", image=IMAGES),
