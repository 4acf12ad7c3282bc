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
    threads: workflow.cores
    params:
        spec=experiment_spec,
        image_folder=experiment_image_folder,
        runtime=SETTINGS["runtime"],
    run:
        from workflow_scripts import launch

        launch.main(
            [
                f"--spec-json={params.spec}",
                f"--env-json={input.env}",
                f"--out={output.record}",
                f"--log={log[0]}",
                f"--trial={wildcards.trial}",
                f"--image-folder={params.image_folder}",
                f"--runtime={params.runtime}",
            ]
        )
