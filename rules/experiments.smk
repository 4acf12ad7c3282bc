# The measured jobs: the calibrations, the trials, their far pointers and the allreduce
# benchmark.


# The reference noise probe of each environment: 3 probes (median) per probe size and
# thread count, with the machine to itself. It never fails: without a reference, trials run unchecked.
# Its params do not depend on the experiments, and the probe sizes are read in the
# run block: editing an experiment must not rerun it. When calibrate runs, Snakemake
# does not look at the experiments behind it (their reference_probe input is ancient)
# for their own reasons to rerun in the same invocation. Recalibrate with
# `snakemake -R calibrate --until calibrate` when nothing else is pending.
rule calibrate:
    input:
        unpack(calibration_inputs),
    output:
        probe=calibration("{env}"),
    log:
        "logs/calibration/{env}.log",
    priority: SETUP_PRIORITY
    threads: measured_threads
    resources:
        **PLACEMENT,
        cpus_per_task=CALIBRATION_RESOURCES["cpus_per_task"],
        mem_mb=CALIBRATION_RESOURCES["mem_mb"],
        runtime=CALIBRATION_RESOURCES["runtime"],
        slurm_extra=CALIBRATION_RESOURCES["slurm_extra"],
    params:
        threads="auto",
        repeats=3,
        # the matmul sizes of the machine's ceiling (a change recalibrates)
        ceiling_sizes="1024,2048,4096",
    run:
        jobs.run(
            "workflow_scripts.calibration",
            input,
            output,
            params,
            wildcards,
            log,
            settings={"probe_sizes": PROBE_SIZES, "containers": CONTAINERS},
        )


# A budget's plan made again once the calibrations have measured this machine and the
# first trials of its own experiments how far its estimate is off: only where the plan
# before any job had no calibration to go by (STUDY.replan, workflow_scripts/study/
# replan.py). A checkpoint: the final report's records hold the reserve it runs.
checkpoint budget_plan:
    input:
        unpack(budget_plan_inputs),
    output:
        plan=str(replan.path(RESULTS)),
    log:
        f"{LOGS}/budget_plan.log",
    priority: SETUP_PRIORITY
    params:
        choice=replan_json(),
        budget=str(SETTINGS["budget"]),
    run:
        replan.write(STUDY, json.loads(params.choice), output.plan, log[0])


# One job per experiment trial (run_experiment). A job takes every core Snakemake
# was given, so no two measurements ever overlap (overlapping runs on a small machine skewed
# timings up to 10x); on a cluster, whole nodes (rules/common.smk, "what each job
# asks for"). The launcher always writes a record, also for a failed,
# crashed or timed-out run, so one bad experiment never stops the study.
# Trials run in rounds (trial 0 of every experiment, then trial 1, ...) by priority,
# the question first within a round (workflow_scripts/plan/order.py);
# after `trials`, only the experiments a comparison still undecided names (one the cap
# may still decide: `futility`; or one the headline states, not yet within the margin)
# run another round, up to `max_trials`
# (round_experiments, rules/common.smk).
# After each, a progress line: trials done of all, elapsed, the time left (progress.py).
# A trial whose noise probe is an outlier below its peers' (results/probes/, the study's
# trials probed the same way; workflow_scripts/trial/peers.py) by at least
# 1 - noise_threshold is run again (noise_retries times at most); these two settings are
# read in the run block rather than passed as params, so changing them reruns no experiment.
rule run_experiment:
    input:
        unpack(experiment_inputs),
    output:
        record=f"{RESULTS}/records/{{experiment}}/trial{{trial}}.json",
    log:
        f"{LOGS}/experiments/{{experiment}}/trial{{trial}}.log",
    priority: trial_priority
    threads: measured_threads
    resources:
        **PLACEMENT,
        cpus_per_task=experiment_resource("cpus_per_task"),
        tasks=experiment_resource("tasks"),
        nodes=experiment_resource("nodes"),
        mem_mb=experiment_resource("mem_mb"),
        runtime=experiment_resource("runtime"),
        slurm_extra=trial_slurm_extra,
        mpi=experiment_resource("mpi"),
        attempt=job_attempt,
    params:
        spec=experiment_spec,
        data_path=experiment_data_path,
        # where it runs is part of what it measured: switching runtimes reruns it
        runtime=RUNTIME,
    run:
        jobs.run(
            "workflow_scripts.trial",
            input,
            output,
            params,
            wildcards,
            log,
            settings={**SETTINGS, "job_attempt": resources.attempt},
        )
        report_progress()


# A trial's far pointer (workflow_scripts/plan/far.py): the first run before it in its
# group that times the same work per step, whose first trial it stops early against.
# Which run that is depends on the others' settings: editing one reruns this pointer
# (its input and param), never the trial (the pointer is the trial's ancient input).
rule far_baseline:
    input:
        unpack(far_baseline_inputs),
    output:
        pointer=far_pointer("{experiment}"),
    log:
        f"{LOGS}/far/{{experiment}}.log",
    priority: SETUP_PRIORITY
    params:
        baseline=far_baseline_id,
    run:
        far.write_pointer(
            output.pointer, wildcards.experiment, params.baseline, input.get("record"), log[0]
        )


# The allreduce microbenchmark, one job per process-group variant (config
# `collectives`): latency and bus bandwidth from 1 KiB to 100 MiB, with the machine to
# itself like a trial. Its settings are a param: editing them reruns it.
rule collectives:
    input:
        unpack(collectives_inputs),
    output:
        result=f"{RESULTS}/collectives/{{variant}}.json",
    log:
        f"{LOGS}/collectives/{{variant}}.log",
    threads: measured_threads
    resources:
        **PLACEMENT,
        cpus_per_task=COLLECTIVES_RESOURCES["cpus_per_task"],
        tasks=COLLECTIVES_RESOURCES["tasks"],
        nodes=COLLECTIVES_RESOURCES["nodes"],
        mem_mb=COLLECTIVES_RESOURCES["mem_mb"],
        runtime=COLLECTIVES_RESOURCES["runtime"],
        slurm_extra=COLLECTIVES_RESOURCES["slurm_extra"],
        mpi=COLLECTIVES_RESOURCES["mpi"],
    params:
        settings=collectives_json(),
        runtime=RUNTIME,
    run:
        jobs.run(
            "workflow_scripts.collectives",
            input,
            output,
            params,
            wildcards,
            log,
            settings=SETTINGS,
        )
