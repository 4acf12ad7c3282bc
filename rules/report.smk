# results/summary.csv (one row per trial) and the self-contained HTML report,
# built from the records and the collectives results only (and, to compare machines,
# the results of other runs named in the config's report: machines:).

from workflow_scripts.summary.machine_results import machine_files


rule report:
    input:
        records=report_records,
        collectives=collectives_results(),
        machines=machine_files(SETTINGS["report"]),
        plan=budget_plan_file,
    output:
        summary=report(
            f"{RESULTS}/summary.csv",
            caption="../workflow_scripts/captions/summary.rst",
            category="Tables",
        ),
        comparisons=report(
            f"{RESULTS}/comparisons.csv",
            caption="../workflow_scripts/captions/comparisons.rst",
            category="Tables",
        ),
        html=f"{RESULTS}/report/index.html",
        ladder=report(
            f"{RESULTS}/report/ladder.svg",
            caption="../workflow_scripts/captions/ladder.rst",
            category="Optimization ladder",
        ),
        batch_size=report(
            f"{RESULTS}/report/batch_size.svg",
            caption="../workflow_scripts/captions/batch_size.rst",
            category="Sweeps",
        ),
        num_workers=report(
            f"{RESULTS}/report/num_workers.svg",
            caption="../workflow_scripts/captions/num_workers.rst",
            category="Sweeps",
        ),
        threads=report(
            f"{RESULTS}/report/threads.svg",
            caption="../workflow_scripts/captions/threads.rst",
            category="Sweeps",
        ),
        backends=report(
            f"{RESULTS}/report/backends.svg",
            caption="../workflow_scripts/captions/backends.rst",
            category="Backends",
        ),
        ceiling=report(
            f"{RESULTS}/report/ceiling.svg",
            caption="../workflow_scripts/captions/ceiling.rst",
            category="Roofline",
        ),
        collectives=report(
            f"{RESULTS}/report/collectives.svg",
            caption="../workflow_scripts/captions/collectives.rst",
            category="Distributed",
        ),
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{LOGS}/benchmarks/report.tsv"
    resources:
        cpus_per_task=REPORT_RESOURCES["cpus_per_task"],
        mem_mb=REPORT_RESOURCES["mem_mb"],
        runtime=REPORT_RESOURCES["runtime"],
    params:
        prices=prices_json(),
        machines=json.dumps(SETTINGS["report"].get("machines") or []),
        name=SETTINGS["report"].get("name"),
        noise_threshold=SETTINGS["noise_threshold"],
        margin=SETTINGS["margin"],
        looks=rounds.looks(SETTINGS),
        look=rounds.looks(SETTINGS),
        plan=budget_plan_json(),
    run:
        jobs.run("workflow_scripts.report", input, output, params, wildcards, log)


# After each round but the last, a provisional report of the rounds so far (ROUNDS,
# rules/common.smk): the answer in minutes, refined round by round. A checkpoint: from
# round trials-1 on, its comparisons.csv decides which experiments run the next round.
checkpoint round_report:
    input:
        records=round_records,
        early=round_early_records,
    output:
        summary=f"{RESULTS}/rounds/{{round}}/summary.csv",
        comparisons=f"{RESULTS}/rounds/{{round}}/comparisons.csv",
        html=f"{RESULTS}/rounds/{{round}}/report/index.html",
    log:
        f"{LOGS}/round_report/{{round}}.log",
    benchmark:
        f"{LOGS}/benchmarks/rounds/{{round}}.tsv"
    priority: round_priority
    resources:
        cpus_per_task=REPORT_RESOURCES["cpus_per_task"],
        mem_mb=REPORT_RESOURCES["mem_mb"],
        runtime=REPORT_RESOURCES["runtime"],
    params:
        prices=prices_json(),
        name=SETTINGS["report"].get("name"),
        noise_threshold=SETTINGS["noise_threshold"],
        margin=SETTINGS["margin"],
        looks=rounds.looks(SETTINGS),
        look=round_look,
        title=round_title,
    run:
        jobs.run("workflow_scripts.report", input, output, params, wildcards, log)


# The question first: the first trials of the headline's group, its second ones, then
# the first of every group's baseline and ladder besides, reported as soon as they have
# run (rules/common.smk, STAGES; workflow_scripts/plan/order.py). A checkpoint: the first
# stage's records say which of the headline's runs stopped far (no second trial).
checkpoint stage_report:
    input:
        records=stage_records,
        early=stage_early_records,
    output:
        summary=f"{RESULTS}/rounds/{{stage}}/summary.csv",
        comparisons=f"{RESULTS}/rounds/{{stage}}/comparisons.csv",
        html=f"{RESULTS}/rounds/{{stage}}/report/index.html",
    log:
        f"{LOGS}/round_report/{{stage}}.log",
    benchmark:
        f"{LOGS}/benchmarks/rounds/{{stage}}.tsv"
    priority: stage_priority
    resources:
        cpus_per_task=REPORT_RESOURCES["cpus_per_task"],
        mem_mb=REPORT_RESOURCES["mem_mb"],
        runtime=REPORT_RESOURCES["runtime"],
    params:
        prices=prices_json(),
        name=SETTINGS["report"].get("name"),
        noise_threshold=SETTINGS["noise_threshold"],
        margin=SETTINGS["margin"],
        looks=rounds.looks(SETTINGS),
        look=1,
        title=stage_title,
    run:
        jobs.run("workflow_scripts.report", input, output, params, wildcards, log)
