"""The summary of records (workflow_scripts/summary/records.py): its measurement columns, noise
marking, spread/CV and the share of the ceiling, and how the report shows them (fast, no torch)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.fixture_records import write
from workflow_scripts import report
from workflow_scripts.summary import records as rec

REPO = Path(__file__).resolve().parents[1]


def trial(
    experiment,
    k=0,
    sps=10.0,
    fp32=100.0,
    bf16=40.0,
    threads=2,
    env="upstream",
    status="ok",
    precision="fp32",
    discarded=(),
    flops=1e9,
    ceiling=None,
    ceiling_dtype="fp32",
    **metrics,
):
    """A record as the launcher writes it (only the fields these tests need); with a
    ``ceiling`` (GFLOP/s), the calibrated ceiling and the run's % of it."""
    probe = None
    if fp32 is not None:
        probe = {
            "fp32_gflops": fp32,
            "bf16_gflops": bf16,
            "size": 1024,
            "threads": threads,
            "load_avg_before": [0.25, 0.5, 0.75],
            "seconds": 0.7,
        }
    m = {"samples_per_s": sps, "flops_per_sample": flops, **metrics} if sps is not None else {}
    if ceiling is not None and sps is not None:
        m.update(ceiling_gflops=ceiling, ceiling_dtype=ceiling_dtype)
        m["pct_of_peak"] = 100.0 * flops * sps / 1e9 / ceiling
    return {
        "experiment": experiment,
        "trial": k,
        "status": status,
        "spec": {
            "id": experiment,
            "group": "ladder",
            "backend": "eager",
            "env": env,
            "precision": precision,
            "batch_size": 16,
        },
        "metrics": m,
        "probe": probe,
        "attempts": 1 + len(discarded),
        "discarded_attempts": list(discarded),
        "provenance": {"compile_cache": {"dir": "/tmp/x", "fresh": True}},
    }


def frame(records, threshold=0.85):
    return rec.summary_frame(records, threshold).set_index(["experiment", "trial"])


# --------------------------------------------------------------------------- summary columns


def test_measurement_columns():
    r = trial("a", sps=20.0, fp32=100.0, bf16=40.0, flops=2e9, achieved_gflops=40.0, ceiling=100)
    row = rec.flatten(r)
    assert list(row) == rec.COLUMNS
    assert rec.COLUMNS[-2:] == ["error_type", "error"]
    assert row["probe_fp32_gflops"] == 100.0 and row["probe_bf16_gflops"] == 40.0
    assert row["probe_size"] == 1024 and row["probe_threads"] == 2
    assert row["load_avg_1m"] == 0.25
    assert row["attempts"] == 1 and row["discarded_attempts"] == 0
    assert row["flops_per_sample"] == 2e9
    assert row["achieved_gflops"] == 40.0 and row["pct_of_peak"] == 40.0
    assert row["ceiling_gflops"] == 100.0 and row["ceiling_dtype"] == "fp32"
    assert row["compile_cache_fresh"] is True
    assert row["noisy"] is False and row["noise_signal"] is None


def test_pct_of_peak_only_of_a_calibrated_ceiling():
    # no ceiling (a record from before the calibrated ceiling): achieved GFLOP/s, no %;
    # the trial's own noise probe (here 100 GFLOP/s) is never the denominator
    row = rec.flatten(trial("a", sps=20.0, fp32=100.0, bf16=50.0, flops=2e9))
    assert row["achieved_gflops"] == pytest.approx(40.0)  # 2e9 * 20 / 1e9
    assert math.isnan(row["pct_of_peak"]) and math.isnan(row["ceiling_gflops"])
    row = rec.flatten(trial("b", sps=20.0, fp32=100.0, flops=2e9, ceiling=160.0))
    assert row["pct_of_peak"] == pytest.approx(25.0)
    # above 100 % (here a disturbed probe would have said 114 GFLOP/s): an error, no number
    r = trial("c", sps=20.0, fp32=30.0, flops=2e9)
    r["metrics"].update(ceiling_gflops=35.0, pct_of_peak=114.3)
    row = rec.flatten(r)
    assert math.isnan(row["pct_of_peak"]) and "measurement error" in row["measurement_error"]
    row = rec.flatten(trial("d", fp32=None))
    assert math.isnan(row["pct_of_peak"]) and math.isnan(row["probe_fp32_gflops"])
    assert math.isnan(row["load_avg_1m"])


def test_a_share_of_the_ceiling_is_judged_against_the_machines_best_calibration():
    """Each environment's calibration measures the same CPUs: a run above its own
    environment's ceiling (one calibrated in a slower minute) but within another's is no
    measurement error; one above the best of them still is; a ceiling of another dtype,
    thread count or node type is not taken in."""

    def run(name, env, sps, ceiling, threads=2, dtype="bf16", cpu=None):
        r = trial(name, sps=sps, env=env, precision=dtype, flops=8e9, ceiling=ceiling,
                  ceiling_dtype=dtype)  # fmt: skip
        r["checks"] = {"threads": threads}
        if cpu:
            r["provenance"] |= {"cpu_model": cpu, "logical_cpus": 2}
        m = r["metrics"]
        if m["pct_of_peak"] > 100:  # as the trial policy writes it (trial.with_ceiling)
            pct = m.pop("pct_of_peak")
            m.update(pct_of_peak=None, pct_of_peak_measured=pct,
                     measurement_error=f"{pct:.0f}% of the calibrated ceiling")  # fmt: skip
        return r

    records = [
        run("slow-calibration", "upstream", 120.0, 850.0),  # 960 GFLOP/s: 113 % of 850
        run("other-env", "ipex", 100.0, 1000.0),
        run("above-both", "upstream", 130.0, 850.0),  # 1040: above 1000 too
        run("fp32", "upstream", 40.0, 400.0, dtype="fp32"),
        run("one-thread", "upstream", 55.0, 450.0, threads=1),
        run("other-node", "upstream", 80.0, 700.0, cpu="Another CPU"),
    ]
    f = frame(records).xs(0, level="trial")
    lifted = f.loc["slow-calibration"]
    assert lifted["ceiling_gflops"] == 1000.0 and lifted["pct_of_peak"] == pytest.approx(96.0)
    assert pd.isna(lifted["measurement_error"])
    above = f.loc["above-both"]
    assert math.isnan(above["pct_of_peak"]) and above["ceiling_gflops"] == 1000.0
    assert above["measurement_error"].startswith("104% of the calibrated ceiling (1000.0")
    assert "the machine's: the best of the study's calibrations" in above["measurement_error"]
    expected = {"other-env": (1000.0, 80.0), "fp32": (400.0, 80.0),
                "one-thread": (450.0, 440 / 4.5), "other-node": (700.0, 640 / 7)}  # fmt: skip
    for name, (ceiling, pct) in expected.items():
        assert f.loc[name, "ceiling_gflops"] == ceiling
        assert f.loc[name, "pct_of_peak"] == pytest.approx(pct)
        assert pd.isna(f.loc[name, "measurement_error"])


def test_truncation_and_within_trial_columns():
    r = trial("a", steps_timed=3, time_budget_hit=True)
    r["metrics"]["step_time_s"] = {"mean": 2.0, "stdev": 0.5, "median": 2.0}
    row = rec.flatten(r)
    assert row["steps_timed"] == 3 and row["time_budget_hit"] is True
    assert row["step_time_cv"] == pytest.approx(0.25)
    f = rec.summary_frame([r, trial("b")])
    assert f["steps_timed"].tolist()[0] == 3 and pd.isna(f["steps_timed"].tolist()[1])
    assert f["time_budget_hit"].tolist() == [True, None]


# --------------------------------------------------------------------------- noisy marking


def test_a_probe_is_noisy_as_an_outlier_among_its_peers():
    """The trial policy's rule (trial/peers.py), its peers every other ok trial measured
    the same way: below their median by more than their ordinary spread allows and by at
    least 1 - noise_threshold; with fewer than 4 peers, below half their median."""
    tight = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 101.0, 99.0, 100.0, 100.5, 99.5]
    wide = [60.0, 80.0, 100.0, 120.0, 140.0, 90.0, 110.0, 70.0, 130.0]
    records = [trial("tight", k, fp32=v) for k, v in enumerate(tight)]
    records += [
        trial("tight", 20, fp32=80.0),  # 0.80 x peers within 1 %: noisy
        trial("tight", 21, fp32=87.0),  # 0.87: a drop of less than 15 %, not noisy
    ]
    records += [trial("wide", k, fp32=v, threads=1) for k, v in enumerate(wide)]
    records += [
        trial("wide", 20, fp32=75.0, threads=1),  # 0.75 x, ordinary among peers this wide
        trial("wide", 21, fp32=40.0, threads=1),  # below half: noisy
    ]
    records += [
        trial("few", 0, fp32=100.0, env="ipex"),
        trial("few", 1, fp32=98.0, env="ipex"),
        trial("few", 2, fp32=70.0, env="ipex"),  # 3 peers: only below half of them
        trial("few", 3, fp32=45.0, env="ipex"),
    ]
    # a bf16 probe is not judged: on a Xeon with AMX they read 374-439 or 772-1186
    records.append(trial("tight", 22, fp32=100.0, bf16=15.0))
    f = frame(records)
    noisy = {k for k, v in f["noisy"].to_dict().items() if v}
    assert noisy == {("tight", 20), ("wide", 21), ("few", 3)}, f["noisy"]
    assert f["noisy"].dtype == bool
    assert f.loc[("tight", 20), "noise_signal"] == "peer probes"
    # the medians beside each probe: its group's, itself included
    assert (f.loc["tight", "probe_fp32_median_gflops"] == 100.0).all()
    assert (f.loc["few", "probe_fp32_median_gflops"] == 84.0).all()
    # a looser threshold marks fewer: 0.80 x is then no drop that matters
    assert ("tight", 20) not in {
        k for k, v in frame(records, threshold=0.75)["noisy"].to_dict().items() if v
    }


def test_only_ok_trials_with_a_probe_count_and_can_be_noisy():
    records = [
        trial("a", 0, fp32=100.0),
        trial("a", 1, fp32=100.0),
        trial("a", 2, fp32=10.0, status="failed", sps=None),  # not noisy: failed
        trial("a", 3, fp32=None),  # no probe (probe_size 0): not noisy
        trial("a", 4, fp32=40.0),
    ]
    f = frame(records)
    assert f["noisy"].tolist() == [False, False, False, False, True]
    assert f.loc[("a", 4), "probe_fp32_median_gflops"] == 100.0  # the failed 10 left out
    assert math.isnan(f.loc[("a", 2), "probe_fp32_median_gflops"])


def test_trials_are_compared_with_their_own_threads_and_environment():
    records = [
        trial("t2", 0, fp32=100.0, threads=2),
        trial("t2", 1, fp32=100.0, threads=2),
        trial("t1", 0, fp32=50.0, threads=1),  # half the rate on half the threads: fine
        trial("t1", 1, fp32=52.0, threads=1),
        trial("ipex", 0, fp32=70.0, env="ipex"),  # older torch: its own median
        trial("ipex", 1, fp32=72.0, env="ipex"),
    ]
    f = frame(records)
    assert not f["noisy"].any()
    assert f.loc[("t1", 0), "probe_fp32_median_gflops"] == 51.0
    assert f.loc[("ipex", 0), "probe_fp32_median_gflops"] == 71.0


def test_step_times_dispersed_beyond_the_experiments_other_trials():
    def cv(experiment, k, value):
        r = trial(experiment, k)
        r["metrics"]["step_time_s"] = {"mean": 1.0, "stdev": value}
        return r

    records = [
        cv("a", 0, 0.03),
        cv("a", 1, 0.45),  # the threads-t2: CV 45% beside a quiet 3%
        cv("a", 2, 0.04),
        cv("loader", 0, 0.30),  # a configuration whose steps always vary: not noisy
        cv("loader", 1, 0.35),
        cv("alone", 0, 0.50),  # no other trial to compare with: not judged here
    ]
    f = frame(records)
    assert f["noisy"].to_dict() == {
        ("a", 0): False,
        ("a", 1): True,
        ("a", 2): False,
        ("loader", 0): False,
        ("loader", 1): False,
        ("alone", 0): False,
    }
    assert f.loc[("a", 1), "noise_signal"] == "step times"


def test_the_trial_policys_own_signals_mark_noisy():
    r = trial("a", 0)
    r["noise_check"] = {"passed": False, "caught_by": ["other work during steps"]}
    passed = trial("a", 1)
    passed["noise_check"] = {"passed": True, "caught_by": []}
    f = frame([r, passed, trial("a", 2, fp32=40.0)])
    assert f["noise_signal"].tolist() == ["other work during steps", None, "peer probes"]
    assert f["noisy"].tolist() == [True, False, True]


def test_empty_and_probe_less_frames():
    assert rec.summary_frame([])["noisy"].tolist() == []
    f = rec.summary_frame([trial("a", fp32=None), {"status": "ok"}])
    assert f["noisy"].tolist() == [False, False]


# --------------------------------------------------------------------------- spread and CV


def test_spread_stats():
    s = report.stats.spread_stats(pd.Series([10.0, 12.0, 11.0]))
    assert (s["median"], s["min"], s["max"]) == (11.0, 10.0, 12.0)
    assert s["cv"] == pytest.approx(1.0 / 11.0)  # sample stdev 1, mean 11
    assert math.isnan(report.stats.spread_stats(pd.Series([5.0]))["cv"])
    assert math.isnan(report.stats.spread_stats(pd.Series([], dtype=float))["median"])


def test_experiment_stats_leave_noisy_trials_out():
    records = [
        trial("a", 0, sps=10.0, fp32=100.0),
        trial("a", 1, sps=12.0, fp32=100.0),
        trial("a", 2, sps=5.0, fp32=40.0),  # noisy: slow because disturbed
        trial("b", 0, sps=20.0, fp32=40.0, env="ipex"),
        trial("b", 1, sps=30.0, fp32=10.0, env="ipex"),  # noisy
    ]
    stats = report.stats.experiment_stats(rec.summary_frame(records)).set_index("experiment")
    a = stats.loc["a"]
    assert (a["n_trials"], a["n_ok"], a["n_noisy"], a["n_used"]) == (3, 3, 1, 2)
    assert (a["sps_median"], a["sps_min"], a["sps_max"]) == (11.0, 10.0, 12.0)
    assert a["sps_cv"] == pytest.approx(2**0.5 / 11.0)
    assert not a["noisy_used"]
    b = stats.loc["b"]
    assert (b["n_used"], b["sps_median"]) == (1, 20.0) and math.isnan(b["sps_cv"])
    assert report.formatting.trials_text(a) == "3/3 (1 noisy)"


def test_the_first_step_is_a_cold_compiles_even_where_later_trials_started_warm():
    """A later trial of a compiled run starts from its first trial's compile cache
    (trial/carry.py): the experiment's first step is its cold trials' (its throughput
    still every used trial's); with no cold trial left to use (trial 0 failed), the cold
    ok ones', else none."""

    def compiled(experiment, k, first_step, fresh, **kw):
        record = trial(experiment, k, time_to_first_step_s=first_step, **kw)
        record["provenance"]["compile_cache"] = {"dir": "/x", "fresh": fresh}
        return record

    records = [
        compiled("c", 0, 60.0, True, sps=10.0),
        compiled("c", 1, 8.0, False, sps=12.0),
        compiled("c", 2, 7.0, False, sps=11.0),
        compiled("w", 0, 60.0, True, status="failed", sps=None),
        compiled("w", 1, 8.0, False),
        trial("e", 0, time_to_first_step_s=2.0),
        trial("e", 1, time_to_first_step_s=3.0),
    ]
    stats = report.stats.experiment_stats(rec.summary_frame(records)).set_index("experiment")
    assert stats.loc["c", "time_to_first_step_s"] == 60.0
    assert stats.loc["c", "sps_median"] == 11.0 and stats.loc["c", "n_used"] == 3
    assert math.isnan(stats.loc["w", "time_to_first_step_s"])
    assert stats.loc["e", "time_to_first_step_s"] == 2.5


def test_all_noisy_trials_are_used_and_flagged():
    # both of x's trials are noisy: below half the median (100) of their three peers
    records = [
        trial("clean", 0, fp32=100.0),
        trial("clean", 1, fp32=100.0),
        trial("x", 0, sps=7.0, fp32=40.0),
        trial("x", 1, sps=9.0, fp32=45.0),
    ]
    stats = report.stats.experiment_stats(rec.summary_frame(records)).set_index("experiment")
    x = stats.loc["x"]
    assert x["noisy_used"] and x["n_noisy"] == 2 and x["n_used"] == 2
    assert x["sps_median"] == 8.0
    assert report.formatting.trials_text(x) == "2/2 (2 noisy, all used)"


def test_noisy_trials_that_outnumber_the_clean_ones_are_used():
    """Noisy trials are outliers while they are the fewer: where they outnumber an
    experiment's clean trials, the noise is the machine's, and all of its ok trials
    count (the few quiet ones would pick the figure by when they ran); as many noisy
    as clean: the clean ones."""
    records = [trial("clean", k, fp32=100.0) for k in range(3)]
    records += [
        trial("m", 0, sps=10.0, fp32=100.0),
        trial("m", 1, sps=6.0, fp32=50.0),  # noisy
        trial("m", 2, sps=8.0, fp32=50.0),  # noisy
        trial("t", 0, sps=10.0, fp32=100.0),
        trial("t", 1, sps=12.0, fp32=100.0),
        trial("t", 2, sps=5.0, fp32=50.0),  # noisy
        trial("t", 3, sps=7.0, fp32=50.0),  # noisy
    ]
    stats = report.stats.experiment_stats(rec.summary_frame(records)).set_index("experiment")
    m, t = stats.loc["m"], stats.loc["t"]
    assert (m["n_noisy"], m["n_used"], m["sps_median"]) == (2, 3, 8.0) and m["noisy_used"]
    assert sorted(m["sps_used"]) == [6.0, 8.0, 10.0]
    assert report.formatting.trials_text(m) == "3/3 (2 noisy, all used)"
    assert (t["n_noisy"], t["n_used"], t["sps_median"]) == (2, 2, 11.0)
    assert not t["noisy_used"] and report.formatting.trials_text(t) == "4/4 (2 noisy)"


# --------------------------------------------------------------------------- the report


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noise")
    discarded = [
        {
            "attempt": 1,
            "probe": {"fp32_gflops": 41.0, "bf16_gflops": 20.0},
            "samples_per_s": 4.0,
            "reason": "probe fp32 41.0 GFLOP/s = 0.41 x the reference 100.0 GFLOP/s",
        }
    ]
    records = [
        trial("baseline", 0, sps=10.0, fp32=100.0, flops=2e9, ceiling=100.0),
        trial("baseline", 1, sps=12.0, fp32=99.0, flops=2e9, discarded=discarded, ceiling=100.0),
        trial("baseline", 2, sps=6.0, fp32=45.0, flops=2e9, ceiling=100.0),  # noisy
        trial(
            "bf16", 0, sps=20.0, fp32=101.0, bf16=50.0, flops=2e9, precision="bf16", ceiling=101.0
        ),  # fmt: skip
    ]
    paths = write(tmp, records)
    out = report.build_report(
        rec.load_records(paths),
        report.Outputs(tmp / "summary.csv", tmp / "r" / "index.html", tmp / "r"),
    )
    return tmp, paths, out, (tmp / "r" / "index.html").read_text()


def test_report_noise_section(built):
    _, _, _, html = built
    noise = html[html.index('id="noise"') : html.index('id="other"')]
    assert "<b>1</b> of <b>4</b> ok trials" in noise
    assert "<b>1</b> attempt discarded and rerun by the trial policy" in noise
    assert "Attempts discarded by the trial policy" in noise and "launcher" not in noise
    assert "0.45" in noise  # the noisy trial's fp32 probe against the median (100)
    assert "0.41 x the reference 100.0 GFLOP/s" in noise
    assert "upstream/1024/2" in noise  # the comparison group
    # the ladder uses the clean trials: median 11 (10-12), CV 12.9%
    ladder = html[html.index('id="ladder"') : html.index('id="cost"')]
    assert "11.0 (10.0–12.0)" in ladder and "12.9%" in ladder and "3/3 (1 noisy)" in ladder


def test_report_ceiling(built):
    tmp, _, _, html = built
    section = html[html.index('id="ceiling"') : html.index('id="noise"')]
    # baseline: 2 GFLOP x 11 samples/s = 22 GFLOP/s = 22% of the fp32 ceiling (100)
    assert "22.0" in section
    # bf16 autocast: 40 GFLOP/s against the faster ceiling, here fp32 (101 > 50 bf16)
    assert "39.6" in section and "bf16" in section
    svg = (tmp / "r" / "ceiling.svg").read_text()
    assert "baseline (fp32)" in svg and "bf16 (fp32)" in svg and "40%" in svg
    summary = pd.read_csv(tmp / "summary.csv")
    cols = ["noisy", "probe_fp32_gflops", "probe_bf16_gflops", "load_avg_1m"]
    cols += ["flops_per_sample", "achieved_gflops", "pct_of_peak"]
    assert set(cols) <= set(summary.columns)
    assert summary["noisy"].tolist() == [False, False, True, False]
    assert summary["discarded_attempts"].tolist() == [0, 1, 0, 0]


def test_report_without_ceiling_data(tmp_path):
    out = report.build_report(
        [trial("a", flops=None)], report.Outputs(tmp_path / "s.csv", tmp_path / "i.html", tmp_path)
    )
    assert out["ok"] == 1
    svg = (tmp_path / "ceiling.svg").read_text()
    assert "no experiment with a FLOP count and a ceiling" in svg


def test_cli_noise_threshold(built, tmp_path):
    _, paths, _, _ = built
    cmd = [sys.executable, "-m", "workflow_scripts.report", "--records", *map(str, paths)]
    cmd += ["--summary", str(tmp_path / "s.csv"), "--html", str(tmp_path / "i.html")]
    cmd += ["--plots-dir", str(tmp_path), "--noise-threshold", "0.4"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not pd.read_csv(tmp_path / "s.csv")["noisy"].any()  # 45 >= 0.4 x 100
    assert "<b>0.4</b>" in (tmp_path / "i.html").read_text()
