"""Every comparison with its interval and a verdict, through the real workflow
(tests/test_uncertainty.py has the fast tests of workflow_scripts/report/uncertainty.py):
a twin of an experiment is not faster or slower, twice its threads is faster, and the
adaptive rounds run exactly what the last round left undecided; six twins crown
none."""

from __future__ import annotations

import json
import math
import subprocess

import pandas as pd
import pytest
import scipy.stats

from tests.conftest import ENVS_ROOT
from tests.runs import local_study
from workflow_scripts.plan import rounds

pytestmark = [pytest.mark.slow, pytest.mark.torch]


#: two experiments of identical settings and one of twice the threads, through the real
#: workflow (the quick preset's tiny CNN, at a batch that takes a while): two trials
#: each, then the adaptive rounds, up to MOST, where a comparison is still undecided.
#: The identical pair runs on one thread of the 2-vCPU machines this suite runs on: a
#: 2-thread trial shares both with everything else on the machine (snakemake itself, other
#: tenants), and its throughput varied by 10 % from one process to the next here and by
#: 19 % on a CI host, against 5 % for 1 thread (docs/measurement.md); on a 2-vCPU Xeon
#: VM with AMX the 1-thread trials varied by 15-17 % too. At such spreads "the same"
#: within a margin of ±10 % would take some 40 trials each: the twin is asked to be
#: no faster or slower (the same or undecided), twice the threads (1.3-1.9x) faster.
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
sweeps: []
defaults: {batch_size: 64, warmup_steps: 3, steps: 30, far_stop: 1.25, step_precision: null}
experiments:
  - {id: first, group: aa, threads: 1}
  - {id: twin, group: aa, threads: 1, far_stop: null}
  - {id: two-threads, group: aa, threads: 2}
""".replace("{most}", str(MOST))


def trials_of(wd, experiment: str) -> list[int]:
    folder = wd / "results/records" / experiment
    return sorted(int(p.stem.removeprefix("trial")) for p in folder.glob("trial*.json"))


def test_through_snakemake_a_twin_is_the_same_and_two_threads_faster(upstream_env, tmp_path):
    wd, cmd, proc = local_study(tmp_path / "wf", AA_STUDY, ENVS_ROOT)
    table = pd.read_csv(wd / "results/comparisons.csv")
    pairs = table.drop_duplicates(["baseline", "experiment"]).set_index("experiment")
    twin, two = pairs.loc["twin"], pairs.loc["two-threads"]
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
    assert two["baseline"] == "first" and two["verdict"] == "faster", two.to_dict()
    assert two["ci_low"] > 1.0 and two["change"] == "threads 1→2"
    # the adaptive rounds: another round runs exactly the experiments that the last
    # round's comparisons left undecided, up to MOST trials
    assert 1 <= len(trials_of(wd, "two-threads")) <= MOST, why
    ran = ["first", "twin", "two-threads"]
    for k in range(1, MOST - 1):
        decided_by = wd / f"results/rounds/{k}/comparisons.csv"
        going_on = [e for e in ran if k + 1 in trials_of(wd, e)]
        if not going_on:
            assert not decided_by.exists() or rounds.going_on(decided_by, ran) == []
            break
        # (and those of a comparison the headline states, not yet within ±10 %)
        pairs = rounds.undecided_pairs(decided_by) + rounds.wide_headline_pairs(decided_by)
        undecided = {e for pair in pairs for e in pair}
        assert going_on == [e for e in ran if e in undecided], (k, going_on, undecided)
        page = (wd / f"results/rounds/{k}/report/index.html").read_text()
        assert f"Provisional report: the first {k + 1} of 2 to {MOST} trials" in page
        assert len(pd.read_csv(wd / f"results/rounds/{k}/summary.csv")) == sum(
            len([t for t in trials_of(wd, e) if t <= k]) for e in ("first", "twin", "two-threads")
        )
        ran = going_on
    assert all(max(trials_of(wd, e)) <= MOST - 1 for e in ("first", "twin"))
    assert len(summary) == sum(len(trials_of(wd, e)) for e in ("first", "twin", "two-threads"))
    assert int(twin["n_experiment"]) <= len(trials_of(wd, "twin"))
    assert not (wd / f"results/rounds/{MOST - 1}").exists()
    # the first round's provisional report came before any second trial
    first_page = wd / "results/rounds/0/report/index.html"
    assert first_page.stat().st_mtime <= (wd / "results/records/first/trial1.json").stat().st_mtime
    # far from its baseline (2 threads of 1: 1.3-1.9x here, beyond 1.25), a trial stops
    # timing after its first timed steps, and its record says why and against what; one
    # whose slow steps kept its mean's interval from lying wholly beyond the factor (a
    # noisy VM: steps up to 2.4x its median) times all its steps, as the rule says
    first = json.loads((wd / "results/records/first/trial0.json").read_text())
    stopped = 0
    for k in trials_of(wd, "two-threads"):
        record = json.loads((wd / f"results/records/two-threads/trial{k}.json").read_text())
        m, far = record["metrics"], record["far_from"]
        assert far["baseline"] == "first" and far["factor"] == 1.25
        assert far["step_time_s"] == first["metrics"]["step_time_s"]["median"]
        if m["stop_reason"] == "far_from_baseline":
            assert 2 <= m["steps_timed"] < 30, m
            stopped += 1
        else:
            assert m["stop_reason"] == "steps" and m["steps_timed"] == 30, m
            slowest = m["step_time_s"]["mean"] * (1 + m["step_time_half_width"])
            assert far["step_time_s"] / slowest < 1.25 * 1.02, m
    assert stopped >= len(trials_of(wd, "two-threads")) / 2
    assert "far_from" not in json.loads((wd / "results/records/first/trial0.json").read_text())
    # nothing changed: a second run does nothing, the adaptive rounds included
    again = subprocess.run([*cmd, "-n"], cwd=wd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, (
        again.stdout[-3000:] + again.stderr[-3000:]
    )


#: one thread against two, its far stop (1.25x) beyond the margin (±10 %): a first trial
#: that stops far slower than its baseline is its last, while the baseline runs its two
FAR_STUDY = """
runtime: local
trials: 2
max_trials: null
margin: 0.1
collectives: {variants: []}
sweeps: []
defaults: {batch_size: 64, warmup_steps: 3, steps: 30, far_stop: 1.25, step_precision: null}
experiments:
  - {id: two, group: far, threads: 2}
  - {id: one, group: far, threads: 1}
"""


def test_through_snakemake_a_first_trial_far_from_its_baseline_is_its_last(upstream_env, tmp_path):
    wd, cmd, proc = local_study(tmp_path / "wf", FAR_STUDY, ENVS_ROOT)
    one = json.loads((wd / "results/records/one/trial0.json").read_text())
    why = f"{one['metrics']}\n{proc.stderr[-3000:]}"
    # (1 thread of 2: 1.5-1.8x slower on the 2-vCPU machines this suite runs on)
    assert one["metrics"]["stop_reason"] == "far_from_baseline", why
    assert one["far_from"]["baseline"] == "two" and 1 <= one["metrics"]["steps_timed"] < 30
    assert trials_of(wd, "one") == [0] and trials_of(wd, "two") == [0, 1], why
    table = pd.read_csv(wd / "results/comparisons.csv")
    pair = table[(table["baseline"] == "two") & (table["experiment"] == "one")].iloc[0]
    summary = pd.read_csv(wd / "results/summary.csv")
    assert len(summary) == 3
    # "two" rests on its 2 trials but one the noise check flagged (this shared machine
    # flags one now and then: the study uses the clean ones, all where the flagged are
    # the more), "one" on its one
    noisy = summary.loc[summary["experiment"] == "two", "noisy"].astype(bool)
    used = 2 if noisy.sum() > (~noisy).sum() else int((~noisy).sum())
    assert (pair["n_baseline"], pair["n_experiment"]) == (used, 1), summary.to_string()
    assert pair["ratio"] < 1 / 1.25
    # the second round waited for the first's report (a checkpoint), then ran only "two"
    first_page = wd / "results/rounds/0/report/index.html"
    assert first_page.stat().st_mtime <= (wd / "results/records/two/trial1.json").stat().st_mtime
    again = subprocess.run([*cmd, "-n"], cwd=wd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, (
        again.stdout[-3000:] + again.stderr[-3000:]
    )


#: a baseline and six twins of identical settings (the tiny CNN on one thread, few
#: steps: a trial is mostly its process start): the headline must crown none, and no
#: twin may come out faster or slower (the looks and the K candidates counted)
TWINS = 6
TWINS_STUDY = """
runtime: local
trials: 2
max_trials: 3
margin: 0.1
collectives: {variants: []}
sweeps: []
defaults: {batch_size: 32, warmup_steps: 2, steps: 6, threads: 1, step_precision: null}
experiments:
  - {id: baseline, group: twins}
""" + "".join(f"  - {{id: twin{i}, group: twins}}\n" for i in range(1, TWINS + 1))


def test_through_snakemake_six_twins_crown_none_and_none_is_faster_or_slower(
    upstream_env, tmp_path
):
    wd, _, proc = local_study(tmp_path / "wf", TWINS_STUDY, ENVS_ROOT)
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
