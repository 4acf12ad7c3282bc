"""The adaptive rounds' forecast (workflow_scripts/plan/forecast.py): which experiments
will likely go on, from the comparisons so far, checked against the rounds' own rule
(plan/rounds.py) and the report's own interval (report/uncertainty.py); no torch."""

from __future__ import annotations

import math

import numpy as np
import scipy.stats

from workflow_scripts.plan import forecast, rounds
from workflow_scripts.report import uncertainty

SETTINGS = {"trials": 2, "max_trials": 4, "futility": 0.1, "margin": 0.03}
#: the confidence of look 1 of 3 (rounds.spent), as a round-0 or round-1 report states it
LOOK1 = 1 - 0.05 * rounds.spent(1, 3)


def row(baseline, experiment, ratio, n, spread, df, **more):
    """A comparisons.csv row as the report writes it (its interval and verdict from
    the report's own functions)."""
    half = float(
        scipy.stats.t.ppf(0.5 + LOOK1 / 2, df) * spread * math.sqrt(2 / n) if df else math.nan
    )
    low, high = ratio * math.exp(-half), ratio * math.exp(half)
    return {
        "kind": "step", "baseline": baseline, "experiment": experiment, "ratio": ratio,
        "ci_low": low, "ci_high": high, "n_baseline": n, "n_experiment": n,
        "verdict": uncertainty.verdict(low, high, 0.03), "confidence": LOOK1,
        "margin": 0.03, "df": df, "spread": spread if df else math.nan, "headline": False,
        **more,
    }  # fmt: skip


def test_the_report_that_decides_a_round_is_its_own_forecast():
    """Round 1's report decides round 2: the forecast of round 2 from it is its
    decisions, the experiments ``rounds.continuing`` sends on (1) and the others (0)."""
    rows = [
        row("base", "close", 1.06, 2, 0.03, 10),  # undecided, decidable by 4 trials
        row("base", "far", 2.0, 2, 0.03, 10),  # faster: decided
        row("base", "hopeless", 1.0, 2, 0.10, 10),  # undecided, never decided by 4
    ]
    assert rows[0]["verdict"] == rows[2]["verdict"] == "undecided" != rows[1]["verdict"]
    named = ["base", "close", "far", "hopeless"]
    going = rounds.continuing(rows, named, SETTINGS, 1)
    assert going == ["base", "close"]
    chances = forecast.chances(rows, SETTINGS, 1, 2)
    assert chances == {e: float(e in going) for e in named}


def test_one_trial_each_forecasts_by_how_close_a_comparison_is_to_a_verdict():
    """After one trial each (round 0, no spread between trials yet: the run's measured
    one, or the assumed one), a comparison far beyond the margin is decided at two
    trials each and sends nothing on; one a few percent apart is not, and goes on;
    one with no difference and a wide spread can never be decided by the cap
    (futility) and goes on neither; a side that runs no more trials (stopped far)
    keeps its one trial."""
    rows = [
        row("base", "far", 2.5, 1, 0.03, 0),
        row("base", "close", 1.08, 1, 0.03, 0),
        row("twin", "twin2", 1.0, 1, 0.03, 0),
        row("seedA", "seedB", 1.05, 3, 0.03, 4),  # a measured spread: 3 % here
    ]
    chances = forecast.chances(rows, SETTINGS, 0, 2)
    assert chances["far"] == 0.0 and chances["close"] > 0.5, chances
    assert chances["base"] == chances["close"]  # an experiment: its likeliest comparison
    assert chances["twin"] == chances["twin2"] == 0.0, chances
    # a wider spread: one trial says less, the twins may yet differ, "far" is still far
    wide = forecast.chances([{**r, "spread": 0.10} for r in rows[:3]], SETTINGS, 0, 2)
    assert wide["far"] == 0.0 and 0.0 < wide["twin"] < 1.0, wide
    # the later round asks more of a comparison: fewer go on
    assert forecast.chances(rows, SETTINGS, 0, 3)["close"] <= chances["close"]
    # "far" stopped after one trial: its comparison's interval narrows only on one side
    running = {"base", "close", "twin", "twin2", "seedA", "seedB"}
    alone = forecast.chances(rows, SETTINGS, 0, 2, running=running)
    assert alone["far"] == 0.0 and alone["close"] == chances["close"]


def test_experiments_a_provisional_report_does_not_name_go_on_at_the_mean_chance():
    chance = {"a": 1.0, "b": 0.0}
    seconds = {"a": 30.0, "b": 10.0, "later": 20.0}
    # a and b named; "later" not yet (the provisional report covered one group)
    assert forecast.expected(chance, seconds, complete=False) == 30.0 + 0.75 * 20.0
    # a round's report names every experiment that may go on: the others do not
    assert forecast.expected(chance, seconds, complete=True) == 30.0


def test_a_round_runs_at_all_where_one_of_its_experiments_goes_on():
    """Its report is written only then: one minus the chance that none goes on, an
    experiment the report does not name at the mean chance of the candidates it names
    (none where the report named every experiment)."""
    chance = {"a": 0.5, "b": 0.2, "c": 0.0}
    assert forecast.runs_at_all(chance, ["a", "b", "c"], True) == 1 - 0.5 * 0.8
    assert forecast.runs_at_all(chance, ["c"], True) == 0.0
    assert forecast.runs_at_all(chance, ["a", "z"], True) == 0.5
    mean = (0.5 + 0.2) / 2  # of the candidates it names
    got = forecast.runs_at_all(chance, ["a", "b", "z"], False)
    assert math.isclose(got, 1 - 0.5 * 0.8 * (1 - mean))
    assert forecast.runs_at_all({}, ["a"], False) == 0.0


def test_the_forecast_is_calibrated_against_simulated_rounds():
    """Comparisons simulated trial by trial (log throughputs with 5 % noise, true
    differences from none to ±40 %): forecast after one trial each, then their second
    trials measured and judged by the report's own interval and the rounds' rule. The
    forecast's mean chance matches the share that went on, and the comparisons it gave
    a high chance went on far more often than those it gave a low one."""
    rng = np.random.default_rng(11)
    spread, df1 = 0.05, 6
    chances, went = [], []
    for i in range(300):
        true = rng.normal(0.0, 0.15)
        a = rng.normal(0.0, spread, 2)
        b = rng.normal(true, spread, 2)
        first = row("base", f"e{i}", math.exp(b[0] - a[0]), 1, spread, df1)
        chances.append(forecast.chances([first], SETTINGS, 0, 2)[f"e{i}"])
        ratio, low, high = uncertainty.interval(
            np.exp(a), np.exp(b), uncertainty.Spread(spread, df1 + 2), LOOK1
        )
        second = {**first, "ratio": ratio, "ci_low": low, "ci_high": high, "n_baseline": 2,
                  "n_experiment": 2, "df": df1 + 2,
                  "verdict": uncertainty.verdict(low, high, 0.03)}  # fmt: skip
        went.append(bool(rounds.continuing([second], ["base", f"e{i}"], SETTINGS, 1)))
    chances, went = np.array(chances), np.array(went)
    assert 0.1 < went.mean() < 0.9  # a mix: the check has something to say
    assert abs(chances.mean() - went.mean()) < 0.06, (chances.mean(), went.mean())
    high, low = went[chances >= 0.5].mean(), went[chances < 0.5].mean()
    assert high > 0.7 and low < 0.3, (high, low)
