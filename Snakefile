# A reproducible study of PyTorch training performance on CPUs.
# The experiments are listed in config.yaml; the code behind the rules lives in
# workflow_scripts/. Run: snakemake --cores all   (see README.md)
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow_scripts/schemas/config.schema.yaml")


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
