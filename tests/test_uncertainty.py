"""Every comparison with its interval and a verdict (workflow_scripts/report/uncertainty.py,
comparisons.py): the pooled spread, the interval's arithmetic, the verdicts at their
margins, comparisons.csv and what the headline says, from fixture records (no torch;
through the real workflow: tests/test_uncertainty_slow.py)."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest
import scipy.stats

from tests.fixture_records import make, write
from workflow_scripts import metrics as rank_metrics
from workflow_scripts import report
from workflow_scripts.report import uncertainty
from workflow_scripts.report.stats import experiment_stats
from workflow_scripts.report.uncertainty import MARGIN, Spread, between, interval, verdict
from workflow_scripts.summary import records as rec


def stats_of(trials: dict[str, list[float]], **specs) -> pd.DataFrame:
    records = [
        make(exp, k, sps, **specs.get(exp, {}))
        for exp, values in trials.items()
        for k, sps in enumerate(values)
    ]
    frame = rec.summary_frame(records)
    return experiment_stats(report.stats.enrich(frame, records)).set_index("experiment", drop=False)


def test_the_spread_is_pooled_over_the_experiments_of_two_trials_or_more():
    runs = [[10.0, 11.0, 12.0], [20.0, 19.0], [5.0], []]
    spread = Spread.pooled(runs)
    logs = [[math.log(v) for v in r] for r in runs if len(r) > 1]
    ss = sum(statistics.variance(x) * (len(x) - 1) for x in logs)
    assert spread.df == 2 + 1
    assert spread.sd == pytest.approx(math.sqrt(ss / 3))
    # one trial each: no spread, no interval
    assert Spread.pooled([[1.0], [2.0]]).df == 0
    ratio, lo, hi = interval([10.0], [20.0], Spread.pooled([[1.0], [2.0]]))
    assert ratio == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)


def test_the_interval_is_students_t_on_the_mean_log_ratio():
    spread = Spread(0.05, 10)
    ratio, lo, hi = interval([10.0, 10.0], [12.0, 12.0, 12.0], spread)
    half = scipy.stats.t.ppf(0.975, 10) * 0.05 * math.sqrt(1 / 2 + 1 / 3)
    assert ratio == pytest.approx(1.2)
    assert (lo, hi) == pytest.approx((1.2 * math.exp(-half), 1.2 * math.exp(half)))
    # the statistic the interval bounds: the geometric means, not the medians
    assert interval([9.0, 10.0, 30.0], [20.0], spread)[0] == pytest.approx(
        20.0 / scipy.stats.gmean([9.0, 10.0, 30.0])
    )


def test_each_side_its_own_variance_and_welchs_degrees_of_freedom():
    """Two experiments of one kin (too few to fit a prior's degrees of freedom: their
    pool is the prior): each side's variance moderated towards it but never below its
    own; Welch's interval from the two, its degrees of freedom at most the kin's 5."""
    quiet, loud = [100.0, 101.0, 99.0, 100.5], [100.0, 120.0, 85.0]
    stats = stats_of({"quiet": quiet, "loud": loud})
    c = between(stats.loc["quiet"], stats.loc["loud"])
    va, vb = (statistics.variance([math.log(v) for v in x]) for x in (quiet, loud))
    pooled = (3 * va + 2 * vb) / 5
    # the loud side: its own (the moderated one would be below it); the quiet one: 5 + 3 df
    assert stats.loc["loud", "sps_var"] == pytest.approx(vb)
    assert stats.loc["quiet", "sps_var"] == pytest.approx((5 * pooled + 3 * va) / 8)
    qa, qb = stats.loc["quiet", "sps_var"] / 4, vb / 3
    df = (qa + qb) ** 2 / (qa**2 / 8 + qb**2 / 7)
    assert c.df == pytest.approx(min(df, 5), abs=0.05)
    d = math.log(scipy.stats.gmean(loud) / scipy.stats.gmean(quiet))
    half = scipy.stats.t.ppf(0.975, c.df) * math.sqrt(qa + qb)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.exp(d - half), math.exp(d + half)))


def test_alike_experiments_borrow_their_kins_pool_and_unlike_ones_their_own():
    """Twenty rungs of one kin varying alike: the prior is about their pool with many
    degrees of freedom; a twentieth-first member ten times noisier borrows nothing (an
    F test), and a quiet machine never narrows it."""
    rng = __import__("random").Random(7)
    alike = {f"rung{i}": [100 * math.exp(0.02 * rng.gauss(0, 1)) for _ in range(3)]
             for i in range(20)}  # fmt: skip
    loud = [100.0, 80.0, 125.0]
    stats = stats_of({**alike, "loud": loud})
    pool = Spread.pooled(alike.values())
    prior = uncertainty.Prior.fitted(uncertainty._own(v) for v in alike.values())
    # (a moment estimate from twenty variances of 2 df each: about, not exactly, the pool)
    assert prior.df > 4 and prior.var == pytest.approx(pool.sd**2, rel=0.3)
    loud_var = statistics.variance([math.log(v) for v in loud])
    assert (stats.loc["loud", "sps_var"], stats.loc["loud", "sps_var_df"]) == (
        pytest.approx(loud_var),
        2,
    )
    twin = between(stats.loc["rung0"], stats.loc["loud"])
    assert twin.verdict == "undecided" and twin.ci_low < 1.0 < twin.ci_high
    # a rung borrows beyond its own 2 df (less with the loud one in its kin: they
    # disagree, and the prior fitted over all of them says so)
    assert stats.loc["rung1", "sps_var_df"] > 2
    assert stats.loc["rung1", "sps_prior_df"] < prior.df


def test_a_kin_that_disagrees_beyond_sampling_lends_fewer_degrees_of_freedom():
    """limma's moment estimate: variances spread wider than their degrees of freedom
    explain make a prior of fewer degrees of freedom (an experiment's own trials count
    more); alike ones, the pool's."""
    rng = __import__("random").Random(3)
    sds = [0.01] * 12 + [0.08] * 12
    owns = [uncertainty._own([math.exp(s * rng.gauss(0, 1)) for _ in range(4)]) for s in sds]
    prior = uncertainty.Prior.fitted(owns)
    assert 0 < prior.df < sum(d for _, d in owns) / 2
    var, df = prior.moderated(*owns[0])
    assert df == prior.df + 3 and var >= owns[0][0]


def test_bartletts_p_value_is_scipys_on_the_logs():
    """The kin's test of one variance, from each member's variance and degrees of
    freedom, is Bartlett's as scipy computes it from the trials themselves."""
    runs = [[100.0, 104.0, 97.0], [80.0, 83.0], [120.0, 110.0, 131.0, 118.0], [90.0, 90.5]]
    owns = [uncertainty._own(r) for r in runs]
    logs = [[math.log(v) for v in r] for r in runs]
    assert uncertainty.bartlett(owns) == pytest.approx(scipy.stats.bartlett(*logs).pvalue)


#: six twins of one settings and their baseline, as the CI's real run measured them
#: (samples/s of the used trials; twin6's third trial left out as noisy): twin6's two
#: trials agreed by chance to 0.3 %
TWIN_TRIALS = {
    "baseline": [1512.68, 1439.37, 1450.94],
    "twin1": [1448.34, 1314.12],
    "twin2": [1271.60, 1431.14],
    "twin3": [1444.38, 1336.84],
    "twin4": [1407.06, 1336.82],
    "twin5": [1584.19, 1409.72, 1356.93],
    "twin6": [1195.85, 1199.72],
}


def test_a_kin_not_shown_unlike_lends_its_pool_whole_though_one_variance_is_near_zero():
    """A kin whose variances Bartlett's test does not tell apart lends its pool with all
    its degrees of freedom: one member's two trials that agree by chance do not pull
    the prior down (limma's moment estimate, fitted here, lent 1.6 degrees of freedom
    at half the pool, and called twin6 slower beyond the 10 % margin)."""
    owns = [uncertainty._own(v) for v in TWIN_TRIALS.values()]
    pool = Spread.pooled(TWIN_TRIALS.values())
    pooled, total = pool.sd**2, pool.df
    assert uncertainty.bartlett(owns) > uncertainty.ALIKE
    prior = uncertainty.Prior.fitted(owns)
    assert (prior.var, prior.df) == (pytest.approx(pooled), total)
    records = [make(e, k, v) for e, values in TWIN_TRIALS.items() for k, v in enumerate(values)]
    rich = report.stats.enrich(rec.summary_frame(records), records)
    stats = experiment_stats(rich, 0.1, 2).set_index("experiment", drop=False)
    twin6 = between(stats.loc["baseline"], stats.loc["twin6"])
    assert twin6.verdict == "undecided" and twin6.ci_high > 1 / 1.1, twin6
    # each side's variance is the pool's (its own 5e-6 moderated over 9 + 1 df)
    assert stats.loc["twin6", "sps_var"] == pytest.approx((total * pooled + owns[-1][0]) / 10)


def test_a_one_trial_member_of_a_kin_not_shown_unlike_borrows_its_whole_pool():
    """The default study's ResNet-50 bf16 training rungs (2026-12-05, under a
    neighbour's load): bf16's two trials agreed to 1 %, and limma's moment estimate
    lent the one-trial rungs 1.2 degrees of freedom (the headline's pick read
    [0.12–98.83]). Bartlett's test does not tell the kin's variances apart: the pool's
    10 degrees of freedom."""
    kin = {
        "ipex-optimize-bf16-cl": [16.94, 21.31],
        "runcpu-jemalloc": [16.19],
        "runcpu-tcmalloc": [17.78, 26.06, 24.43, 21.27],
        "inductor-bf16-cl": [13.22, 20.82, 20.09, 18.61],
        "bf16-cl": [16.06, 23.37, 16.44],
        "bf16": [17.26, 17.06],
        "ipex-compile-bf16": [22.59],
    }
    pool = Spread.pooled(kin.values())
    stats = stats_of(kin)
    one = stats.loc["ipex-compile-bf16"]
    assert (one["sps_var"], one["sps_var_df"]) == (pytest.approx(pool.sd**2), 10)
    assert pool.df == 10


def test_a_thin_kin_borrows_from_the_run_and_never_narrows_below_its_own():
    """Fewer than MIN_KIN_DF degrees of freedom in a kin: the run's prior (or the kin's
    own pool where that is wider), and a side's variance never below its own."""
    stats = stats_of(
        {
            "a": [100.0, 101.0, 99.0],
            "b": [100.0, 99.0, 101.0],
            "c": [50.0, 40.0],
            "d": [60.0, 61.0],
        },
        c={"threads": 1},
        d={"model": "cnn"},
    )
    own_c = uncertainty._own([50.0, 40.0])
    assert stats.loc["c", "sps_group"] == "(the run)"
    assert stats.loc["c", "sps_var"] >= own_c[0]
    assert stats.loc["d", "sps_var"] >= uncertainty._own([60.0, 61.0])[0]
    assert stats.loc["a", "sps_group"] == stats.loc["a", "sps_kin"]  # 4 df: its own kin
    c = between(stats.loc["a"], stats.loc["c"])
    # the degrees of freedom no more than the data hold: a's kin's 4 and the run's 6
    assert 0 < c.df <= 4 + 6


def test_each_look_spends_a_share_of_the_five_percent():
    """O'Brien-Fleming-like shares: strict early, most at the last, all of it in all."""
    shares = [uncertainty.spent(k, 3) for k in (1, 2, 3)]
    assert shares == pytest.approx([1 / 14, 4 / 14, 9 / 14]) and sum(shares) == pytest.approx(1)
    assert uncertainty.spent(1, 1) == 1.0
    trials = {"baseline": [100.0, 101.0, 99.0], "other": [104.0, 106.0, 105.0]}
    first, last = (stats_of_look(trials, 3, k) for k in (1, 3))
    early = between(first.loc["baseline"], first.loc["other"])
    late = between(last.loc["baseline"], last.loc["other"])
    assert early.confidence == pytest.approx(1 - 0.05 / 14)
    assert late.confidence == pytest.approx(1 - 0.05 * 9 / 14)
    assert early.ci_low < late.ci_low and early.ci_high > late.ci_high
    # the p-value of "beyond the margin" counts the look: below 0.05 iff faster/slower
    for c in (early, late):
        assert (c.p_value < 0.05) == (c.verdict in ("faster", "slower"))
    # the report's method names the looks, and with them the rounds' futility rule
    looked = uncertainty.method_text(Spread(0.05, 10), looks=3, alpha=0.05 * 9 / 14)
    assert "after 3 rounds" in looked and "<code>futility</code>" in looked
    assert "futility" not in uncertainty.method_text(Spread(0.05, 10))


def test_an_interval_beyond_the_float_range_is_infinite_not_a_crash():
    """Two trials against one, 1 degree of freedom, at the first of five looks (0.09 %
    of the 5 %): the t quantile is about 700 and the bound e^1000 or more."""
    frame = pd.DataFrame(
        {"experiment": ["baseline", "other"], "sps_used": [(10.0, 1000.0), (500.0,)]}
    )
    base, other = uncertainty.with_spread(frame, MARGIN, looks=5, look=1).to_dict("records")
    c = between(base, other)
    assert c.ci_high == math.inf and c.ci_low >= 0 and c.verdict == "undecided"
    assert c.qualifier() == "[<0.01–>99], undecided"


def stats_of_look(trials: dict[str, list[float]], looks: int, look: int) -> pd.DataFrame:
    records = [make(e, k, v) for e, values in trials.items() for k, v in enumerate(values)]
    frame = rec.summary_frame(records)
    rich = report.stats.enrich(frame, records)
    return experiment_stats(rich, MARGIN, looks, look).set_index("experiment", drop=False)


def test_benjamini_hochberg_keeps_the_differences_that_hold_over_the_table():
    def row(e, p, v):
        return {"baseline": "b", "experiment": e, "p_value": p, "verdict": v}

    frame = pd.DataFrame(
        [row("x", 0.001, "faster"), row("y", 0.03, "slower"), row("z", 0.04, "faster")]
        + [row(f"u{i}", 0.5, "undecided") for i in range(7)]
        + [row("x", 0.001, "faster")]  # stated twice (another kind): counted once
    )
    # 10 pairs: 0.001 <= 0.005 kept; 0.03 > 0.01 and 0.04 > 0.015: not
    assert uncertainty.fdr_kept(frame) == [True, False, False] + [False] * 7 + [True]


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.99, 1.01, "same"),
        (1 / (1 + MARGIN), 1 + MARGIN, "same"),
        (1.04, 1.10, "faster"),
        (0.80, 0.95, "slower"),
        (1.01, 1.05, "undecided"),  # beyond 1.0 but not clear of the margin
        (0.95, 1.20, "undecided"),
        (math.nan, math.nan, "undecided"),
    ],
)
def test_verdicts_at_the_margin(lo, hi, expected):
    assert verdict(lo, hi) == expected


def test_identical_settings_come_out_the_same_and_a_real_difference_slower():
    stats = stats_of(
        {
            "baseline": [100.0, 101.0, 99.0, 100.5],
            "twin": [99.5, 100.5, 100.0, 101.0],
            "one-thread": [55.0, 54.0, 56.0],
        },
        **{"one-thread": {"threads": 1}},
    )
    same = between(stats.loc["baseline"], stats.loc["twin"])
    assert same.verdict == "same" and same.ci_low < 1.0 < same.ci_high
    assert (same.n_baseline, same.n_experiment) == (4, 4)
    slower = between(stats.loc["baseline"], stats.loc["one-thread"])
    assert slower.verdict == "slower" and slower.ci_high < 1.0
    assert slower.text().startswith("0.55× ([0.") and slower.text().endswith("], slower)")


def test_the_margin_a_run_states_decides_its_verdicts_everywhere(tmp_path):
    """A 6 % difference at a spread of about 1 %: faster at the default ±3 %, the same
    within a stated ±10 %, and the report, the headline and comparisons.csv say which
    margin they used."""
    trials = {"baseline": [100.0, 101.0, 99.0, 100.5], "wider": [106.0, 107.0, 105.0, 106.5]}
    stats = stats_of(trials)
    assert between(stats.loc["baseline"], stats.loc["wider"]).verdict == "faster"
    records = [make(e, k, v, batch_size=32 if e == "wider" else 64)
               for e, values in trials.items() for k, v in enumerate(values)]  # fmt: skip
    paths = write(tmp_path, records)
    report.build_report(
        rec.load_records(paths),
        report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path),
        report.Options(margin=0.10),
    )
    table = pd.read_csv(tmp_path / "comparisons.csv")
    row = table.drop_duplicates("experiment").set_index("experiment").loc["wider"]
    assert row["verdict"] == "same" and row["margin"] == 0.10
    assert 1 / 1.1 <= row["ci_low"] < row["ci_high"] <= 1.1
    text = (tmp_path / "r/index.html").read_text()
    assert "the same within ±10 %" in text and "±3 %" not in text
    head = text[text.index('class="headline"') : text.index("<nav>")]
    assert "the same within ±10 %" in head


def test_noisy_trials_are_left_out_of_ratio_and_spread():
    records = [make("baseline", k, v) for k, v in enumerate([100.0, 100.0, 40.0])]
    records += [make("bf16", k, v, precision="bf16") for k, v in enumerate([150.0, 151.0])]
    for r in records:
        r["probe"] = {"fp32_gflops": 180.0, "bf16_gflops": 400.0, "size": 1024, "threads": 2}
    records[2]["probe"]["fp32_gflops"] = 40.0  # disturbed: the peers' probes say so
    frame = rec.summary_frame(records)
    stats = experiment_stats(report.stats.enrich(frame, records)).set_index(
        "experiment", drop=False
    )
    assert stats.loc["baseline", "sps_used"] == (100.0, 100.0)
    c = between(stats.loc["baseline"], stats.loc["bf16"])
    assert c.ratio == pytest.approx(math.sqrt(150.0 * 151.0) / 100.0) and c.verdict == "faster"


def test_the_headline_says_which_noisy_trials_were_left_out_and_which_used(tmp_path):
    """A noisy trial among clean ones is left out; where an experiment's noisy trials
    outnumber its clean ones they are used, and the headline counts each."""
    records = [make("baseline", k, v) for k, v in enumerate([100.0, 100.0, 40.0])]
    records += [make("bf16", k, v, precision="bf16") for k, v in enumerate([150.0, 90.0, 80.0])]
    for r in records:
        r["probe"] = {"fp32_gflops": 180.0, "bf16_gflops": 400.0, "size": 1024, "threads": 2}
    for r in (records[2], records[4], records[5]):  # disturbed: the peers' probes say so
        r["probe"]["fp32_gflops"] = 40.0
    paths = write(tmp_path, records)
    report.build_report(
        rec.load_records(paths),
        report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path),
    )
    text = (tmp_path / "r/index.html").read_text()
    head = text[text.index('class="headline"') : text.index("<nav>")]
    assert (
        '<b id="hl-noisy">3</b> trials flagged as disturbed, 1 left out of the medians, '
        "2 used where an experiment's noisy trials outnumber its clean ones" in head
    ), head
    assert "3/3 (1 noisy)<" in text and "3/3 (2 noisy, all used)" in text


def test_a_trial_knows_its_mean_step_time_within_students_t():
    """The within-trial stopping rule (workflow_scripts/metrics.py, no scipy there):
    the 95 % interval's half-width of the mean step time over the mean."""
    times = [1.00, 1.10, 0.95, 1.05, 0.98]
    expected = scipy.stats.t.ppf(0.975, 4) * statistics.stdev(times) / math.sqrt(5)
    assert rank_metrics.relative_half_width(times) == pytest.approx(
        expected / statistics.fmean(times), rel=1e-3
    )
    for df in (1, 7, 30):  # the table against scipy
        assert rank_metrics.T_975[df - 1] == pytest.approx(scipy.stats.t.ppf(0.975, df), abs=1e-3)
    assert math.isnan(rank_metrics.relative_half_width([1.0]))
    assert not rank_metrics.known_within([1.0, 1.0], 0.5)  # 3 timed steps at least
    assert rank_metrics.known_within([1.0, 1.0, 1.0], 0.01)
    assert not rank_metrics.known_within(times, 0.01) and rank_metrics.known_within(times, 0.1)
    assert not rank_metrics.known_within(times, None)


def headline_of(tmp_path, values: dict[str, list[float]], specs: dict) -> str:
    """The headline of a report built from one record per trial of ``values``."""
    records = [
        make(exp, k, sps, **specs.get(exp, {}))
        for exp, trials in values.items()
        for k, sps in enumerate(trials)
    ]
    report.build_report(
        rec.load_records(write(tmp_path, records)),
        report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path),
    )
    text = (tmp_path / "r/index.html").read_text()
    return text[text.index('class="headline"') : text.index("<nav>")]


def test_the_fastest_is_the_one_with_the_largest_stated_speedup(tmp_path):
    """Medians and geometric means can rank two runs differently (a run of 4 trials
    with one slow one against a steady run of 2): the headline's fastest, its runner-up
    and the family line all rank by the geometric mean the ratios and intervals rest on,
    so none names as the fastest a run whose stated speedup is below another's."""
    values = {
        "baseline": [10.0, 10.1, 9.9],
        "runcpu": [24.4, 26.1, 17.8, 21.3],  # median 22.85, geometric mean 22.2
        "bf16-cl": [22.5, 22.6],  # median and geometric mean 22.55
    }
    specs = {"runcpu": {"precision": "bf16", "launcher": "run_cpu"}}
    specs["bf16-cl"] = {"precision": "bf16", "channels_last": True}
    head = headline_of(tmp_path, values, specs)
    assert '<b id="hl-best">bf16-cl</b>' in head, head
    runner_up = head[head.index('<b id="hl-runner-up">runcpu</b>') :]
    assert float(runner_up[runner_up.index(", ") + 2 : runner_up.index("×")]) < 1.0
    assert "the fastest training run is <b>bf16-cl</b>" in head
    speedups = {
        line.split("<b>")[1].split("</b>")[0]: float(line.split("<b>")[2].split("×")[0])
        for line in head.split("the fastest training run is ")[1:]
    }
    stats = stats_of(values, **specs)
    assert speedups["bf16-cl"] == pytest.approx(
        between(stats.loc["baseline"], stats.loc["bf16-cl"]).ratio, abs=0.005
    )
    assert between(stats.loc["baseline"], stats.loc["runcpu"]).ratio < speedups["bf16-cl"]
    # the family's fastest is the fastest of its 2 candidates there too: its interval is
    # the headline's (simultaneous over both), not the pair's alone
    line = head[head.index("the fastest training run is <b>bf16-cl</b>") :]
    both = between(stats.loc["baseline"], stats.loc["bf16-cl"], candidates=2)
    alone = between(stats.loc["baseline"], stats.loc["bf16-cl"])
    assert both.ci_high - both.ci_low > alone.ci_high - alone.ci_low
    assert f"[{uncertainty.bounds_text(both.ci_low, both.ci_high)}; the fastest of 2]" in line


def test_an_undecided_pick_does_not_hide_a_runner_up_known_to_be_faster(tmp_path):
    """The fastest by its two far-apart trials is undecided against the baseline while a
    run of four steady trials is known to beat it (at the same confidence over the
    candidates): the headline says so, instead of "no configuration is known to beat
    the baseline"."""
    values = {"baseline": [10.0, 10.1, 9.9], "bf16": [30.0, 30.3, 29.8, 30.1]}
    values["cl"] = [21.0, 45.0]
    specs = {"bf16": {"precision": "bf16"}, "cl": {"precision": "bf16", "channels_last": True}}
    head = headline_of(tmp_path, values, specs)
    assert '<b id="hl-best">cl</b>' in head and '<b id="hl-verdict">undecided</b>' in head
    stats = stats_of(values, **specs)
    known = between(stats.loc["baseline"], stats.loc["bf16"], candidates=2)
    assert known.verdict == "faster"
    assert (
        f'but <b id="hl-known-faster">bf16</b> is known to beat the baseline: '
        f"{known.ratio:.2f}× [{uncertainty.bounds_text(known.ci_low, known.ci_high)}], "
        "faster at 95 % confidence over all 2 candidates)" in head
    ), head
    assert "no configuration is known to beat the baseline" not in head
    # comparisons.csv marks both pairs as the headline's: the rounds measure them on
    table = pd.read_csv(tmp_path / "comparisons.csv")
    stated = table[(table["kind"] == "baseline") & table["headline"]]
    assert set(stated["experiment"]) == {"cl", "bf16"}


def quick_like():
    """The quick preset's shape: one trial each; a DataLoader run 1.07x the baseline."""
    return [
        make("baseline", 0, 10.0),
        make("workers-nw0", 0, 10.7, group="num_workers", data="per_sample", num_workers=0),
        make("bf16", 0, 25.0, precision="bf16"),
    ]


def test_one_trial_each_decides_nothing_and_the_headline_crowns_nobody(tmp_path):
    records = rec.load_records(write(tmp_path, quick_like()))
    report.build_report(
        records, report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path)
    )
    text = (tmp_path / "r/index.html").read_text()
    head = text[text.index('class="headline"') : text.index("<nav>")]
    assert '<b id="hl-verdict">undecided</b> (one trial each: no interval)' in head
    assert "the fastest measured configuration of" in head
    assert "so no configuration is known to beat the baseline yet" in head
    assert '<b id="hl-decided">0</b> of' in head
    table = pd.read_csv(tmp_path / "comparisons.csv")
    assert set(table["verdict"]) == {"undecided"}
    assert table["ci_low"].isna().all()


def test_comparisons_csv_lists_what_the_report_states(tmp_path):
    records = [make("baseline", k, v) for k, v in enumerate([10.0, 10.05, 9.98])]
    records += [make("bf16", k, v, precision="bf16") for k, v in enumerate([20.0, 20.1])]
    records += [
        make("bf16-cl", k, v, precision="bf16", channels_last=True)
        for k, v in enumerate([20.05, 20.1])
    ]
    records += [make("resnet18", 0, 80.0, group="models", model="resnet18")]
    records = rec.load_records(write(tmp_path, records))
    report.build_report(
        records, report.Outputs(tmp_path / "s.csv", tmp_path / "r/index.html", tmp_path / "r")
    )
    table = pd.read_csv(tmp_path / "comparisons.csv")
    assert list(table.columns) == uncertainty.COLUMNS
    for column in ("kind", "baseline", "experiment", "ratio", "ci_low", "ci_high"):
        assert column in table
    steps = table[table["kind"] == "step"].set_index("experiment")
    assert steps.loc["bf16", "baseline"] == "baseline"
    assert steps.loc["bf16", "verdict"] == "faster"
    assert steps.loc["bf16-cl", "baseline"] == "bf16"
    assert steps.loc["bf16-cl", "verdict"] == "same"
    # (written through the formula guard: a leading + would start a spreadsheet formula)
    assert steps.loc["bf16-cl", "change"] == "'+ channels_last"
    assert (steps["n_baseline"] > 1).all() and (table["df"] == 2 + 1 + 1).all()
    # another model is never divided by the baseline
    assert not ((table["experiment"] == "resnet18") & (table["baseline"] == "baseline")).any()
    text = (tmp_path / "r/index.html").read_text()
    assert '<section id="comparisons">' in text
    head = text[text.index('class="headline"') : text.index("<nav>")]
    n = table.drop_duplicates(["baseline", "experiment"])
    decided = int((n["verdict"] != "undecided").sum())
    assert f'<b id="hl-decided">{decided}</b> of {len(n)} decided' in head
    assert '<b id="hl-verdict">faster</b> at 95 % confidence' in head


# --------------------------------------------------------------------------- many nodes


def stats_on_nodes(trials: dict[str, list[tuple[float, str]]]) -> pd.DataFrame:
    """Experiment statistics from trials (throughput, the node it ran on)."""
    records = []
    for exp, values in trials.items():
        for k, (sps, node) in enumerate(values):
            record = make(exp, k, sps)
            record["provenance"]["hostname"] = node
            records.append(record)
    frame = rec.summary_frame(records)
    return experiment_stats(report.stats.enrich(frame, records)).set_index("experiment", drop=False)


#: node b runs everything 20 % faster than node a; the experiments are otherwise equal
#: (a little noise between trials)
NOISE = (1.0, 1.01, 0.99, 1.005)


def test_the_node_to_node_spread_is_fitted_from_experiments_on_several_nodes():
    trials = {
        f"e{i}": [(100 * f * (1.2 if k % 2 else 1.0), "ab"[k % 2]) for k, f in enumerate(NOISE)]
        for i in range(6)
    }
    stats = stats_on_nodes(trials)
    assert stats["sps_nodes"].iloc[0] == ("a", "b", "a", "b")
    # two nodes 1.2x apart: effects of ± half the nodes' difference in mean log throughput
    # (log 1.2 and the noise each node's trials drew), their standard deviation on 1 df
    logs = [math.log(v * (1.2 if k % 2 else 1.0)) for k, v in enumerate(NOISE)]
    apart = statistics.fmean(logs[1::2]) - statistics.fmean(logs[0::2])
    assert stats["sps_node_df"].iloc[0] == 1
    assert math.sqrt(stats["sps_node_var"].iloc[0]) == pytest.approx(apart / math.sqrt(2))
    # blocked by node (each side half on a, half on b): nothing added, the same as one node
    blocked = between(stats.loc["e0"], stats.loc["e1"])
    assert blocked.node_spread == 0 and blocked.verdict != "faster"


def test_sides_on_different_nodes_carry_the_node_to_node_spread():
    """A twin whose trials all ran on the faster node: one machine's arithmetic would
    call it 1.2x faster; its interval carries the node-to-node spread and does not."""
    trials = {
        f"e{i}": [(100 * f * (1.2 if k % 2 else 1.0), "ab"[k % 2]) for k, f in enumerate(NOISE)]
        for i in range(6)
    }
    trials["base"] = [(100 * f, "a") for f in NOISE]
    trials["twin"] = [(120 * f, "b") for f in NOISE]
    stats = stats_on_nodes(trials)
    pair = between(stats.loc["base"], stats.loc["twin"])
    node_sd = math.sqrt(stats["sps_node_var"].iloc[0])
    assert pair.node_spread == pytest.approx(node_sd * math.sqrt(2))
    assert pair.ratio == pytest.approx(1.2, rel=0.01)
    assert pair.ci_low < 1.0 < pair.ci_high and pair.verdict == "undecided", pair
    # where no experiment ran on both nodes, node and experiment cannot be told apart:
    # the run's spread between trials stands in for the nodes' (never nothing)
    apart = stats_on_nodes({"base": trials["base"], "twin": trials["twin"]})
    assert apart["sps_node_var"].iloc[0] == pytest.approx(apart["sps_spread"].iloc[0] ** 2)
    assert between(apart.loc["base"], apart.loc["twin"]).node_spread > 0
    # one machine: no node term at all
    local = stats_of({"base": [100 * f for f in NOISE], "twin": [120 * f for f in NOISE]})
    alone = between(local.loc["base"], local.loc["twin"])
    assert alone.node_spread == 0 and alone.verdict == "faster"
    # and the report's method says so, with the run's node-to-node spread
    text = uncertainty.method_text(
        Spread(0.01, 20), nodes=uncertainty.node_spread_of(stats.iloc[0])
    )
    assert f"{100 * node_sd:.1f} % apart from node to node (1 degree of freedom)" in text
