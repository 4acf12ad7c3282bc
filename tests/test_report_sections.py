"""The report's sections (workflow_scripts/report/sections.py, and headline.py,
compare.py, quality.py, machines.py and timing.py behind them) answer the question
(issue 12): the headline's numbers, like-for-like comparisons, the cost arithmetic,
unrun sweeps, budget-cut runs, noisy and failed trials, diverging losses and two
machines side by side, from fixture records (no torch, no browser; the rendered page:
test_report_browser.py; a study of each single experiment: test_report_sections_slow.py)."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pandas as pd
import pytest
import scipy.stats

from tests.fixture_records import (
    PRICE_A,
    PRICE_B,
    build_page,
    html_tables,
    machine_a,
    machine_b,
    make,
    section,
    trial,
    write,
)
from workflow_scripts import report
from workflow_scripts.report import compare, formatting, machines, quality, stats
from workflow_scripts.summary import records as rec


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    return build_page(tmp_path_factory.mktemp("decisions"))


def headline_value(text, key):
    m = re.search(rf'<b id="hl-{key}">([^<]*)</b>', text)
    return m.group(1) if m else None


def test_the_headline_comes_first_with_its_numbers(page):
    _, _, out, text = page
    assert out["baseline"] == "baseline"
    box = text[text.index('class="headline"') : text.index("<nav>")]
    assert text.index('class="headline"') < text.index('id="ladder"')
    assert text.index('class="headline"') < text.index('id="provenance"')
    assert headline_value(text, "cpu").startswith("AMD EPYC 9R14")
    assert headline_value(text, "isa") == "AVX-512 BF16, no AMX"
    # the fastest configuration whose losses do not diverge: run_cpu + tcmalloc
    assert headline_value(text, "best") == "runcpu-tcmalloc"
    assert headline_value(text, "sps") == "35.2"
    # over the baseline's two clean trials (the noisy one left out), 10 and 12: the
    # ratio of geometric means, the statistic its interval bounds
    assert headline_value(text, "speedup") == f"{35.2 / math.sqrt(10 * 12):.2f}×" == "3.21×"
    # $0.1027/hour / (35.2 samples/s * 3600 s) * 1e6 = $0.81 per million samples
    assert headline_value(text, "cost") == f"${PRICE_A / (35.2 * 3600) * 1e6:.2f}" == "$0.81"
    assert "$2.59 for the baseline" in box  # 0.1027 / (11 * 3600) * 1e6
    assert "inductor-bf16-cl" in box and "diverg" in box
    # how much was measured: 11 trials, 10 ok; timed steps of the ok ones
    assert headline_value(text, "trials") == "11"
    assert headline_value(text, "steps") == str(8 * 9 + 3)
    assert "preset quick" in box
    assert "their step-time percentiles are not shown" in box
    # the budget-cut run, the noisy trial, the diverging configuration
    assert headline_value(text, "truncated") == "1"
    assert "bf16 (3 of 8 (time budget))" in box and "1</b> experiment rests" in box
    assert headline_value(text, "noisy") == "1"
    assert headline_value(text, "diverging") == "1"
    # the geometric mean of compiled over eager twins: 40/33 and 12.1/11
    assert headline_value(text, "compile") == f"{math.sqrt(40 / 33 * 12.1 / 11):.2f}×"
    # two machines: the cheapest per sample
    assert headline_value(text, "cheapest") == "avx512-box"


def test_the_ladder_compares_each_step_with_the_one_it_builds_on(page):
    _, _, _, text = page
    table = html_tables(section(text, "ladder"))[0].set_index("experiment")
    step = "over the step it builds on"
    assert table.loc["baseline", step] == "—"
    # each ratio (of geometric means) with its 95 % interval (the spread of log
    # throughput: here the baseline's two used trials alone, 1 degree of freedom, the
    # one-trial side borrowing it) and a verdict
    s = abs(math.log(12 / 10)) / math.sqrt(2)
    half = scipy.stats.t.ppf(0.975, 1) * s * math.sqrt(1 / 2 + 1)
    ratio = 22 / math.sqrt(10 * 12)
    interval = f"[{ratio * math.exp(-half):.2f}–{ratio * math.exp(half):.2f}], undecided"
    assert (
        table.loc["bf16", step] == f"{ratio:.2f}× over baseline: precision fp32→bf16 ({interval})"
    )
    assert table.loc["bf16-cl", step].startswith("1.50× over bf16: + channels_last ([")
    assert table.loc["runcpu-tcmalloc", step].startswith(
        "1.07× over bf16-cl: launcher none→run_cpu, allocator default→tcmalloc (["
    )
    assert table.loc["runcpu-tcmalloc", "speedup"].startswith("3.21× ([")
    assert table.loc["runcpu-tcmalloc", "speedup"].endswith("], undecided)")
    # percentiles from too few timed steps are not numbers
    assert table.loc["baseline", "step p90 (s)"] == "n/a (8 steps)"
    assert table.loc["baseline", "step p99 (s)"] == "n/a (8 steps)"
    assert table.loc["bf16", "timed steps"] == "3 of 8 (time budget)"
    assert table.loc["baseline", "timed steps"] == "8"
    # the two kinds of noise side by side
    assert table.loc["baseline", "CV over trials"] == f"{100 * (2**0.5) / 11:.1f}%"
    assert table.loc["bf16", "CV over trials"] == "n/a (1 trial)"
    assert table.loc["baseline", "step-time CV within a trial"].endswith("%")


def test_backends_are_compared_at_the_same_configuration(page):
    _, _, _, text = page
    table = html_tables(section(text, "backends"))[0].set_index("configuration")
    fp32 = [c for c in table.index if ", fp32," in c]
    bf16 = [c for c in table.index if "bf16, channels_last," in c and "run_cpu" not in c]
    assert len(fp32) == 1 and len(bf16) == 1
    row = table.loc[fp32[0]]
    assert row["eager (torch 2.14.1)"].startswith("11.0 (10.0–12.0) (baseline)")
    assert row["ipex (torch 2.14.1)"].startswith("9.00 (ipex-baseline), 0.82× eager ([")
    assert row["inductor (torch 2.14.1)"].startswith("12.1 (inductor-fp32), 1.10× eager ([")
    assert row["inductor (torch 2.14.1)"].endswith("], undecided)")
    row = table.loc[bf16[0]]
    assert row["eager (torch 2.14.1)"] == "33.0 (bf16-cl)"
    # one trial each and no spread pooled from these two: no interval
    assert row["inductor (torch 2.14.1)"].startswith("40.0 (inductor-bf16-cl), 1.21× eager ([")
    assert row["ipex + ipex.optimize (torch 2.14.1)"] == "no ok trial (ipex-optimize-bf16-cl)"
    # nothing compares eager's best bf16 with another backend's fp32
    assert not any("bf16" in c and "fp32" in c for c in table.index)


def test_other_models_are_not_divided_by_the_baseline(page):
    _, _, _, text = page
    table = html_tables(section(text, "other"))[0].set_index("experiment")
    assert (
        table.loc["resnet18", "speedup vs baseline"]
        == "n/a (model resnet50→resnet18, image_size 224→64)"
    )


def test_unrun_sweeps_are_one_line(page):
    tmp, _, _, text = page
    assert (
        "Not run in this preset: batch size sweep, dataloader workers sweep, threads sweep." in text
    )
    for sweep in ("batch_size", "num_workers", "threads"):
        assert f'<section id="{sweep}">' not in text
        assert "not run in this preset" in (tmp / "report" / f"{sweep}.svg").read_text()
    assert "No rows" not in text


def test_cost_in_dollars_per_million_samples(page):
    _, _, _, text = page
    table = html_tables(section(text, "cost"))[0]
    ours = table[table["instance"] == "this machine"].set_index("configuration")
    assert ours.loc["baseline", "$ per million samples"] == "$2.59"
    assert ours.loc["baseline", "million samples per $"] == f"{11 * 3600 / PRICE_A / 1e6:.3g}"
    assert ours.loc["runcpu-tcmalloc", "$ per million samples"] == "$0.81"
    # the article's instance is priced with the article's own figures, never with ours
    art = table[table["instance"] == "article: c7i.2xlarge"]
    assert set(art["throughput from"]) == {"article"}
    assert list(art["samples/s"]) == ["9.12", "40.7"]
    assert (
        list(art["$ per million samples"])
        == [
            f"${0.357 / (9.12 * 3600) * 1e6:.2f}",
            f"${0.357 / (40.73 * 3600) * 1e6:.2f}",
        ]
        == ["$10.87", "$2.43"]
    )
    assert all("claim" in c for c in art["configuration"])


def test_cost_frame_arithmetic():
    frame = rec.summary_frame([make("baseline", sps=10.0), make("fast", sps=40.0)])
    s = report.stats.experiment_stats(frame)
    costs = report.stats.cost_frame(
        s, "baseline", report.stats.parse_prices('[{"name":"a","usd_per_hour":2}]')
    )
    assert costs.loc[0, "baseline_usd_per_million"] == pytest.approx(2 / (10 * 3600) * 1e6)
    assert costs.loc[0, "best_usd_per_million"] == pytest.approx(2 / (40 * 3600) * 1e6)
    assert costs.loc[0, "best_samples_per_usd"] == pytest.approx(40 * 3600 / 2)
    assert stats.usd_per_million(math.nan, 1.0) != stats.usd_per_million(math.nan, 1.0)


def test_losses_are_checked_against_fp32_eager(page):
    _, _, _, text = page
    part = section(text, "correctness")
    table = html_tables(part)[0].set_index("experiment")
    assert table.loc["inductor-bf16-cl", "verdict"] == "diverges"
    assert table.loc["inductor-bf16-cl", "reference (fp32 eager)"] == "baseline"
    assert table.loc["bf16-cl", "verdict"] == "matches"
    assert table.loc["baseline", "verdict"] == "reference"
    assert table.loc["resnet18", "verdict"] == "reference"  # its own setup's fp32 eager run
    assert '<figure id="fig-losses">' in part


def test_loss_deviation_and_verdicts():
    # blocks of 3 steps at least: the mean of 2.0, 2.1, 2.2 is 0.05 above the reference
    dev, step, _ = quality.loss_deviation([2.0, 2.1, 2.2], [2.0, 2.0, 2.0])
    assert dev == pytest.approx(0.05) and step == 0
    dev, step, _ = quality.loss_deviation([2.0] * 3 + [2.6] * 3, [2.0] * 6)
    assert dev == pytest.approx(0.3) and step == 3 and quality.verdict(dev) == "diverges"
    # one step off by 20% among steady neighbours (a chaotic start from scratch): a drift
    ref = [7.28, 4.36, 5.17, 5.81, 7.75, 7.35, 7.29, 6.63, 12.29, 9.16]  # ResNet-50, fp32
    bf16 = [7.27, 4.33, 5.08, 5.77, 7.59, 7.27, 7.22, 6.54, 10.78, 9.13]  # the same, bf16
    assert quality.verdict(quality.loss_deviation(bf16, ref)[0]) == "drifts"
    # ... also when that step is in a short last block (here steps 6-9 are one block)
    bf16_cl = [7.25, 4.34, 5.16, 5.79, 7.79, 7.48, 7.49, 7.26, 13.77, 7.6]
    dev, step, _ = quality.loss_deviation(bf16_cl, ref)
    assert step == 6 and quality.verdict(dev) == "drifts"
    assert quality.verdict(0.01) == "matches" and quality.verdict(0.05) == "drifts"
    assert quality.verdict(0.5) == "diverges"
    dev, step, note = quality.loss_deviation([2.0, math.nan], [2.0, 1.9])
    assert dev == math.inf and step == 1 and "non-finite" in note
    # a long run is compared in blocks, relative to the starting loss
    ref = [2.3] * 10 + [0.1] * 90
    assert quality.loss_deviation([2.3] * 10 + [0.12] * 90, ref)[0] == pytest.approx(0.02 / 2.3)


def test_noisy_trials_say_how_they_were_caught(page):
    _, _, _, text = page
    noisy = html_tables(section(text, "noise"))[0]
    assert list(noisy["experiment"]) == ["baseline"]
    assert noisy["caught by"].iloc[0] == "peer probes"
    assert "step-time CV" in noisy.columns


def test_two_machines_side_by_side(page):
    _, _, _, text = page
    part = section(text, "machines")
    tables = html_tables(part)
    overview = tables[0].set_index("machine")
    assert overview.loc["avx512-box", "ISA"] == "AVX-512 BF16, no AMX"
    assert overview.loc["avx2-box", "ISA"] == "AVX2 only"
    assert "bf16 is emulated" in overview.loc["avx2-box", "what the ISA explains"]
    assert "bf16 ran 0.50× fp32" in overview.loc["avx2-box", "what the ISA explains"]
    assert "bf16 ran 2.00× fp32" in overview.loc["avx512-box", "what the ISA explains"]
    assert overview.loc["avx2-box", "USD/hour"] == "0.200"
    side = tables[1].set_index("experiment")
    # only what both ran with the same settings: not bf16-cl (another batch), not xla
    assert list(side.index) == ["baseline", "bf16", "runcpu-tcmalloc"]
    assert side.loc["runcpu-tcmalloc", "avx2-box: samples/s"] == "5.20"
    # each machine's ratios with its own run's spread: one trial each there, no interval
    assert side.loc["runcpu-tcmalloc", "avx2-box: × own baseline"] == (
        "0.65× (undecided: one trial each, no interval)"
    )
    assert side.loc["runcpu-tcmalloc", "avx512-box: × own baseline"].startswith("3.21× ([")
    assert side.loc["baseline", "avx512-box: × own baseline"] == "1.00×"
    assert side.loc["runcpu-tcmalloc", "avx2-box: $/M samples"] == (
        f"${PRICE_B / (5.2 * 3600) * 1e6:.2f}"
    )
    assert side.loc["runcpu-tcmalloc", "avx512-box: $/M samples"] == "$0.81"
    assert "bf16-cl is left out: its settings differ (avx2-box: batch_size 16→32)" in part
    assert "different presets" in part and "default" in part
    assert '<figure id="fig-machines">' in part


def test_machines_from_the_command_line(tmp_path):
    """Two result sets and no --records: the first is the report's own run."""
    write(tmp_path / "a", machine_a())
    write(tmp_path / "b", machine_b())
    cmd = [sys.executable, "-m", "workflow_scripts.report"]
    cmd += ["--machine", "zen4", str(tmp_path / "a"), "0.1"]
    cmd += ["--machine", "haswell", str(tmp_path / "b"), "-"]
    cmd += ["--summary", str(tmp_path / "o" / "s.csv"), "--html", str(tmp_path / "o" / "i.html")]
    cmd += ["--plots-dir", str(tmp_path / "o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "o" / "i.html").read_text()
    assert headline_value(text, "cost") == f"${0.1 / (35.2 * 3600) * 1e6:.2f}"
    overview = html_tables(section(text, "machines"))[0].set_index("machine")
    assert overview.loc["haswell", "USD/hour"] == "n/a (no price)"
    assert len(pd.read_csv(tmp_path / "o" / "s.csv")) == len(machine_a())
    bad = subprocess.run(
        [*cmd[:3], "--machine", "x", str(tmp_path / "none"), "1", *cmd[-6:]],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "no trial records" in bad.stderr


def test_differences_and_workloads():
    a = {"model": "resnet50", "precision": "fp32", "channels_last": False, "compile": "none"}
    b = dict(a, precision="bf16", channels_last=True)
    assert compare.differences(a, b) == ["precision fp32→bf16", "+ channels_last"]
    assert compare.same_workload(a, b)
    assert not compare.same_workload(a, dict(a, model="cnn"))
    assert compare.differences(a, a) == []


def test_percentiles_need_enough_steps():
    row = {"steps_timed": 8, "steps": 8}
    assert formatting.percentile_text(0.5, "p90", row) == "n/a (8 steps)"
    assert formatting.percentile_text(0.5, "p90", {"steps_timed": 10}) == "0.500"
    assert formatting.percentile_text(0.5, "p95", {"steps_timed": 19}) == "n/a (19 steps)"
    assert formatting.percentile_text(0.5, "p99", {"steps_timed": 100}) == "0.500"
    # no steps_timed column (an older summary): the spec's steps decide
    assert formatting.percentile_text(0.5, "p99", {"steps": 90}) == "n/a (90 steps)"


def test_missing_or_empty_new_columns_do_not_crash(tmp_path):
    """A summary without the measurement side's new columns (an older summary.csv)."""
    frame = rec.summary_frame(
        [make("baseline", sps=10.0), make("bf16", sps=20.0, precision="bf16")]
    )
    old = frame.drop(
        columns=[c for c in ("steps_timed", "time_budget_hit", "step_time_cv", "ceiling_gflops",
                             "ceiling_dtype", "measurement_error", "noise_signal") if c in frame]
    )  # fmt: skip
    s = stats.experiment_stats(stats.enrich(old, []))
    assert math.isnan(s.loc[0, "steps_timed"]) and s.loc[0, "measurement_error"] == ""
    roof = stats.ceiling_frame(s)
    assert roof.empty  # no FLOP counts in these records
    old.to_csv(tmp_path / "summary.csv", index=False)
    m = machines.load_machine({"name": "old", "results": str(tmp_path / "summary.csv")})
    assert m.baseline == "baseline" and len(m.stats) == 2


def test_a_measurement_error_is_shown_instead_of_a_number():
    row = {"experiment": "x", "flops_per_sample": 1e9, "sps_median": 10.0, "precision": "fp32",
           "achieved_gflops": 10.0, "pct_of_peak": math.nan, "ceiling_gflops": 5.0,
           "ceiling_dtype": "fp32", "probe_fp32_gflops": 5.0, "probe_bf16_gflops": 9.0,
           "measurement_error": "200% of the calibrated ceiling: a measurement error"}  # fmt: skip
    roof = stats.ceiling_frame(pd.DataFrame([row]))
    shown = report.html.ceiling_display(roof)
    assert shown.loc[0, "% of the ceiling"].startswith("n/a: 200% of the calibrated ceiling")
    assert shown.loc[0, "ceiling from"] == "calibrated ceiling"


def test_the_study_time_against_its_estimate(page):
    """Each experiment's wall time beside the estimate made before it ran, the whole
    study's, and the probes' share of it."""
    _, records, _, text = page
    part = section(text, "study-time")
    plain = re.sub(r"<[^>]+>", "", part)
    timed = [r for r in records if r.get("estimate")]
    wall = sum(r["trial_wall_s"] for r in timed)
    assert f"All {len(timed)} trials with an estimate" in plain
    assert f"{wall / (16.0 * len(timed)):.2f}×" in plain  # measured over estimated, in all
    # baseline: 3 trials predicted at 16 s each, measured 20, 21 and 22 s (median 21)
    row = re.search(r"<td>baseline</td>\s*<td>3</td>\s*<td>3</td>\s*<td>16.0</td>"
                    r"\s*<td>21.0</td>\s*<td>1.31×</td>", part)  # fmt: skip
    assert row, part
    # the probes: 0.5 s before the steps in each trial (none after in these records)
    assert f"{100 * 0.5 * len(timed) / wall:.1f}% of the trials' wall time" in plain
    assert "ipex-optimize-bf16-cl" not in part  # failed before it had a wall time


def test_records_without_an_estimate_say_so(tmp_path):
    records = [make("baseline", 0, 10.0)]
    frame = rec.summary_frame(records)
    from workflow_scripts.report.timing import timing_section

    sid, heading, content = timing_section(frame)
    assert sid == "study-time" and "estimate vs measured" in heading
    assert "n/a: no record holds both an estimate and its wall time" in content
    # what the estimate is made of, as plan/estimate.py makes it
    assert "a transformer's MLP block for the text models" in content
    assert "the FLOP count (one step of one sample on fake tensors)" in content


def test_the_study_time_states_the_noise_reruns_and_the_time_spent_measuring():
    from workflow_scripts.report.headline import _noise
    from workflow_scripts.report.timing import timing_section

    records = []
    for k, retry in enumerate((0.0, 30.0)):
        r = make("baseline", k, 10.0)
        # a 1.6 s step (10 timed): the first step's 4.2 s is 2.6 s of one-off costs
        r["metrics"].update(train_time_s=22.6, time_to_first_step_s=4.2)
        r.update(estimate={"seconds": 40.0}, trial_wall_s=40.0 + retry, retry_wall_s=retry)
        r["discarded_attempts"] = [{"attempt": 1}] if retry else []
        records.append(r)
    frame = rec.summary_frame(records)
    assert list(frame["measuring_s"]) == [20.0, 20.0]
    assert list(frame["retry_wall_s"]) == [0.0, 30.0]
    plain = re.sub(r"<[^>]+>", "", timing_section(frame)[2])
    # 30 s of reruns in 110 s of trials; 2 x 20 s in warm-up and timed steps, 2 x 16 timed
    assert (
        "the noise reruns (attempts discarded as disturbed, and the pauses after them) "
        "30 s, 27.3%" in plain
    )
    assert ("took 40 s: a measurement efficiency of 36% of the trials' wall time, the timed "
            "steps alone 29%") in plain  # fmt: skip
    line = re.sub(r"<[^>]+>", "", _noise(frame, pd.DataFrame(), records))
    assert "1 attempt discarded and rerun, 27% of the trials' wall time (0.5 of 1.8 min)" in line
    assert "not rerun" not in line
    # a disturbed trial kept at once, the trial before it disturbed after its reruns
    records[0]["noise_check"] = {"passed": False, "rerun_withheld": "the trial before ..."}
    line = re.sub(r"<[^>]+>", "", _noise(frame, pd.DataFrame(), records))
    assert (
        "(0.5 of 1.8 min); 1 disturbed trial not rerun, the trial before ending "
        "disturbed after its own reruns (the disturbance outlasted a trial)"
    ) in line


def test_where_the_trials_time_went_part_by_part():
    from workflow_scripts.report.timing import PARTS, time_parts, time_parts_frame, timing_section

    r = make("baseline", 0, 10.0)
    r["metrics"].update(wall_s=30.0, import_s=2.0, flops_count_s=3.0, setup_s=1.0,
                        grad_check_s=4.0, time_to_first_step_s=5.0, train_time_s=17.0,
                        steps_timed=8, step_time_s={"median": 1.0, "mean": 1.0})  # fmt: skip
    r["probe"] = {"seconds": 0.5}
    r["probe_after"] = {"seconds": 0.5}
    r["provenance"] = {**r["provenance"], "process_wall_s": 34.0}
    r.update(trial_wall_s=50.0, retry_wall_s=15.0, estimate={"seconds": 40.0})
    parts = time_parts(r)
    assert list(parts) == [name for name, _ in PARTS]
    assert parts["noise reruns"] == 15.0 and parts["process start and exit"] == 4.0
    # a first step of 5 s where a steady one takes 1 s: 4 s of one-off costs; the other
    # 13 s of the loop are warm-up (the first step's 1 s and 4 more) and 8 timed steps
    assert parts["first step's one-off costs"] == 4.0
    assert parts["warm-up steps"] == 5.0 and parts["timed steps"] == 8.0
    # 30 s of harness: 2 + 3 + 1 + 1 (probes) + 4 + 4 + 13 = 28, the rest 2; policy 1
    assert parts["the rest of the harness"] == pytest.approx(2.0)
    assert parts["the trial policy"] == pytest.approx(1.0)
    assert sum(parts.values()) == pytest.approx(50.0)
    # the libraries' imports are taken out of the setup they were timed in (an older
    # record without them: all of it setup)
    assert parts["import the libraries"] == 0.0 and parts["setup"] == 1.0
    split = {**r, "metrics": {**r["metrics"], "setup_s": 4.0, "libraries_s": 2.5, "wall_s": 33.0}}
    split.update(trial_wall_s=53.0, provenance={**r["provenance"], "process_wall_s": 37.0})
    got = time_parts(split)
    assert got["import the libraries"] == 2.5 and got["setup"] == pytest.approx(1.5)
    assert got["the rest of the harness"] == pytest.approx(2.0)
    assert sum(got.values()) == pytest.approx(53.0)
    table = time_parts_frame([r, r, {"status": "failed"}])
    assert table.set_index("part").loc["timed steps", "seconds"] == 16.0
    assert table["share"].sum() == pytest.approx(1.0)
    plain = re.sub(r"<[^>]+>", " ", timing_section(rec.summary_frame([r]), [r])[2])
    assert "Where the trials' time went" in plain
    # a probe taken again before the steps (after a pause): its earlier probes and pauses
    # are the probes' time too, in the parts and in summary.csv
    # (4.5 s more of the harness's, the process's and the trial's wall time)
    again = {**r, "probe": {"seconds": 0.5, "reprobed": {"seconds": 4.5}},
             "metrics": {**r["metrics"], "wall_s": 34.5}, "trial_wall_s": 54.5,
             "provenance": {**r["provenance"], "process_wall_s": 38.5}}  # fmt: skip
    parts = time_parts(again)
    assert parts["noise probes"] == 5.5 and parts["the rest of the harness"] == pytest.approx(2.0)
    assert sum(parts.values()) == pytest.approx(54.5)
    assert rec.summary_frame([again])["probe_s"].iloc[0] == 5.5
    row = r"timed steps\s+what the results are computed from\s+8 s\s+16.0%"
    assert re.search(row, plain), plain


def test_configurations_that_read_alike_are_told_apart(tmp_path):
    """Two configurations the backend table's words do not tell apart (fixed and dynamic
    padding, SGD and AdamW: the default study's BERT-base runs) get a row each, named by
    what differs, and the report builds (it crashed on the default study's records)."""
    bert = {"model": "bert-base", "image_size": None, "seq_len": 128}
    records = [
        trial("fixed-eager", sps=4.0, **bert),
        trial("fixed-inductor", sps=5.0, backend="inductor", compile="inductor", **bert),
        trial("dynamic-eager", sps=6.0, padding="dynamic", **bert),
        trial(
            "dynamic-inductor",
            sps=7.0,
            backend="inductor",
            compile="inductor",
            padding="dynamic",
            **bert,
        ),  # fmt: skip
    ]
    loaded = rec.load_records(write(tmp_path, records))
    out = report.build_report(
        loaded,
        report.Outputs(
            tmp_path / "summary.csv", tmp_path / "report" / "index.html", tmp_path / "report"
        ),
    )
    assert out["trials"] == 4
    text = (tmp_path / "report" / "index.html").read_text()
    table = html_tables(section(text, "backends"))[0].set_index("configuration")
    assert len(table) == 2, table.index
    fixed = [c for c in table.index if c.endswith("padding fixed")]
    dynamic = [c for c in table.index if c.endswith("padding dynamic")]
    assert len(fixed) == 1 and len(dynamic) == 1, table.index
    assert table.loc[dynamic[0]].str.contains("dynamic-inductor").any()
    assert not table.loc[fixed[0]].str.contains("dynamic").any()


def test_many_cut_short_experiments_are_counted_by_reason_and_their_list_folded():
    """A default study cuts dozens of experiments short (far_stop, stop early): the
    headline's line counts them by reason and folds their names, instead of filling
    the first screen; a few are still named in the line itself."""
    from workflow_scripts.report import headline

    def frame(n_far, n_early):
        rows = [
            {"experiment": f"far{i}", "steps": 8, "steps_timed": 2, "epochs": 0,
             "stop_reason": "far_from_baseline", "n_budget_hit": 0}
            for i in range(n_far)
        ] + [
            {"experiment": f"early{i}", "steps": 8, "steps_timed": 5, "epochs": 0,
             "stop_reason": "", "n_budget_hit": 0}
            for i in range(n_early)
        ] + [
            {"experiment": "full", "steps": 8, "steps_timed": 8, "epochs": 0,
             "stop_reason": "", "n_budget_hit": 0}
        ]  # fmt: skip
        return pd.DataFrame(rows)

    many = headline._budget(frame(4, 3))
    assert headline_value(many, "truncated") == "7"
    assert "already beyond far_stop of its baseline: 4; stopped early: 3" in many
    assert "<details><summary>Which</summary>" in many
    assert many.index("far0 (2 of 8") > many.index("<details>")
    assert "full" not in many
    few = headline._budget(frame(1, 1))
    assert headline_value(few, "truncated") == "2"
    assert "<details>" not in few
    assert "far0 (2 of 8 (already beyond far_stop of its baseline)), early0 (5 of 8" in few
