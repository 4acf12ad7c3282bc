"""End to end through Snakemake: what the quick preset measured and reported (its one
run in images, tests.runs.QuickStudy, read by several tests), a local study that reruns
only what changed, the trials' order, and Snakemake killed. (Bad configurations stop it
before any job: tests/test_workflow_config.py.)"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ENVS_ROOT
from tests.fixture_records import headline_text, left_out_by_budget
from tests.runs import (
    BUDGET_PART,
    LEFT_BY_PLAN,
    REPO,
    REPORT_FILES,
    REQUIRED_COLUMNS,
    copy_workflow,
    dry_run_jobs,
    experiments_run,
    mtimes,
    pick_runs,
    seed_calibrations,
)
from workflow_scripts import images, study
from workflow_scripts.calibration import clean_calibration
from workflow_scripts.plan import far, order, progress
from workflow_scripts.plan import rounds as plan_rounds
from workflow_scripts.report import uncertainty

pytestmark = pytest.mark.slow

LOCAL_STUDY = """
runtime: local
trials: 1
collectives: {variants: []}
"""
#: of the quick preset, what the local study runs: one experiment in each of two
#: environments (the whole preset runs in images: tests.runs.QuickStudy)
LOCAL_EXPERIMENTS = ("bf16-cl", "ipex-optimize-fp32")
#: the one quick-preset run that must not come out ok
IPEX_COMPILE = "bert-tiny-ipex-compile"


def snakemake(
    workdir: Path, *args: str, config: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """The local study (LOCAL_STUDY, written to local-study.yaml) through snakemake."""
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    cmd += ["--configfile", str(workdir / "local-study.yaml")]
    # no reruns after noise (the retry policy has its own tests; on a busy 2-CPU machine
    # reruns added minutes to the suite)
    cmd += ["--config", "preset=quick", f"envs_root={ENVS_ROOT}", "noise_retries=0", *config]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def test_the_quick_study_runs_every_experiment_and_says_its_progress(quick_study):
    summary = quick_study.summary
    assert set(REQUIRED_COLUMNS) <= set(summary.columns)
    quick = study.load_study({**study.read_config(REPO / "config.yaml"), "preset": "quick"})
    expected = set(quick.ids)
    assert {"baseline", "xla-fp32", "folder", "workers-nw1", "bert-tiny"} <= expected
    assert set(summary["experiment"]) == expected
    assert sorted(experiments_run(quick_study.proc)) == sorted(expected)  # a line per job
    # ... and after each, the study's progress: trials done of all, elapsed, time left
    # (once written, where the question's first answer is)
    done = re.findall(r"\[progress\] (\d+) of (\d+) trials have a record, .+ elapsed in "
                      r"this run(?: \(the question's first answer: [^)]+\))?; (.+)",
                      quick_study.output)  # fmt: skip
    assert sorted(int(d) for d, _, _ in done) == list(range(1, len(expected) + 1)), done
    assert {int(t) for _, t, _ in done} == {len(expected)}
    assert all(rest.startswith("about ") for d, _, rest in done if int(d) < len(expected))
    (last,) = [rest for d, _, rest in done if int(d) == len(expected)]
    # the last line: how much of the trials' time was measuring, that all is done, and
    # what is still to run after the trials
    assert re.fullmatch(r"measuring \d+% of the trials' wall time \(.+ in warm-up and "
                        r"timed steps, \d+% in the timed steps"
                        r"(?:; noise reruns [^)]+)?\), \d+% of this run's; every trial is done"
                        r"(?:; then about .+ for the \d collectives jobs? and the report)?",
                        last), last  # fmt: skip
    assert "this study will take about" in quick_study.proc.stderr
    # every trial ok, but the one that must not be
    failed = summary[(summary["status"] != "ok") & (summary["experiment"] != IPEX_COMPILE)]
    assert failed.empty, failed[["experiment", "status", "error"]].to_string()
    assert set(summary["backend"]) == {"eager", "inductor", "ipex", "xla"}


def test_every_training_step_trained_its_whole_model(quick_study):
    summary = quick_study.summary
    # compile(backend="ipex") on BERT-Tiny loses the gradients of every layer below its
    # last LayerNorm: the gradient check records it as incorrect, without a throughput
    wrong = summary[summary["experiment"] == IPEX_COMPILE].iloc[0]
    assert wrong["status"] == "incorrect", wrong["error"]
    assert wrong["error"].startswith("the step trained 4 of 41 parameter tensors")
    assert wrong["grad_params_trained"] == 4 and wrong["grad_params"] == 41
    assert math.isnan(wrong["samples_per_s"])
    summary = summary[summary["experiment"] != IPEX_COMPILE]
    assert (summary["samples_per_s"] > 0).all()
    # every training trial's step trained its whole model: all its parameter tensors got
    # a gradient, and (but for plain fp32 eager, its own reference) its gradients are
    # within eager's own error of fp64 eager's
    training = summary[summary["mode"] == "train"]
    assert (training["grad_params_trained"] == training["grad_params"]).all()
    assert set(training["grad_check"]) == {"ok", "received"}
    assert summary[summary["mode"] == "inference"]["grad_check"].isna().all()
    for exp in training["experiment"]:
        check = quick_study.records[exp]["gradient_check"]
        assert check["ok"] and check["check_s"] >= 0, (exp, check)
        spec = quick_study.records[exp]["spec"]
        plain_fp32 = (
            spec["precision"] == "fp32" and spec["compile"] == "none"
            and spec["backend"] in ("eager", "ipex") and not spec["ipex_optimize"]
            and spec["launcher"] in ("none", "run_cpu")
        )  # fmt: skip
        assert (check["comparison"] is None) == plain_fp32, (exp, check["comparison"])


def test_what_ran_is_recorded(quick_study):
    summary = quick_study.summary.set_index("experiment").drop(IPEX_COMPILE)
    versions = dict(zip(summary["backend"], summary["torch_version"]))
    assert versions["ipex"].startswith("2.8.") and versions["xla"].startswith("2.9.")
    assert versions["eager"].startswith("2.14.")
    assert summary["ipex_version"].dropna().str.startswith("2.8").any()
    assert summary.loc["runcpu-tcmalloc", "ld_preload"].count("tcmalloc")
    assert summary["compile_cache_fresh"].all()
    assert (summary["steps_timed"] >= 1).all() and summary["time_budget_hit"].notna().all()
    assert set(summary["noisy"]) <= {True, False} and (summary["attempts"] >= 1).all()
    # every layout uses all CPUs, over both process groups
    ddp = summary[summary["group"] == "ddp"]
    assert ((ddp["ranks"] * ddp["threads"]) == len(os.sched_getaffinity(0))).all()
    assert set(ddp["dist_backend"]) == {"gloo", "ccl"} and ddp["ranks"].min() == 1


def test_every_trial_probed_the_machine_and_placed_itself_on_the_ceiling(quick_study):
    summary = quick_study.summary[quick_study.summary["experiment"] != IPEX_COMPILE]
    # every trial ran its noise probe, counted its FLOPs and measured its share of the ceiling
    # (bf16 too for a bf16 run, where it fits the probe's budget: not where it is emulated,
    # ~5 s at 1024; an fp32 or INT8 run probes fp32 alone)
    assert (summary["probe_fp32_gflops"] > 0).all()
    assert ((summary["probe_bf16_gflops"] > 0) | summary["probe_bf16_gflops"].isna()).all()
    assert summary[summary["precision"] != "bf16"]["probe_bf16_gflops"].isna().all()
    assert (summary["flops_per_sample"] > 0).all()
    assert summary["step_time_cv"].notna().all() and summary["probe_after_fp32_gflops"].gt(0).all()
    # ... of the calibrated matmul ceiling: never above 100 % (that is a measurement error);
    # an INT8 run has none (the calibration measures float kernels only)
    int8 = summary["precision"] == "int8"
    assert int8.sum() == 2 and summary[int8]["ceiling_gflops"].isna().all()
    assert summary[int8]["pct_of_peak"].isna().all()
    assert summary[int8]["measurement_error"].isna().all()
    floats = summary[~int8]
    assert (floats["ceiling_gflops"] > 0).all() and floats["ceiling_dtype"].notna().all()
    pct = floats["pct_of_peak"]
    errors = floats["measurement_error"].notna()
    assert (pct.notna() != errors).all() and pct.dropna().between(0, 100).all()
    for r in quick_study.records.values():  # bf16 probed where the run computes in it;
        p = r["probe"]  # a probe that skipped it says why (its cost)
        if r["spec"]["precision"] != "bf16":
            assert "bf16_gflops" not in p and not p["skipped"], p
        else:
            assert p["bf16_gflops"] is not None or "over the" in p["skipped"]["bf16"], p
        # after the steps, fp32 alone (what the noise signals read)
        assert r["probe_after"]["fp32_gflops"] > 0 and "bf16_gflops" not in r["probe_after"]
    for env in ("upstream", "ipex", "xla", "oneccl"):  # a reference probe per environment
        calibration = quick_study.calibrations[env]
        assert calibration["fp32_gflops"] > 0 and calibration["entries"]
        assert [c["threads"] for c in calibration["ceiling"]] == [
            e["threads"] for e in calibration["entries"]
        ]
        # measured in the environment's image
        assert calibration["env_name"] == quick_study.images[images.env_image(env)]["name"]
        # and read whole by the trials it judges: no field of it taken for a wrong type
        assert clean_calibration(calibration)[1] == [], env
    logs = (quick_study.wd / "logs/experiments").glob("*/trial*.log")
    assert not [p for p in logs if "of the wrong type" in p.read_text()]


def test_accuracy_runs_train_to_their_scores(quick_study):
    summary = quick_study.summary
    by_group = summary.set_index("experiment")
    # the accuracy experiments: trained for their epochs, scored on the held-out split
    acc = by_group[by_group["group"] == "accuracy"]
    assert len(acc) >= 3 and (acc["epochs"] == 3).all()
    assert (acc["test_accuracy"] > 0.3).all(), acc["test_accuracy"]  # chance is 0.1
    assert (acc["train_time_s"] > 0).all() and acc["test_loss"].notna().all()
    # the same seed, data order and global batch: gloo and ccl train the same model
    for layout, sub in acc[acc["precision"] == "fp32"].groupby("ranks"):
        assert sub["test_accuracy"].max() - sub["test_accuracy"].min() < 0.03, (layout, sub)
    # a tiny BERT learns the generated keyword-order task (chance is 1/2), to its target
    text = by_group[by_group["group"] == "accuracy-text"]
    assert len(text) == 1 and (text["test_accuracy"] > 0.8).all(), text["test_accuracy"]
    assert (text["time_to_accuracy_s"] > 0).all()
    # the weak-scaling arm: each rank's batch fixed, the rate scaled; scored twice an epoch
    weak = by_group[by_group["group"] == "accuracy-weak"].set_index("ranks")
    assert list(weak["batch_size"]) == [16 * r for r in weak.index]
    assert list(weak["lr"]) == pytest.approx([0.01 * r for r in weak.index])
    assert (weak["batch_scaling"] == "weak").all() and (weak["test_accuracy"] > 0.3).all()
    for exp, r in quick_study.records.items():
        if exp.startswith("acc-weak-"):
            curve = r["metrics"]["accuracy_curve"]
            assert len(curve) == 2 * 3
            assert curve[-1]["test_accuracy"] == r["metrics"]["test_accuracy"]
            reached = [p["train_time_s"] for p in curve if p["test_accuracy"] >= 0.8]
            assert r["metrics"]["time_to_accuracy_s"] == (reached[0] if reached else None)
    # served: the digits CNN trained once (serve-digits-fp32), served in fp32 eager and in
    # INT8 through each stack from the same weights, each scored on the held-out split
    serve = by_group[by_group["group"] == "inference-accuracy"]
    assert len(serve) == 3 and (serve["reference_accuracy"] > 0.3).all()
    assert serve["reference_accuracy"].max() - serve["reference_accuracy"].min() < 0.01
    assert (serve["accuracy_change"].abs() <= 0.03).all(), serve["accuracy_change"]
    assert list(serve.sort_values("precision")["int8_share"]) == [0.0, 1.0, 1.0]
    for exp in ("serve-digits-int8-inductor", "serve-digits-int8-ipex"):
        assert quick_study.records[exp]["checks"]["serving"]["pretrain"]["weights"] == (
            "loaded from serve-digits-fp32 (trial 0)"
        )
    assert (quick_study.wd / "results/records/serve-digits-fp32/trial0.weights.pt").is_file()
    assert summary["test_accuracy"].notna().sum() == (len(acc) + len(text) + len(weak) + len(serve))


def test_accelerates_mpirun_ranks_train_one_model_over_gloo_and_ccl(quick_study):
    """Accelerate's mpirun ranks over Gloo and over the study's ccl: one DDP model, the
    same losses; the launch command and config in each record. And the allreduce
    microbenchmark over both."""
    losses = {}
    for pg in ("gloo", "ccl"):
        record = quick_study.records[f"bert-tiny-accelerate-{pg}"]
        checks = record["checks"]
        assert checks["world_size"] == 2 and checks["dist_backend"] == pg
        assert checks["accelerate"]["distributed_type"] == "MULTI_CPU"
        assert checks["accelerate"]["command"].startswith("accelerate launch --config_file")
        losses[pg] = record["losses"]
    # step by step the same (the timed steps may end at different counts: step_precision
    # stops each trial once its own step times say enough, a CI run's 4 and 5 steps)
    n = min(len(losses["gloo"]), len(losses["ccl"]))
    assert n >= 3, losses
    assert losses["gloo"][:n] == pytest.approx(losses["ccl"][:n], rel=1e-3)
    for variant in ("gloo", "ccl-shm"):  # the allreduce microbenchmark, a job each
        result = quick_study.collectives[variant]
        assert result["status"] == "ok", result.get("error")
        assert {r["bytes"] for r in result["results"]} == {1024, 1024 * 1024}


def test_the_report_shows_every_section(quick_study):
    for needle in (
        "ladder", "samples/s", "<svg", "bf16-cl", "xla-fp32", "per million samples",
        "Ladders per workload family", "Text (tokens)", "tokens/s", "Inference",
        "Distributed training", "ddp-ccl-r1-", "ccl shm", "Allreduce microbenchmark",
        "Accuracy: time to train", "test accuracy (%)", "Gloo, several ranks",
        "time to target (s)", "(weak: 16/rank)", "% of the measured ceiling",
        "Measurement noise", "ceiling", "time estimate vs measured",
    ):  # fmt: skip
        assert needle in quick_study.html, needle
    assert not re.search(r"(src|href)=[\"']https?://", quick_study.html)  # self-contained


def test_the_quick_study_says_how_sure_each_comparison_is(quick_study):
    """comparisons.csv has its columns and every kind of comparison; with one trial per
    experiment there is no spread, so nothing is decided and nothing is crowned."""
    table = quick_study.comparisons
    assert list(table.columns) == uncertainty.COLUMNS
    assert {"baseline", "step", "reference", "group", "backend", "compile"} <= set(table["kind"])
    steps = table[table["kind"] == "step"].set_index("experiment")
    assert steps.loc["bf16-cl", "baseline"] == "bf16"
    assert steps.loc["bf16-cl", "change"] == "'+ channels_last"  # (the formula guard)
    assert (table["n_baseline"] == 1).all() and (table["n_experiment"] == 1).all()
    assert set(table["verdict"]) == {"undecided"} and table["ci_low"].isna().all()
    best = re.search(r'<b id="hl-best">([^<]*)</b>', quick_study.html).group(1)
    if best != "baseline":  # (on a machine where every rung is slower, the baseline)
        assert "so no configuration is known to beat the baseline yet" in quick_study.html
    # the pairs the headline states are marked (the adaptive rounds measure them until
    # their interval is within the margin): its fastest configuration against the
    # baseline, and each family's fastest training run against its fp32 eager run
    stated = table[table["headline"]]
    pairs = set(zip(stated["baseline"], stated["experiment"], strict=True))
    assert best == "baseline" or ("baseline", best) in pairs
    for line in re.findall(r"the fastest training run is <b>([^<]+)</b>[^<]*<b>[^<]*</b> its "
                           r"fp32 eager run \(([^;]+);", quick_study.html):  # fmt: skip
        assert (line[1], line[0]) in pairs or line[0] == line[1], line
    assert not table[~table["headline"]].empty
    assert '<section id="comparisons">' in quick_study.html


def test_each_trial_is_estimated_and_no_two_measurements_overlap(quick_study):
    # each trial's estimate, made before it ran, beside its wall time; the report compares
    # them. Tolerance: the whole quick study within a factor of 2 of its estimate.
    summary = quick_study.summary
    assert (summary["estimate_s"] > 0).all() and (summary["trial_wall_s"] > 0).all()
    ratio = summary["trial_wall_s"].sum() / summary["estimate_s"].sum()
    assert 0.5 <= ratio <= 2.0, summary[["experiment", "estimate_s", "trial_wall_s"]].to_string()
    spans = sorted(
        (r["provenance"]["launched_at"], r["provenance"]["ended_at"])
        for r in quick_study.records.values()
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, spans


def test_the_question_runs_first_and_is_answered_first(quick_study):
    """Within the round, the headline's group ran before the rest, and so did every
    group's baseline and ladder; each stage's provisional report was written before any
    trial after it started."""
    loaded = study.load_study(study.read_config(quick_study.wd / "config.yaml", ["preset=quick"]))
    stages = order.stages(loaded.experiments)
    assert list(stages) == ["first", "families"]
    started = {
        e: datetime.fromisoformat(r["provenance"]["launched_at"]).timestamp()
        for e, r in quick_study.records.items()
    }
    for name, inside in stages.items():
        rest = [t for e, t in started.items() if e not in inside]
        assert max(started[e] for e in inside) <= min(rest), name
        summary, written = quick_study.stages[name]
        assert sorted(summary["experiment"]) == sorted(inside)
        assert max(started[e] for e in inside) <= written <= min(rest) + 1, name
    assert "the question's first answer: results/rounds/first/report/index.html" in (
        quick_study.output
    )
    # each report's wall time (Snakemake's benchmark), by which the time left scales the
    # reports still to write
    logs = quick_study.wd / "logs"
    for name in stages:
        assert progress.benchmark_s(logs / progress.ROUND_BENCHMARKS / f"{name}.tsv") > 0
    assert progress.benchmark_s(logs / progress.REPORT_BENCHMARK) > 0


def test_a_workloads_flop_count_is_counted_once(quick_study):
    """A first trial takes its FLOP count from the first trial of the same workload that
    counted it (trial/carry.py): the same count, no counting time."""
    shared = {e: r for e, r in quick_study.records.items() if (r.get("carried") or {}).get(
        "from", "").endswith("(the same workload)")}  # fmt: skip
    assert len(shared) >= 5, sorted(quick_study.records)
    for experiment, record in shared.items():
        source = record["carried"]["from"].split(" trial 0")[0]
        counted = quick_study.records[source]
        own = {**(record.get("unchecked_metrics") or {}), **record["metrics"]}  # (incorrect)
        assert counted["metrics"]["flops_count_s"] > 0 and "carried" not in counted
        assert own["flops_count_s"] == 0.0
        assert record["carried"]["flops_per_sample"] == counted["metrics"]["flops_per_sample"]
        assert record["spec"]["model"] == counted["spec"]["model"], experiment
        # the gradient check of a first trial is its own, in full
        if record["gradient_check"]:
            assert "comparison_from" not in record["gradient_check"], experiment


#: BUDGET_PART, run locally without the collectives
TIGHT_STUDY = {"runtime": "local", "collectives": {"variants": []}, **BUDGET_PART}


@pytest.mark.torch
def test_what_a_budget_leaves_out_is_in_the_report(upstream_calibration, tmp_path):
    """A budget below the minimum trials, run for real: the plan's left-out experiments
    are named in the finished report (headline and list, by group), beside the trials
    the clock left out; without the budget they are planned again."""
    wd = copy_workflow(tmp_path / "wf")
    seed_calibrations(wd, [upstream_calibration])
    (wd / "local-study.yaml").write_text(yaml.safe_dump(TIGHT_STUDY, sort_keys=False))
    run = snakemake(wd, config=("budget=1s",))
    said = [x for x in run.stderr.splitlines() if x.startswith("[budget]")]
    assert said and said[0].endswith("leaves out 3: other (3)"), said
    left = sorted(p.parent.name for p in (wd / "results/records").glob("*/trial*.json"))
    assert sorted(set(left)) == ["base", "bf16", "o-base"], left
    page = (wd / "results/report/index.html").read_text()
    text = headline_text(page)
    assert (
        "The budget (1s) left out 3 of the study's 6 experiments before any trial ran, to fit "
        "it: other (3)"
    ) in text, text
    items = left_out_by_budget(page)
    assert len(items) == 1 and items[0].startswith("other: "), items
    assert set(items[0].removeprefix("other: ").split(", ")) == LEFT_BY_PLAN, items
    # (and the clock's: every trial that the question would have run, the report's time
    # kept after them)
    assert "left out by the budget's clock" in page
    records = [json.loads(p.read_text()) for p in (wd / "results/records").glob("*/trial*.json")]
    by_clock = [r["error"]["message"] for r in records if r["status"] == "left_out"]
    assert by_clock and all("kept for what the study runs after its trials" in m
                            for m in by_clock), by_clock  # fmt: skip
    again = snakemake(wd, "-n")
    planned = set(re.findall(r"experiment=([\w-]+), trial=\d", again.stdout))
    assert planned >= LEFT_BY_PLAN, sorted(planned)


#: a budget the estimate before any calibration (a trial's start and imports taken as
#: 11 s) fits only the question of BUDGET_PART into, where the calibrated one fits more
REPLANNED_BUDGET = "120s"


@pytest.mark.torch
def test_a_budget_is_planned_again_from_the_calibrations(upstream_env, tmp_path):
    """Before any calibration the plan keeps the question and reserves the rest of the
    order; after the calibrations and the question's first trials the checkpoint plans
    again from them and the time left: the reserve it keeps runs after every trial of
    the question (each one's trials together), the progress lines count what is planned,
    and the report states what it left out."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "local-study.yaml").write_text(yaml.safe_dump(TIGHT_STUDY, sort_keys=False))
    run = snakemake(wd, config=(f"budget={REPLANNED_BUDGET}",))
    said = [x for x in run.stderr.splitlines() if x.startswith("[budget]")]
    assert "runs the first 3 of its 6 experiments" in said[0], said
    assert any("has no calibration of this machine yet" in x for x in said), said
    plan = json.loads((wd / "results/budget/plan.json").read_text())
    replanned = plan["replanned"]
    assert replanned["before"] == 3 and plan["planned"] == 6, plan
    # the question's first trials, and the headline's second ones (they run right after
    # its first: far_stop null, none stops far)
    assert replanned["measured_trials"] == 5, plan
    out = run.stdout + run.stderr
    assert "[budget] planned again from the calibrations" in out
    # what ran: the question's trials, then the reserve it keeps, in that order
    question = ["base", "bf16", "o-base"]
    kept = question + replanned["admitted"]
    paths = sorted((wd / "results/records").glob("*/trial*.json"))
    assert sorted(p.parent.name for p in paths) == sorted(2 * kept), (paths, plan)
    gone = {e["id"] for e in plan["left_out"]}
    assert gone == {"o-bf16", "o-batch-bs4", "o-batch-bs16"} - set(kept), plan
    assert replanned["kept"] == len(kept)
    made = (wd / "results/budget/plan.json").stat().st_mtime
    firsts = [wd / f"results/records/{e}/trial0.json" for e in question]
    assert max(p.stat().st_mtime for p in firsts) <= made
    started = {
        (p.parent.name, p.stem): datetime.fromisoformat(
            json.loads(p.read_text())["provenance"]["started_at"]
        ).timestamp()
        for p in paths
    }
    for e in replanned["admitted"]:  # after the plan and every trial of the question
        assert started[(e, "trial0")] + 1 >= made  # (whole seconds)
        assert started[(e, "trial0")] + 1 >= max(started[(q, "trial1")] for q in question)
    # the reserve fills the room in the study's order while it fits, none after the first
    # that does not (by the scaled estimates the plan states; each rounded to 0.1 s)
    if replanned["admitted"]:
        assert replanned["admitted_s"] <= replanned["room_s"] + 0.1, plan
    if replanned["first_left_out_s"] is not None:
        fill = replanned["admitted_s"] + replanned["first_left_out_s"]
        assert fill > replanned["room_s"] - 0.2, plan
    # the question's provisional reports count what the plan had then: not its reserve
    for stage in ("first", "headline", "families"):
        shown = set(pd.read_csv(wd / f"results/rounds/{stage}/summary.csv")["experiment"])
        page = (wd / f"results/rounds/{stage}/report/index.html").read_text()
        assert f"({len(shown)} of {len(question)} experiments; more once" in page, stage
    counts = {int(n) for n in re.findall(r"\[progress\] \d+ of (\d+) trials", out)}
    assert counts <= {2 * len(question), 2 * len(kept)} and 2 * len(kept) in counts, counts
    page = (wd / "results/report/index.html").read_text()
    if gone:
        items = left_out_by_budget(page)
        assert len(items) == 1 and set(items[0].removeprefix("other: ").split(", ")) == gone
    else:
        assert 'id="left-out-by-budget"' not in page
        assert "The budget (" not in headline_text(page), headline_text(page)


@pytest.mark.torch
def test_a_local_study_reruns_only_what_changed(upstream_calibration, ipex_env, tmp_path):
    """The local runtime end to end (ipex's environment through its rule, found built by
    its lock's hash, and calibrated; upstream's calibrated once for the session:
    ``runs.seed_calibrations``), and Snakemake reruns exactly what a change touches."""
    wd = copy_workflow(tmp_path / "wf")
    seed_calibrations(wd, [upstream_calibration])
    quick = study.read_config(wd / "config.yaml")["presets"]["quick"]
    part = pick_runs(quick, LOCAL_EXPERIMENTS)
    local_study = wd / "local-study.yaml"
    local_study.write_text(LOCAL_STUDY + yaml.safe_dump({"groups": part}, sort_keys=False))

    # 1. the study, locally
    first = snakemake(wd)
    assert sorted(experiments_run(first)) == sorted(LOCAL_EXPERIMENTS)
    summary = pd.read_csv(wd / "results/summary.csv")
    assert set(REQUIRED_COLUMNS) <= set(summary.columns)
    assert (summary["status"] == "ok").all(), summary[["experiment", "error"]].to_string()
    assert (summary["runtime"] == "local").all()
    kept = wd / "results/calibration/upstream.json"  # (the session's, not made again)
    assert kept.read_bytes() == upstream_calibration.calibration.read_bytes()

    # 2. nothing changed: nothing runs
    before = mtimes(wd)
    again = snakemake(wd)
    assert experiments_run(again) == []
    assert "Nothing to be done" in again.stdout + again.stderr
    assert mtimes(wd) == before

    # (a new reference probe reruns nothing: test_calibration_is_an_ancient_input)

    # 3. one experiment's settings change: exactly it and the report rerun
    edited = copy.deepcopy(part)
    for group in edited.values():
        group["runs"] = [{**r, "batch_size": 4} if r.get("id") == "bf16-cl" else r
                         for r in group["runs"]]  # fmt: skip
    local_study.write_text(LOCAL_STUDY + yaml.safe_dump({"groups": edited}, sort_keys=False))
    # (first with a budget whose clock has run out before the trial starts: it is left
    # out, not failed, the study still ends with its report; the next run runs it)
    clocked = snakemake(wd, config=("budget=1s",))
    assert experiments_run(clocked) == ["bf16-cl"]
    left = json.loads((wd / "results/records/bf16-cl/trial0.json").read_text())
    assert left["status"] == "left_out" and left["error"]["type"] == "OverBudget", left
    assert "the budget's clock ran out" in left["error"]["message"], left["error"]
    said = (wd / "logs/experiments/bf16-cl/trial0.log").read_text()
    assert f"[launch] {left['error']['message']}" in said  # (and its log says why)
    page = (wd / "results/report/index.html").read_text()
    assert "left out by the budget's clock" in page and 'id="left-out"' in page
    assert "1 left out by the budget's clock" in clocked.stdout + clocked.stderr
    assert snakemake(wd, "-n").stderr.count("trials that the budget's clock left out") == 0
    third = snakemake(wd)
    assert "1 trials that the budget's clock left out last time run now" in third.stderr
    assert experiments_run(third) == ["bf16-cl"]
    after = mtimes(wd)
    changed = {k for k in before if before[k] != after[k]}
    report = {f"results/{name}" for name in REPORT_FILES}
    assert changed == {"results/records/bf16-cl/trial0.json", *report}
    row = pd.read_csv(wd / "results/summary.csv").set_index("experiment").loc["bf16-cl"]
    assert row["batch_size"] == 4

    # 4. one environment's requirements change: it is rebuilt and only its experiments rerun
    old_ipex = (wd / "results/envs/ipex.json").read_text()
    with open(wd / "envs/ipex.txt", "a") as fh:
        fh.write("# edited by the rerun test\n")
    try:
        fourth = snakemake(wd)
        assert experiments_run(fourth) == ["ipex-optimize-fp32"]
        new_ipex = (wd / "results/envs/ipex.json").read_text()
        assert new_ipex != old_ipex
        final = mtimes(wd)
        changed = {k for k in after if after[k] != final[k]}
        assert changed == {
            "results/envs/ipex.json", "results/records/ipex-optimize-fp32/trial0.json", *report,
        }  # fmt: skip
    finally:  # the edited set's environment is of no further use: do not keep gigabytes
        prefix = json.loads((wd / "results/envs/ipex.json").read_text())["prefix"]
        if prefix != json.loads(old_ipex)["prefix"]:
            shutil.rmtree(prefix, ignore_errors=True)

    # 5. Snakemake's own report, with the plots and their captions
    snakemake(wd, "--report", "report.html")
    report = (wd / "report.html").read_text(errors="replace")
    assert "ladder.svg" in report and "speedup" in report.lower()


def test_trials_run_in_rounds_by_priority(tmp_path):
    """Trial k of every experiment before trial k+1 of any, the question first within a
    round: priorities, not dependencies (Snakemake's dry run does not select jobs, so the
    order itself shows only in a run)."""
    wd = copy_workflow(tmp_path / "wf")
    # (no adaptive rounds; far_stop null: with it, trials after the first wait for the
    # first round, whose far runs stop there)
    jobs = dry_run_jobs(wd, "trials=3", "max_trials=null", "defaults={far_stop: null}")
    runs = [j for j in jobs if j["rule"] == "run_experiment"]
    loaded = study.load_study(study.read_config(wd / "config.yaml", ["defaults={far_stop: null}"]))
    specs = loaded.by_id
    # every experiment 3 trials, a seed sweep's seeds one each (3 seeds: 3 trials)
    planned = plan_rounds.first_trials(loaded.experiments, 3)
    assert len(runs) == sum(planned.values()) and set(planned.values()) == {1, 3}
    tier = order.tiers(loaded.experiments)
    priority = {}
    for job in runs:
        trial = int(job["wildcards"].rsplit("trial=", 1)[1])
        experiment = job["wildcards"].split("experiment=", 1)[1].split(",")[0]
        priority[(experiment, trial)] = job["priority"]
        # no trial waits for another experiment's files, but a served model for the first
        # trial of the run that trains its weights; a later trial for its own first
        # (what it carries from it: workflow_scripts/trial/carry.py); and a trial that
        # may stop early far from its baseline for its own far pointer (plan/far.py)
        source = specs[experiment]["weights_from"]
        records_in = re.findall(r"results/records/[^ ,]+", job["input"])
        expected = [f"results/records/{source}/trial0.json"] if source else []
        expected += [f"results/records/{experiment}/trial0.json"] if trial else []
        assert sorted(records_in) == sorted(expected)
        pointers = re.findall(r"results/far/[^ ,]+", job["input"])
        pointed = far.has_pointer(specs[experiment], loaded.experiments)
        assert pointers == ([f"results/far/{experiment}.json"] if pointed else [])
        # the reference probe of the trial's own environment
        env = re.search(r"results/envs/(\w+)\.json", job["input"]).group(1)
        assert f"results/calibration/{env}.json" in job["input"]
    # every trial k above every trial k+1, but the headline's second trials, which come
    # right after its first ones; within a round, by tier (plan/order.py): the
    # headline's group, each other group's first run, their ladders, the rest
    early = {(e, 1) for e in specs if tier[e] == order.HEADLINE}
    round_of = {job: 0 if job in early else job[1] for job in priority}
    by_round = [[p for job, p in priority.items() if round_of[job] == t] for t in range(3)]
    assert all(min(by_round[t]) > max(by_round[t + 1]) for t in range(2))
    for t in range(3):
        of = [(tier[job[0]], -p) for job, p in priority.items() if round_of[job] == t]
        assert [x for x, _ in sorted(of, key=lambda x: x[1])] == sorted(x for x, _ in of)
    head = [p for (e, k), p in priority.items() if k == 0 and tier[e] == order.HEADLINE]
    rest = [p for (e, k), p in priority.items() if k == 0 and tier[e] != order.HEADLINE]
    assert min(head) > max(priority[job] for job in early) > max(rest)
    assert len(set(priority.values())) == len(priority)
    question = [e for e in specs if tier[e] <= order.BASELINES]
    assert order.question(loaded.experiments) == question
    assert question[0] == "baseline" and "bert-base" in question and "bf16" in question
    # the first round's stages: the headline's group, its second trials, then every
    # group's baseline and ladder besides, each reported as soon as its trials have run,
    # before the rest
    stages = {j["wildcards"]: j for j in jobs if j["rule"] == "stage_report"}
    assert sorted(stages) == ["stage=families", "stage=first", "stage=headline"]
    for name, top, trials in (("first", order.HEADLINE, 1), ("headline", order.HEADLINE, 2),
                              ("families", order.LADDERS, 2)):  # fmt: skip
        job = stages[f"stage={name}"]
        inside = [(e, 0) for e in specs if tier[e] <= top]
        inside += sorted(early) if trials == 2 else []
        records = re.findall(r"results/records/([^ ,/]+)/trial(\d+)\.json", job["input"])
        assert sorted((e, int(k)) for e, k in records) == sorted(inside)
        outside = [p for job_, p in priority.items() if round_of[job_] == 0 and job_ not in inside]
        assert max(outside) < job["priority"] <= min(priority[job_] for job_ in inside)
    assert len(re.findall("records/", stages["stage=first"]["input"])) == 12  # the ladder
    assert len(re.findall("records/", stages["stage=headline"]["input"])) == 24
    # after each round but the last, a provisional report of the rounds so far, as soon
    # as the round ends (its priority: above every trial of the next round)
    rounds = sorted((j for j in jobs if j["rule"] == "round_report"), key=lambda j: j["wildcards"])
    assert [j["wildcards"] for j in rounds] == ["round=0", "round=1"]
    for k, job in enumerate(rounds):
        assert max(by_round[k]) < job["priority"] < min(by_round[k - 1] if k else [math.inf])
        assert job["priority"] > max(by_round[k + 1])
        found = re.findall(r"results/records/([^ ,/]+)/trial(\d+)\.json", job["input"])
        expected = {(e, t) for e in specs for t in range(min(k + 1, planned[e]))}
        # round 0's report holds every trial run by then: the headline's second ones too
        expected |= early if k == 0 else set()
        assert sorted((e, int(t)) for e, t in found) == sorted(expected)
    setup_rules = {"build_env", "image_folder", "digits", "calibrate"}
    setup = [j for j in jobs if j["rule"] in setup_rules]
    assert {j["rule"] for j in setup} == setup_rules
    assert min(j["priority"] for j in setup) > max(priority.values())


SAT_OUT_STUDY = """
runtime: local
trials: 2
max_trials: 4
collectives: {variants: []}
defaults: {batch_size: 8, warmup_steps: 1, steps: 5, far_stop: null, step_precision: null}
groups:
  g:
    runs:
      - {id: a, threads: 1}
      - {id: b, threads: 1, batch_size: 4}
      - {id: c, threads: 1, batch_size: 2}
"""


def test_an_experiment_that_sat_out_a_round_comes_back_when_a_report_names_it(tmp_path):
    """Round 2 runs a and b (a against b undecided after round 1; a against c decided);
    a's third trial moves a against c, undecided after round 2: round 3 runs a and c,
    c's trials 0, 1 and 3 (a run can become undecided, or the headline's pick, after it
    stopped), and b, decided, runs no fourth. The round reports are the checkpoints'
    files, written here in the order a run writes them; Snakemake plans the rest."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "study.yaml").write_text(SAT_OUT_STUDY)
    head = "baseline,experiment,verdict,headline,ratio,ci_low,ci_high,margin\n"

    def write(path: str, text: str = "{}") -> None:
        (wd / path).parent.mkdir(parents=True, exist_ok=True)
        (wd / path).write_text(text)
        time.sleep(0.02)  # each newer than the one before, as a run writes them

    def round_report(k: int, undecided: list[str], decided: list[str]) -> None:
        rows = [f"a,{e},undecided,False,1.1,0.9,1.3,0.03\n" for e in undecided]
        rows += [f"a,{e},faster,False,2.0,1.9,2.1,0.03\n" for e in decided]
        write(f"results/rounds/{k}/summary.csv", "experiment\n")
        write(f"results/rounds/{k}/comparisons.csv", head + "".join(rows))
        write(f"results/rounds/{k}/report/index.html", "<html></html>")

    write("results/envs/upstream.json")
    write("results/calibration/upstream.json")
    for k in (0, 1):
        for e in "abc":
            write(f"results/records/{e}/trial{k}.json")
    round_report(0, ["b", "c"], [])
    round_report(1, ["b"], ["c"])
    for e in "ab":
        write(f"results/records/{e}/trial2.json")
    round_report(2, ["c"], ["b"])
    jobs = dry_run_jobs(wd, "--configfile", "study.yaml")
    runs = sorted(j["wildcards"] for j in jobs if j["rule"] == "run_experiment")
    assert runs == ["experiment=a, trial=3", "experiment=c, trial=3"], jobs
    (report,) = [j for j in jobs if j["rule"] == "report"]
    records = re.findall(r"results/records/(\w+)/trial(\d+)\.json", report["input"])
    trials = {e: sorted(int(k) for x, k in records if x == e) for e in "abc"}
    assert trials == {"a": [0, 1, 2, 3], "b": [0, 1, 2], "c": [0, 1, 3]}, trials


def test_a_trial_waits_for_its_far_baseline_through_a_pointer_of_its_own(tmp_path):
    """The default study: each trial that may stop early far from its baseline reads its
    own pointer (results/far/<id>.json), which waits for the first trial of the first
    earlier run of its group doing the same work (bf16 GPT-2 for fp32 GPT-2's, a served
    BERT-base at batch 16 for eager BERT-base's at batch 16)."""
    wd = copy_workflow(tmp_path / "wf")
    jobs = dry_run_jobs(wd)
    loaded = study.load_study(study.read_config(wd / "config.yaml"))
    specs = loaded.by_id
    records = r"results/records/[^ ,]+"
    pointers = {
        j["wildcards"].split("experiment=", 1)[1]: re.findall(records, j.get("input", ""))
        for j in jobs
        if j["rule"] == "far_baseline"
    }
    assert pointers and set(pointers) == {
        e for e, spec in specs.items() if far.has_pointer(spec, loaded.experiments)
    }
    for experiment, records in pointers.items():
        baseline = far.baseline_of(specs[experiment], loaded.experiments)
        assert records == ([f"results/records/{baseline}/trial0.json"] if baseline else [])
        if baseline:
            assert far.same_work(specs[experiment], specs[baseline])
    assert pointers["gpt2-bf16"] == ["results/records/gpt2/trial0.json"]
    served = pointers["frozen-bert-base-bs16-bf16"]
    assert served == ["results/records/infer-bert-base-bs16-fp32/trial0.json"]
    for job in jobs:
        if job["rule"] == "run_experiment" and job["wildcards"].endswith("trial=0"):
            experiment = job["wildcards"].split("experiment=", 1)[1].split(",")[0]
            expected = [f"results/far/{experiment}.json"] if experiment in pointers else []
            assert re.findall(r"results/far/[^ ,]+", job["input"]) == expected


def test_calibration_is_an_ancient_input(tmp_path):
    """A newer reference probe reruns no experiment (outputs faked with their mtimes)."""
    wd = copy_workflow(tmp_path / "wf")
    ids = [j["wildcards"] for j in dry_run_jobs(wd, "preset=quick") if j["wildcards"]]
    outputs = [wd / f"results/envs/{e}.json" for e in ("ipex", "upstream", "xla")]
    outputs += [wd / "resources/image_folder", wd / "resources/digits"]
    outputs += [wd / f"results/calibration/{e}.json" for e in ("ipex", "upstream", "xla")]
    for wildcards in ids:
        if wildcards.startswith("experiment="):
            exp = wildcards.split(",")[0].split("=")[1]
            outputs.append(wd / f"results/records/{exp}/trial0.json")
    outputs += [wd / "results/summary.csv", wd / "results/comparisons.csv"]
    outputs += [wd / f"results/report/{n}" for n in ("index.html", "ladder.svg", "batch_size.svg")]
    outputs += [wd / f"results/report/{n}.svg" for n in ("num_workers", "threads", "backends")]
    outputs += [wd / "results/report/ceiling.svg"]
    outputs += [wd / f"results/rounds/{stage}/{n}" for stage in ("first", "families")
                for n in ("summary.csv", "comparisons.csv", "report/index.html")]  # fmt: skip
    now = time.time()
    for i, path in enumerate(outputs):  # each newer than what it is made from
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name in ("image_folder", "digits"):
            path.mkdir()
        else:
            path.write_text("{}")
        os.utime(path, (now + 10 + i, now + 10 + i))
    assert dry_run_jobs(wd, "preset=quick") == []
    probe = wd / "results/calibration/upstream.json"
    os.utime(probe, (now + 1000, now + 1000))  # a new calibration, newer than every record
    assert dry_run_jobs(wd, "preset=quick") == []


#: a fast trial and a slow one, which the tests stop (the study refuses a trial whose
#: steps would outlast 4x its timeout_s with every stop off: the slow one's 20,000 steps
#: take a minute or more, well within it)
KILL_CONFIG = """
runtime: local
trials: 1
collectives: {variants: []}
defaults: {model: cnn, image_size: 32, batch_size: 8, warmup_steps: 1, probe_size: 0,
           time_budget_s: null, step_precision: null, far_stop: null, timeout_s: 900}
groups:
  kill:
    runs:
      - {id: fast, steps: 2}
      - {id: slow, steps: 20000}
"""


def running(needle: str) -> list[int]:
    """The processes whose command line holds ``needle``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "cmdline").read_text():
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.torch
@pytest.mark.parametrize(
    "sig,profile",
    [(signal.SIGKILL, "default"), (signal.SIGINT, "default"), (signal.SIGKILL, "none")],
)
def test_a_killed_snakemake_leaves_no_trial_running_and_the_rerun_repeats_it(
    sig, profile, tmp_path
):
    """Snakemake killed (SIGKILL) or interrupted (Ctrl-C: SIGINT) in the middle of a
    trial: the trial's processes go with it, the trial leaves no record, the finished
    trial stays, and the rerun plans exactly the unfinished one. (SIGTERM asks
    Snakemake to finish its running jobs first: the trial completes and is kept.) With
    the workflow's default profile the job runs in a thread of Snakemake's process;
    without it (``--workflow-profile none``), in a Snakemake process spawned for it."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "config.yaml").write_text(KILL_CONFIG)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--config", f"envs_root={ENVS_ROOT}"]
    cmd += [] if profile == "default" else ["--workflow-profile", profile]
    first = ["--prioritize", "results/records/fast/trial0.json"]  # fast, then slow
    proc = subprocess.Popen([*cmd, *first], cwd=wd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    fast, slow = wd / "results/records/fast/trial0.json", wd / "results/records/slow/trial0.json"
    slow_log = wd / "logs/experiments/slow/trial0.log"
    try:
        deadline = time.monotonic() + 900
        while not (fast.exists() and slow_log.exists() and "step 5/" in slow_log.read_text()):
            assert proc.poll() is None, "snakemake ended early"
            assert time.monotonic() < deadline, "the slow trial never got going"
            time.sleep(0.5)
        needle = str(wd / "results/records/slow")
        assert running(needle), "no trial process to kill"
        if sig == signal.SIGINT:  # Ctrl-C: the terminal signals Snakemake and its jobs
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)  # Snakemake alone, its jobs left without it
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while running(needle) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running(needle), "the trial outlived Snakemake"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not slow.exists() and not list(slow.parent.glob("*.json"))
    assert json.loads(fast.read_text())["status"] == "ok"
    subprocess.run([*cmd, "--unlock"], cwd=wd, capture_output=True, timeout=300, check=True)
    jobs = dry_run_jobs(wd, f"envs_root={ENVS_ROOT}")
    planned = [j["wildcards"] for j in jobs if j["rule"] == "run_experiment"]
    assert planned == ["experiment=slow, trial=0"]


@pytest.mark.torch
def test_a_study_outlives_the_shell_that_started_it(tmp_path):
    """``snakemake ... &`` from a shell that then ends (a terminal closed under nohup):
    the study goes on and its trial ends with its record. The trial watches Snakemake,
    not whoever started it (the job runs in a thread of Snakemake's own process)."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "config.yaml").write_text(KILL_CONFIG.replace("steps: 20000", "steps: 400"))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--config", f"envs_root={ENVS_ROOT}"]
    slow_log = wd / "logs/experiments/slow/trial0.log"
    # the shell starts the study in the background, waits until the slow trial is timing
    # its steps, and ends
    script = (
        f"{shlex.join(cmd)} > run.log 2>&1 & echo $! > snakemake.pid\n"
        f"until grep -q 'step 5/' {shlex.quote(str(slow_log))} 2>/dev/null; do sleep 0.2; done"
    )
    subprocess.run(["bash", "-c", script], cwd=wd, timeout=600, check=True)
    pid = int((wd / "snakemake.pid").read_text())
    deadline = time.monotonic() + 600
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    path = wd / "results/records/slow/trial0.json"
    assert path.exists(), (wd / "run.log").read_text()[-3000:]  # no record: it was stopped
    record = json.loads(path.read_text())
    assert record["status"] == "ok", (record.get("error"), (wd / "run.log").read_text()[-3000:])
    assert len(record["step_times_s"]) == 400  # every step it asked for
