# One job per experiment trial. A job takes every core Snakemake was given, so
# no two measurements ever overlap (overlapping runs on a small machine skewed
# timings up to 10x). The launcher always writes a record, also for a failed,
# crashed or timed-out run, so one bad experiment never stops the study.


rule run_experiment:
    input:
        unpack(experiment_inputs),
    output:
        record="results/records/{experiment}/trial{trial}.json",
    log:
        "logs/experiments/{experiment}/trial{trial}.log",
    params:
        spec=experiment_spec,
        image_folder=experiment_image_folder,
        runtime=SETTINGS["runtime"],
    threads: workflow.cores
    shell:
        "{PYTHON} -m workflow_scripts.launch --spec-json {params.spec:q}"
        " --env-json {input.env} --out {output.record} --log {log}"
        " --trial {wildcards.trial} --image-folder={params.image_folder:q}"
        " --runtime {params.runtime}"
