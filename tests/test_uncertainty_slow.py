"""Every comparison with its interval and a verdict, through the real workflow
(tests/test_uncertainty.py has the fast tests of workflow_scripts/report/uncertainty.py):
a twin of an experiment is not faster or slower, batch 1 is slower per sample than batch
64, and the adaptive rounds run exactly what the last round left undecided; six twins
crown none."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from datetime import datetime
from html import unescape
from pathlib import Path

import pandas as pd
import pytest
import scipy.stats

from tests.conftest import ENVS_ROOT
from tests.runs import local_study
from workflow_scripts.plan import rounds
from workflow_scripts.spec.settings import SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.torch]


#: two experiments of identical settings and one at batch 1, through the real workflow
#: (the quick preset's tiny CNN, at a batch that takes a while): two trials each, then
#: the adaptive rounds, up to MOST, where a comparison is still undecided. The identical
#: pair runs on one thread of the 2-vCPU machines this suite runs on: its throughput
#: varied by 5 % from one process to the next here, and by 15-17 % on a 2-vCPU Xeon VM
#: with AMX (docs/measurement.md). At such spreads "the same" within a margin of ±10 %
#: would take some 40 trials each: the twin is asked to be no faster or slower (the same
#: or undecided). The pair that truly differs must differ on any machine: batch 1 pays
#: a step's fixed costs (the eager ops' dispatch, the loss, the optimizer step) for one
#: sample instead of 64, slower per sample everywhere; twice the threads is not (a CI
#: host's two threads ran at 0.59x of one, the same pair 1.3-1.9x faster elsewhere).
#: The twin never stops far (far_stop null): with the margin at ±10 % a far slower
#: first trial would be its last, and one disturbed process (0.54x here once) would
#: then decide the pair alone (FAR_STUDY tests that rule)
MOST = 6
AA_STUDY = """
runtime: local
trials: 2
max_trials: {most}
margin: 0.1
collectives: {variants: []}
defaults: {batch_size: 64, warmup_steps: 3, steps: 30, far_stop: 1.25, step_precision: null}
groups:
  aa:
    runs:
      - {id: first, threads: 1}
      - {id: twin, threads: 1, far_stop: null}
      - {id: batch-1, threads: 1, batch_size: 1}
""".replace("{most}", str(MOST))
#: the experiments of AA_STUDY
AA = ("first", "twin", "batch-1")


def trials_of(wd, experiment: str) -> list[int]:
    folder = wd / "results/records" / experiment
    return sorted(int(p.stem.removeprefix("trial")) for p in folder.glob("trial*.json"))


def test_through_snakemake_a_twin_is_the_same_and_batch_1_slower(
    upstream_env, upstream_calibration, tmp_path
):
    wd, cmd, proc = local_study(tmp_path / "wf", AA_STUDY, ENVS_ROOT, [upstream_calibration])
    table = pd.read_csv(wd / "results/comparisons.csv")
    pairs = table.drop_duplicates(["baseline", "experiment"]).set_index("experiment")
    twin, small = pairs.loc["twin"], pairs.loc["batch-1"]
    summary = pd.read_csv(wd / "results/summary.csv")
    spread = summary.groupby("experiment")["samples_per_s"].agg(["median", "min", "max"])
    why = f"{twin.to_dict()}\n{spread}\n{proc.stderr[-3000:]}"
    # identical settings: not faster or slower (the same or undecided), the interval
    # holding 1.0 (it misses in 1 run of 20 at most by design, so the test asks the
    # 99.9 % interval, from the same ratio, spread and trials)
    assert twin["baseline"] == "first" and twin["verdict"] in ("same", "undecided"), why
    half = scipy.stats.t.ppf(0.9995, twin["df"]) * twin["spread"]
    half *= math.sqrt(1 / twin["n_baseline"] + 1 / twin["n_experiment"])
    assert math.exp(-half) < twin["ratio"] < math.exp(half) and twin["margin"] == 0.1, why
    assert small["baseline"] == "first" and small["verdict"] == "slower", small.to_dict()
    assert small["ci_high"] < 1.0 and small["change"] == "batch_size 64→1", small.to_dict()
    # the adaptive rounds: another round runs exactly the experiments that the last
    # round's comparisons left undecided (those that may still be decided by the cap), up
    # to MOST trials; any of them, also one that sat out a round
    assert 1 <= len(trials_of(wd, "batch-1")) <= MOST, why
    eligible = [e for e in AA if 1 in trials_of(wd, e)]  # those that ran the minimum
    settings = {"trials": 2, "max_trials": MOST, "futility": SETTINGS["futility"].default}
    for k in range(1, MOST - 1):
        decided_by = wd / f"results/rounds/{k}/comparisons.csv"
        going_on = [e for e in eligible if k + 1 in trials_of(wd, e)]
        if not going_on:
            named = decided_by.exists() and rounds.going_on(decided_by, eligible, settings, k)
            assert not named, (k, named)
            break
        # (and those of a comparison the headline states, not yet within ±10 %)
        undecided = {
            e
            for row in pd.read_csv(decided_by).to_dict("records")
            if row["verdict"] == "undecided" or row["headline"]
            for e in (row["baseline"], row["experiment"])
        }
        named = rounds.going_on(decided_by, eligible, settings, k)
        assert going_on == named, (k, going_on, undecided)
        assert set(going_on) <= undecided, (k, going_on, undecided)
        page = (wd / f"results/rounds/{k}/report/index.html").read_text()
        assert f"Provisional report: the first {k + 1} of 2 to {MOST} trials" in page
        assert len(pd.read_csv(wd / f"results/rounds/{k}/summary.csv")) == sum(
            len([t for t in trials_of(wd, e) if t <= k]) for e in AA
        )
    assert all(max(trials_of(wd, e)) <= MOST - 1 for e in ("first", "twin"))
    assert len(summary) == sum(len(trials_of(wd, e)) for e in AA)
    assert int(twin["n_experiment"]) <= len(trials_of(wd, "twin"))
    assert not (wd / f"results/rounds/{MOST - 1}").exists()
    # every trial's progress line was made (none failed), and once round 0's report
    # was written the time left held the rounds as its comparisons forecast them
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[progress]")]
    assert len(lines) >= len(summary) and not [ln for ln in lines if "[progress] none" in ln]
    forecast = [ln for ln in lines if "for the adaptive rounds, as the comparisons so far" in ln]
    assert forecast, lines
    assert all("up to about" in ln for ln in forecast), forecast
    # the first round's provisional report came before any second trial
    first_page = wd / "results/rounds/0/report/index.html"
    assert first_page.stat().st_mtime <= (wd / "results/records/first/trial1.json").stat().st_mtime
    # no trial stopped far: the twin's far stop is off, and batch 1 does other work per
    # step than any earlier run of its group (FAR_STUDY tests that rule)
    for e in AA:
        for k in trials_of(wd, e):
            record = json.loads((wd / f"results/records/{e}/trial{k}.json").read_text())
            assert record["metrics"]["stop_reason"] != "far_from_baseline", (e, k)
            assert not record.get("far_from"), (e, k)
    # nothing changed: a second run does nothing, the adaptive rounds included
    again = subprocess.run([*cmd, "-n"], cwd=wd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, (
        again.stdout[-3000:] + again.stderr[-3000:]
    )


#: one thread against two, its far stop (1.12x) beyond the margin (±10 %): a first trial
#: that stops far slower than its baseline by the factor squared (1.25x) is its last,
#: while the baseline runs its two; one between the factor and its square runs its
#: second too. Far either way: one thread of two ran 1.5-1.8x slower on most of the
#: 2-vCPU machines this suite runs on, 1.31x under a neighbour's load (undecided at
#: 1.25x: its interval reached inside), and 1.7x faster on a CI host whose two threads
#: were slower than one.
#: The group is the study's headline (another group follows): its second trials run
#: right after its first, but the far one's, before the other group's first trial; a
#: twin that never stops far gives the headline's early report an interval
FAR = 1.12
FAR_STUDY = """
runtime: local
trials: 2
max_trials: null
margin: 0.1
collectives: {variants: []}
defaults: {batch_size: 64, warmup_steps: 3, steps: 30, far_stop: FAR, step_precision: null}
groups:
  far:
    runs:
      - {id: two, threads: 2}
      - {id: one, threads: 1}
      - {id: twin, threads: 2, far_stop: null}
  other:
    runs:
      - {id: other, threads: 2, batch_size: 16, steps: 6}
""".replace("far_stop: FAR", f"far_stop: {FAR}")


def test_through_snakemake_a_first_trial_far_from_its_baseline_is_its_last(
    upstream_env, upstream_calibration, tmp_path
):
    wd, cmd, proc = local_study(tmp_path / "wf", FAR_STUDY, ENVS_ROOT, [upstream_calibration])
    one = json.loads((wd / "results/records/one/trial0.json").read_text())
    why = f"{one['metrics']}\n{proc.stderr[-3000:]}"
    assert one["metrics"]["stop_reason"] == "far_from_baseline", why
    assert one["far_from"]["baseline"] == "two" and 1 <= one["metrics"]["steps_timed"] < 30
    # its last where it stopped beyond the factor squared (plan/rounds.py)
    last = rounds.stopped_far(wd / "results/records", ["one"]) == {"one"}
    ones = [0] if last else [0, 1]
    assert trials_of(wd, "one") == ones and trials_of(wd, "two") == [0, 1], why
    assert trials_of(wd, "twin") == trials_of(wd, "other") == [0, 1], why
    table = pd.read_csv(wd / "results/comparisons.csv")
    pair = table[(table["baseline"] == "two") & (table["experiment"] == "one")].iloc[0]
    summary = pd.read_csv(wd / "results/summary.csv")
    assert len(summary) == 6 + len(ones)
    # "two" rests on its 2 trials but one the noise check flagged (this shared machine
    # flags one now and then: the study uses the clean ones, all where the flagged are
    # the more), "one" on its one (or its two, as "two")

    def used(experiment: str) -> int:
        noisy = summary.loc[summary["experiment"] == experiment, "noisy"].astype(bool)
        return len(noisy) if noisy.sum() > (~noisy).sum() else int((~noisy).sum())

    assert (pair["n_baseline"], pair["n_experiment"]) == (used("two"), used("one")), (
        summary.to_string()
    )
    # far by the evidence the stop had (its timed steps against the baseline's first
    # trial: the rule, plan/far.py); the study's comparison, over the baseline's two
    # trials, on the same side (the baseline's second trial may move the ratio, not
    # turn it: here, 1.37x at the stop and 1.24x over both trials, on a run whose
    # second baseline trial ran 19 % slower than its first)
    at_stop = one["far_from"]["step_time_s"] / statistics.fmean(one["step_times_s"])
    assert not 1 / FAR <= at_stop <= FAR, (at_stop, one["far_from"])
    assert (pair["ratio"] < 1) == (at_stop < 1), (pair.to_dict(), at_stop)

    # the headline's second trials waited for its first trials' report (a checkpoint),
    # then ran but the far one's, before the other group's first trial; their report,
    # the headline's comparisons with the twin's interval, came before that trial too
    def launched(experiment: str, k: int) -> float:
        record = json.loads((wd / f"results/records/{experiment}/trial{k}.json").read_text())
        return datetime.fromisoformat(record["provenance"]["launched_at"]).timestamp()

    rounds_dir = wd / "results/rounds"
    first_page = (rounds_dir / "first/report/index.html").stat().st_mtime
    second_page = (rounds_dir / "headline/report/index.html").stat().st_mtime
    assert first_page <= min(launched("two", 1), launched("twin", 1)) + 1, why  # (whole s)
    assert max(launched("two", 1), launched("twin", 1)) < launched("other", 0), why
    assert second_page <= launched("other", 0) + 1, why
    early = pd.read_csv(rounds_dir / "headline/summary.csv")
    assert sorted(zip(early["experiment"], early["trial"])) == sorted([
        *(("one", k) for k in ones), ("twin", 0), ("twin", 1), ("two", 0), ("two", 1)
    ])  # fmt: skip
    table = pd.read_csv(rounds_dir / "headline/comparisons.csv")
    twin = table[(table["baseline"] == "two") & (table["experiment"] == "twin")].iloc[0]
    if min(twin["n_baseline"], twin["n_experiment"]) >= 2:  # (unless the noise check flagged one)
        assert math.isfinite(twin["ci_low"]) and math.isfinite(twin["ci_high"]), twin.to_dict()
    assert f"with its intervals: {Path('results/rounds/headline/report/index.html')}" in (
        proc.stderr
    )
    # the first round's report, after every first trial, ran the second round's rest
    round_page = (rounds_dir / "0/report/index.html").stat().st_mtime
    assert round_page <= launched("other", 1) + 1, why
    # and it holds every trial run by then: the headline's second ones too, so that the
    # newest provisional report keeps the headline's intervals
    round0 = pd.read_csv(rounds_dir / "0/summary.csv")
    assert sorted(zip(round0["experiment"], round0["trial"])) == sorted([
        *(("one", k) for k in ones), ("other", 0), ("twin", 0), ("twin", 1), ("two", 0),
        ("two", 1),
    ])  # fmt: skip
    assert "of every experiment, the headline's group's first 2" in unescape(
        (rounds_dir / "0/report/index.html").read_text()
    )
    again = subprocess.run([*cmd, "-n"], cwd=wd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, (
        again.stdout[-3000:] + again.stderr[-3000:]
    )


#: a baseline and six twins of identical settings (the tiny CNN on one thread, few
#: steps: a trial is mostly its process start): the headline must crown none, and no
#: twin may come out faster or slower (the looks and the K candidates counted). A
#: neighbour's load may slow a twin's first trial beyond far_stop (1.5x): it runs its
#: second trial (a CI run had three twins in a row at 0.64-0.71x, each then its last)
TWINS = 6
TWINS_STUDY = """
runtime: local
trials: 2
max_trials: 3
margin: 0.1
collectives: {variants: []}
defaults: {batch_size: 32, warmup_steps: 2, steps: 6, threads: 1, step_precision: null}
groups:
  twins:
    runs:
      - {id: baseline}
""" + "".join(f"      - {{id: twin{i}}}\n" for i in range(1, TWINS + 1))


def test_through_snakemake_six_twins_crown_none_and_none_is_faster_or_slower(
    upstream_env, upstream_calibration, tmp_path
):
    wd, _, proc = local_study(tmp_path / "wf", TWINS_STUDY, ENVS_ROOT, [upstream_calibration])
    table = pd.read_csv(wd / "results/comparisons.csv")
    pairs = table.drop_duplicates(["baseline", "experiment"])
    summary = pd.read_csv(wd / "results/summary.csv")
    why = f"{pairs.to_string()}\n{summary[['experiment', 'samples_per_s']]}"
    assert len(pairs[pairs["baseline"] == "baseline"]) == TWINS, why
    assert not pairs["verdict"].isin(["faster", "slower"]).any(), why
    assert not pairs["fdr_kept"].any(), why
    # the final report's intervals: the last of two looks, 4/5 of the 5 %
    assert pairs["confidence"].tolist() == pytest.approx([1 - 0.05 * 4 / 5] * len(pairs)), why
    page = (wd / "results/report/index.html").read_text()
    head = page[page.index('class="headline"') : page.index("<nav>")]
    # the fastest of the seven is "measured", not crowned: its interval over the six
    # candidates does not clear the margin (or the baseline itself is the fastest)
    assert "the fastest measured configuration" in head or '<b id="hl-best">baseline</b>' in head
    assert "counting that it was picked as the fastest" not in head, head
    # its runner-up is named where the two are not told apart
    if '<b id="hl-best">baseline</b>' not in head:
        assert 'id="hl-runner-up"' in head, head
