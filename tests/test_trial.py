"""The trial policy's noise reruns, compile caches and the calibration, with a fake backend
python.

The fake ``python`` is a real executable the trial runs as a subprocess, as it
runs a backend environment's interpreter; it writes the result a harness would,
with the probe rates of a plan, one entry per attempt. Fast: no torch.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.trials import policy
from workflow_scripts import calibration, trial
from workflow_scripts.calibration import clean_calibration
from workflow_scripts.rank import contention, probe
from workflow_scripts.trial import peers

FAKE_HARNESS = """#!{python}
import json, os, sys
from pathlib import Path

here = Path(__file__).parent
plan = json.loads((here / "plan.json").read_text())
counter = here / "count"
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
step = plan[min(n, len(plan) - 1)]
cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
found = sorted(os.listdir(cache)) if cache and os.path.isdir(cache) else []
if cache and os.path.isdir(cache):  # what a compile leaves there
    Path(cache, f"graph-{{n}}").write_text("compiled")
result = {{
    "status": step.get("status", "ok"),
    "error": None,
    "metrics": {{
        "samples_per_s": step.get("sps", 10.0),
        "step_time_s": {{"median": 0.4}},
        "time_to_first_step_s": 0.5,
        "peak_rss_mb": 100.0,
        "achieved_gflops": step.get("achieved", 20.0),
    }},
    "probe": {{
        "fp32_gflops": step["fp32"],
        "bf16_gflops": step.get("bf16", 40.0),
        "size": step.get("size", 1024),
        "threads": step.get("threads", 2),
        "load_avg_before": [0.5, 0.4, 0.3],
        "seconds": 0.7,
    }},
    "provenance": {{
        "env": {{"TORCHINDUCTOR_CACHE_DIR": cache,
                 "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")}},
        "cache_existed": bool(cache and os.path.isdir(cache)),
        "cache_found": found,
    }},
}}
spec = json.loads(sys.argv[sys.argv.index("--spec-json") + 1])
with open(here / "floors.jsonl", "a") as f:  # the probe floors each attempt was given
    f.write(json.dumps(spec.get("probe_floors")) + "\\n")
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.write_text(json.dumps(result))
"""

FAKE_PROBE = """#!{python}
import json, sys
from pathlib import Path

assert sys.argv[1:5] == ["-u", "-m", "workflow_scripts.rank.probe", "--calibrate"], sys.argv
out = Path(sys.argv[sys.argv.index("--out") + 1])
threads = sys.argv[sys.argv.index("--threads") + 1]
entries = [{{"size": 1024, "threads": t, "fp32_gflops": 50.0 * t, "bf16_gflops": 20.0 * t,
             "runs": []}} for t in (1, 2)]
out.write_text(json.dumps({{"kind": "calibration", "size": 1024, "threads": 2,
                            "fp32_gflops": 100.0, "bf16_gflops": 40.0, "entries": entries,
                            "asked_threads": threads,
                            "asked_imports": sys.argv[sys.argv.index("--imports") + 1]}}))
"""

REFERENCE = {
    "kind": "calibration",
    "size": 1024,
    "threads": 2,
    "fp32_gflops": 100.0,
    "bf16_gflops": 40.0,
    "entries": [
        {"size": 1024, "threads": 1, "fp32_gflops": 52.0, "bf16_gflops": 21.0},
        {"size": 1024, "threads": 2, "fp32_gflops": 100.0, "bf16_gflops": 40.0},
    ],
}


def fake_env(tmp_path: Path, script: str, plan: list[dict] | None = None) -> dict:
    folder = tmp_path / "fakeenv"
    folder.mkdir(exist_ok=True)
    python = folder / "python"
    python.write_text(script.format(python=sys.executable))
    python.chmod(0o755)
    if plan is not None:
        (folder / "plan.json").write_text(json.dumps(plan))
    return {"name": "fake", "prefix": str(folder), "python": str(python)}


def attempts_run(env: dict) -> int:
    return int((Path(env["prefix"]) / "count").read_text())


def run(tmp_path, spec, plan, trial_index=0, **kwargs) -> tuple[dict, dict]:
    env = fake_env(tmp_path, FAKE_HARNESS, plan)
    out = tmp_path / "records" / "t" / f"trial{trial_index}.json"
    kwargs["index"] = trial_index
    kwargs.setdefault("retry_delay_s", 0)
    record = policy(spec, env, out, tmp_path / "logs" / "t.log", **kwargs)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record, default=str))
    assert not out.with_name(f"trial{trial_index}.harness.json").exists()
    return record, env


@pytest.fixture(autouse=True)
def no_inherited_caches(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)


# --------------------------------------------------------------------------- noise reruns


def seed_peers(tmp_path, rates, env="upstream", threads=2, size=1024) -> Path:
    """Earlier trials' probes in the study's probe log (other experiments than ``t``)."""
    from workflow_scripts import sysinfo

    log = peers.log_path(tmp_path / "records" / "t" / "trial0.json", env)
    for i, rate in enumerate(rates):
        peers.append(log, {"size": size, "threads": threads, "world": 1,
                           "node": sysinfo.node_type(), "before": rate, "after": rate,
                           "experiment": f"peer{i}", "trial": 0, "attempt": 1})  # fmt: skip
    return log


def test_noisy_attempts_are_rerun_until_the_probe_is_clean(make_spec, tmp_path):
    # six earlier trials read 98-102: the ordinary level is 100 and a drop below 0.85 of
    # it is an outlier among them
    seed_peers(tmp_path, [98.0, 100.0, 102.0, 99.0, 101.0, 100.0], make_spec()["env"])
    plan = [{"fp32": 50.0, "sps": 5.0}, {"fp32": 80.0, "sps": 8.0}, {"fp32": 95.0, "sps": 10.0}]
    record, env = run(tmp_path, make_spec(), plan, reference=REFERENCE, max_retries=2)
    assert attempts_run(env) == 3
    assert record["attempts"] == 3
    assert record["status"] == "ok"
    assert record["probe"]["fp32_gflops"] == 95.0
    assert record["metrics"]["samples_per_s"] == 10.0  # the kept attempt's measurement
    discarded = record["discarded_attempts"]
    assert [d["attempt"] for d in discarded] == [1, 2]
    assert [d["probe"]["fp32_gflops"] for d in discarded] == [50.0, 80.0]
    assert [d["samples_per_s"] for d in discarded] == [5.0, 8.0]
    assert "0.50 x the median 100.0 GFLOP/s of 6 peer probes" in discarded[0]["reason"]
    # six peers within 2 %: 0.80 of them is beyond what so few allow (0.82)
    limit = peers.bound(peers.ordinary([98.0, 100.0, 102.0, 99.0, 101.0, 100.0]), 0.85)
    assert 0.8 < limit < 0.85 and f"below {limit:.2f}" in discarded[1]["reason"]
    check = record["noise_check"]
    assert check["passed"] is True and check["ratio"] == pytest.approx(0.95)
    assert check["reference_fp32_gflops"] == pytest.approx(100.0) and check["basis"] == "peers"
    assert record["retry_wall_s"] > 0 and record["retry_wall_s"] < record["trial_wall_s"]
    log = (tmp_path / "logs" / "t.log").read_text()
    assert log.count("discarded") == 2 and log.count("$ ") == 3
    line = trial.progress_line(record)
    assert "probe 95 GFLOP/s fp32" in line and "2 discarded as noisy" in line


def floors_given(env: dict) -> list:
    """The probe floors the fake harness was given, one per attempt."""
    text = (Path(env["prefix"]) / "floors.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_each_attempt_is_given_the_floor_its_probe_before_the_steps_is_judged_by(
    make_spec, tmp_path
):
    # peers at 100 (2 threads) and 50 (1 thread): each attempt is told, per thread count,
    # the rate below which its probe before the steps was disturbed, the same bound the
    # noise check applies after it (0.85 of the level where the peers agree; 6 peers
    # within 2 % allow a little more), to probe again below it
    spec = make_spec()
    rates = [98.0, 100.0, 102.0, 99.0, 101.0, 100.0]
    seed_peers(tmp_path, rates, spec["env"])
    seed_peers(tmp_path, [50.0] * 4, spec["env"], threads=1)
    seed_peers(tmp_path, [10.0] * 9, spec["env"], size=256)  # another probe size: not its
    plan = [{"fp32": 50.0}, {"fp32": 100.0}]
    record, env = run(tmp_path, spec, plan, reference=REFERENCE, max_retries=2)
    first, second = floors_given(env)
    six = 100.0 * peers.bound(peers.ordinary(rates), 0.85)
    assert 80.0 < six < 85.0
    assert first == {"2": pytest.approx(six), "1": pytest.approx(42.5)}, first
    # the second attempt: the first's probe (50 at 2 threads) is its own trial's, not a peer
    assert second == first
    assert "probe_floors" not in record["spec"]  # the record's spec is the experiment's
    # where disturbed attempts are not run again, nothing is probed again either
    (Path(env["prefix"]) / "floors.jsonl").unlink()
    (tmp_path / "records" / "t" / "trial0.json").unlink()
    run(tmp_path, spec, plan, reference=REFERENCE, max_retries=0)
    assert floors_given(env) == [None]


def test_peer_floors_per_thread_count():
    lines = [{"size": 1024, "threads": 2, "world": 1, "node": "n", "before": r,
              "experiment": f"p{i}", "trial": 0} for i, r in enumerate([100.0] * 4)]  # fmt: skip
    lines += [{"size": 1024, "threads": 4, "world": 1, "node": "n", "before": 200.0,
               "experiment": "few", "trial": 0}]  # fmt: skip
    lines += [{"size": 1024, "threads": 2, "world": 2, "node": "n", "before": 10.0,
               "experiment": f"r{i}", "trial": 0} for i in range(5)]  # fmt: skip
    assert peers.floors(lines, 1024, "n", ("x", 0), 0.85) == {"2": pytest.approx(85.0)}
    # its own trial's probes are no peers of its own; too few: no floor
    assert peers.floors(lines, 1024, "n", ("p0", 0), 0.85) == {}
    assert peers.floors(lines, 0, "n", ("x", 0), 0.85) == {}  # no probe
    assert peers.floors(lines, 1024, "other node", ("x", 0), 0.85) == {}


def test_a_probe_is_judged_by_the_ordinary_spread_of_its_peers(make_spec, tmp_path):
    # peers that stray by about 10 % (a VM's ordinary moments): 0.75 of their median is
    # one of them, not a disturbance; below half of it is (9 peers so spread allow
    # down to 0.35 by their spread alone: a halving is one all the same)
    rates = [100.0, 88.0, 112.0, 95.0, 105.0, 80.0, 120.0, 92.0, 108.0]
    seed_peers(tmp_path, rates, make_spec()["env"])
    record, env = run(tmp_path, make_spec(), [{"fp32": 75.0}], reference=REFERENCE)
    check = record["noise_check"]
    assert record["attempts"] == 1 and check["passed"] is True and check["basis"] == "peers"
    assert check["signals"][0]["threshold"] < 0.75 < 0.85
    assert record["retry_wall_s"] == 0
    (Path(env["prefix"]) / "count").unlink()
    (tmp_path / "records" / "t" / "trial0.json").unlink()
    record, _ = run(tmp_path, make_spec(), [{"fp32": 48.0}, {"fp32": 100.0}], reference=REFERENCE)
    assert record["attempts"] == 2


def test_before_there_are_peers_only_a_halved_probe_is_disturbed(make_spec, tmp_path):
    # a trial's probe reads lower than the calibration's as a rule (0.64-0.82 on a quiet
    # 2-vCPU VM): with no peers yet, 0.7 of the reference runs once, 0.4 again
    record, env = run(tmp_path, make_spec(), [{"fp32": 70.0}], reference=REFERENCE)
    assert record["attempts"] == 1 and record["noise_check"]["basis"] == "calibration"
    assert record["noise_check"]["passed"] is True
    (Path(env["prefix"]) / "count").unlink()
    record, _ = run(tmp_path, make_spec(), [{"fp32": 40.0}, {"fp32": 75.0}], reference=REFERENCE)
    assert record["attempts"] == 2
    assert "0.40 x the reference 100.0" in record["discarded_attempts"][0]["reason"]
    # every attempt went into the probe log; a trial's own lines are not its peers
    lines = peers.read(peers.log_path(tmp_path / "records" / "t" / "trial0.json",
                                      make_spec()["env"]))  # fmt: skip
    assert [x["before"] for x in lines] == [70.0, 40.0, 75.0]
    assert {(x["experiment"], x["attempt"]) for x in lines} == {
        (make_spec()["id"], 1),
        (make_spec()["id"], 2),
    }
    kind = {k: lines[0][k] for k in ("size", "threads", "world", "node")}
    assert peers.peer_rates(lines, kind, "before", (make_spec()["id"], 0)) == []


def test_the_ordinary_level_of_a_kind_of_probe():
    assert peers.ordinary([100.0, 100.0, 100.0]) is None  # too few peers
    level = peers.ordinary([100.0, 100.0, 100.0, 100.0, 1.0])
    assert level["level"] == 100.0 and level["spread"] == peers.SPREAD_FLOOR
    assert peers.bound(level, 0.85) == 0.85  # a quiet machine: the setting decides
    wide = peers.ordinary([100.0, 90.0, 110.0, 80.0, 120.0])
    assert wide["spread"] > 0.1 and peers.bound(wide, 0.85) < 0.75
    assert peers.bound(None, 0.85) == peers.COLD_START
    assert peers.bound(None, 0.3) == 0.3  # a looser setting stays looser


def test_an_ordinary_probe_is_called_disturbed_as_rarely_with_few_peers_as_with_many():
    """A probe as ordinary as its peers (all log-normal at a 12 % spread) is called an
    outlier about as rarely with 4 peers as with 40: the widened reach of few peers
    (peers.outlier_k) takes the uncertainty of their median and spread in. Three spreads
    of 4 peers, as before, called one in 25 of them disturbed."""
    import random

    rng = random.Random(59)
    draws = 10_000
    for n in (4, 5, 8, 16, 40):
        called = called_at_three = 0
        for _ in range(draws):
            rates = [100 * math.exp(rng.gauss(0, 0.12)) for _ in range(n + 1)]
            level = peers.ordinary(rates[:n])
            called += rates[n] < level["level"] * peers.bound(level, 1.0)
            called_at_three += rates[n] < level["level"] * math.exp(-3 * level["spread"])
        assert called / draws < 0.005, (n, called)  # the normal tail's 0.135 %, give or take
        if n == 4:
            assert called_at_three / draws > 0.02, called_at_three
    assert peers.outlier_k(4) > peers.outlier_k(16) > peers.outlier_k(40) > peers.OUTLIER_K
    assert peers.outlier_k(peers.FEW_PEERS) < peers.FEW_K[peers.FEW_PEERS - 1]


def test_a_probe_within_what_its_few_peers_read_is_not_an_outlier():
    """A 2-vCPU Xeon with AMX (the default study, 2026-12-05): the probe after the steps
    of a compiled trial read 260.1 GFLOP/s, 0.82x the median of its 4 peers (318.4,
    318.3, 240.8, 326.1: a robust spread of 1.8 %, three of four agreeing by chance),
    and the attempt, 98 s with its compile, was run again; that environment's later
    probes after the steps read 238-328. Now the 4 peers' spread is widened for their
    number, and the probe is ordinary; a halved one is still disturbed."""
    level = peers.ordinary([318.3847, 318.3208, 240.788, 326.0776])
    assert level["peers"] == 4 and level["spread"] == peers.SPREAD_FLOOR
    assert 260.0572 / level["level"] < 0.85  # what the fixed three spreads called disturbed
    limit = peers.bound(level, 0.85)
    assert 260.0572 >= level["level"] * limit
    assert level["level"] * 0.49 < level["level"] * limit  # half of it is still a disturbance
    # close agreement among many is a narrow band all the same
    many = peers.ordinary([300.0 + (i % 5) for i in range(60)])
    assert peers.bound(many, 0.85) == 0.85


def test_a_torn_or_foreign_line_in_the_probe_log_is_skipped(tmp_path):
    log = tmp_path / "probes" / "e.jsonl"
    log.parent.mkdir()
    log.write_text('{"before": 1.0}\n[1, 2]\n{"bef\nnot json\n')
    assert peers.read(log) == [{"before": 1.0}]
    assert peers.read(tmp_path / "nothing.jsonl") == []


def test_retries_are_bounded(make_spec, tmp_path):
    record, env = run(tmp_path, make_spec(), [{"fp32": 10.0}], reference=REFERENCE, max_retries=2)
    assert attempts_run(env) == 3 == record["attempts"]
    assert len(record["discarded_attempts"]) == 2
    assert record["noise_check"]["passed"] is False  # the last attempt is kept, flagged
    assert "still disturbed: probe before steps" in trial.progress_line(record)


def test_a_disturbance_that_outlasts_a_trial_withholds_the_next_trials_reruns(make_spec, tmp_path):
    """Where the trial before it on this host ended disturbed after its own reruns, a
    disturbed attempt is kept, flagged, not run again (the machine is disturbed for now:
    a whole default study once ran ten trials three times each under a neighbour's load,
    nine third attempts disturbed all the same); the streak lasts while trials end
    disturbed, and a trial that runs clean ends it."""
    spec = make_spec()
    seed_peers(tmp_path, [98.0, 100.0, 102.0, 99.0, 101.0, 100.0], spec["env"])

    def again(plan, index):
        env_count = tmp_path / "fakeenv" / "count"
        env_count.unlink(missing_ok=True)
        return run(tmp_path, spec, plan, trial_index=index, reference=REFERENCE,
                   max_retries=2)[0]  # fmt: skip

    first = again([{"fp32": 10.0}], 0)
    assert first["attempts"] == 3 and first["noise_check"]["passed"] is False
    assert "rerun_withheld" not in first["noise_check"]  # nothing before it
    second = again([{"fp32": 10.0}, {"fp32": 95.0}], 1)
    assert second["attempts"] == 1 and second["discarded_attempts"] == []
    assert second["noise_check"]["passed"] is False and second["retry_wall_s"] == 0
    why = second["noise_check"]["rerun_withheld"]
    assert f"({spec['id']}, trial 0) ended disturbed, after 3 attempts" in why
    assert "no noise rerun: the trial before it" in (tmp_path / "logs" / "t.log").read_text()
    third = again([{"fp32": 10.0}, {"fp32": 95.0}], 2)  # the streak goes on
    assert (
        third["attempts"] == 1
        and "its reruns withheld too" in third["noise_check"]["rerun_withheld"]
    )
    clean = again([{"fp32": 96.0}], 3)  # a clean trial ends it
    assert clean["attempts"] == 1 and clean["noise_check"]["passed"] is True
    after = again([{"fp32": 10.0}, {"fp32": 95.0}], 4)
    assert after["attempts"] == 2 and "rerun_withheld" not in after["noise_check"]
    # only a recent end counts: one from before STREAK_S is another moment's
    last = peers.last_trial_path(tmp_path / "records" / "t" / "trial0.json")
    peers.ended(last, ("other", 0), 3, True, False)
    stale = json.loads(last.read_text())
    last.write_text(json.dumps({**stale, "at": stale["at"] - peers.STREAK_S - 60}))
    assert again([{"fp32": 10.0}, {"fp32": 95.0}], 5)["attempts"] == 2


def test_zero_retries_runs_once(make_spec, tmp_path):
    record, env = run(tmp_path, make_spec(), [{"fp32": 10.0}], reference=REFERENCE, max_retries=0)
    assert attempts_run(env) == 1 and record["attempts"] == 1
    assert record["discarded_attempts"] == [] and record["noise_check"]["passed"] is False


def test_clean_probe_runs_once(make_spec, tmp_path):
    record, env = run(tmp_path, make_spec(), [{"fp32": 86.0}], reference=REFERENCE)
    assert attempts_run(env) == 1 and record["attempts"] == 1
    assert record["discarded_attempts"] == [] and record["noise_check"]["passed"] is True


def test_no_reference_no_reruns(make_spec, tmp_path):
    record, env = run(tmp_path, make_spec(), [{"fp32": 1.0}], reference=None)
    assert attempts_run(env) == 1 and record["attempts"] == 1
    assert record["noise_check"] is None and record["discarded_attempts"] == []


def test_failed_runs_are_not_rerun(make_spec, tmp_path):
    plan = [{"fp32": 1.0, "status": "failed"}]
    record, env = run(tmp_path, make_spec(), plan, reference=REFERENCE)
    assert attempts_run(env) == 1 and record["status"] == "failed"
    assert record["noise_check"] is None


def test_reference_matches_the_probe_threads(make_spec, tmp_path):
    # 1 thread: compared with the 1-thread reference (52), not the all-CPU one (100)
    record, _ = run(tmp_path, make_spec(), [{"fp32": 48.0, "threads": 1}], reference=REFERENCE)
    assert record["attempts"] == 1
    assert record["noise_check"]["reference_fp32_gflops"] == 52.0


def test_reference_without_the_probe_size_checks_nothing(make_spec, tmp_path):
    record, _ = run(tmp_path, make_spec(), [{"fp32": 1.0, "size": 512}], reference=REFERENCE)
    assert record["attempts"] == 1
    assert record["noise_check"]["passed"] is None
    assert "no probe of size 512" in record["noise_check"]["reference"]


def test_cli_reads_the_reference_and_settings(make_spec, tmp_path, capsys):
    env = fake_env(tmp_path, FAKE_HARNESS, [{"fp32": 40.0}, {"fp32": 90.0}])
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(env))
    ref = tmp_path / "probe.json"
    ref.write_text(json.dumps(REFERENCE))
    out = tmp_path / "r" / "trial1.json"
    common = [f"--spec-json={json.dumps(make_spec())}", f"--env-json={env_json}", f"--out={out}"]
    common += [f"--log={tmp_path / 'l.log'}", "--trial=1", "--retry-delay=0"]
    assert trial.main([*common, f"--reference-probe={ref}", "--max-retries=1"]) == 0
    record = json.loads(out.read_text())
    assert record["attempts"] == 2 and record["trial"] == 1
    assert "[attempt 2: 1 discarded as noisy]" in capsys.readouterr().out
    # a looser threshold than the default, and no reference at all
    (Path(env["prefix"]) / "count").unlink()
    assert trial.main([*common, f"--reference-probe={ref}", "--noise-threshold=0.35"]) == 0
    assert json.loads(out.read_text())["attempts"] == 1  # 40 > 35
    (Path(env["prefix"]) / "count").unlink()
    assert trial.main([*common, "--reference-probe="]) == 0
    assert json.loads(out.read_text())["attempts"] == 1


def test_unreadable_reference_means_no_reruns(tmp_path):
    bad = tmp_path / "probe.json"
    bad.write_text("{not json")
    log = tmp_path / "x.log"
    assert trial.read_reference(bad, log) is None
    assert "unusable" in log.read_text()
    assert trial.read_reference(None) is None


#: a calibration's fields with the wrong types (by hand, a bad merge, another version)
WRONG_TYPES = [
    {"entries": "abc"},
    {"entries": [1, "x", None]},
    {"entries": [{"size": "1024", "threads": "2", "fp32_gflops": "fast"}]},
    {"fp32_gflops": "x", "bf16_gflops": [1]},
    {"threads": {}, "size": "big"},
    {"ceiling": 5},
    {"ceiling": ["a", {"size": "x", "fp32_gflops": {}}]},
    {"provenance": []},
    {"provenance": {"cpu_model": 5, "flags": 3}},
    {"train_proxy": "x"},
    {"text_proxy": ["x"]},
]


def test_a_nested_field_named_like_a_mapping_is_read_as_what_it_is():
    """``pilot`` is a mapping in a ceiling row (each dtype's pilot rate) and a number or a
    note deeper (a convolution's pilot GFLOP/s, why bf16 was skipped): the calibrate
    rule writes both, and neither is left out; a ceiling row's own of the wrong type is."""
    row = {"threads": 2, "pilot": {"fp32": 80.0, "bf16": 2.5},
           "skipped": {"bf16": {"pilot": "emulated: its pilot ran at 2.52 GFLOP/s"}},
           "conv": {"fp32": {"gflops": 120.0, "pilot": 66.8},
                    "bf16": {"gflops": None, "pilot": 1.0, "skipped": "predicted"}}}  # fmt: skip
    data, dropped = clean_calibration({**REFERENCE, "ceiling": [row]})
    assert dropped == [] and data["ceiling"] == [row]
    wrong = {**row, "pilot": 3.0, "skipped": "x"}
    dropped = clean_calibration({**REFERENCE, "ceiling": [wrong]})[1]
    assert sorted(dropped) == ["ceiling[].pilot", "ceiling[].skipped"]


@pytest.mark.parametrize("wrong", WRONG_TYPES, ids=[",".join(w) for w in WRONG_TYPES])
def test_a_calibration_with_wrong_types_still_gives_a_record(make_spec, tmp_path, wrong):
    """The trial reads the calibration it is judged by; whatever its fields hold, the
    trial ends with its record (the probe unjudged where the reference says nothing
    usable), never without one."""
    ref = tmp_path / "probe.json"
    ref.write_text(json.dumps({**REFERENCE, **wrong}))
    log = tmp_path / "logs" / "t.log"
    reference = trial.read_reference(ref, log)
    record, _ = run(tmp_path, make_spec(), [{"fp32": 95.0}], reference=reference)
    assert record["status"] == "ok", record.get("error")
    # the estimate (every snakemake -n) reads it too: a figure, from what is usable
    from workflow_scripts.plan import study_estimate
    from workflow_scripts.study import load_study

    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "upstream.json").write_text(ref.read_text())
    study = load_study({"groups": {"g": {"runs": [{"id": "a", "model": "cnn", "image_size": 32}]}}})
    est = study_estimate.for_study(study, tmp_path, measure=False)
    assert est["total_s"] > 0


# --------------------------------------------------------------------------- compile caches


def test_fresh_compile_cache_per_attempt_removed_afterwards(make_spec, tmp_path):
    plan = [{"fp32": 10.0}, {"fp32": 99.0}]
    record, _ = run(tmp_path, make_spec(), plan, reference=REFERENCE)
    cache = record["provenance"]["compile_cache"]
    assert cache["fresh"] is True and cache["removed"] is True
    assert not os.path.exists(cache["dir"])
    env = record["provenance"]["env"]
    assert env["TORCHINDUCTOR_CACHE_DIR"] == cache["dir"]
    assert env["TRITON_CACHE_DIR"] == os.path.join(cache["dir"], "triton")
    assert record["provenance"]["cache_existed"]  # it was there while the run ran
    assert "t-trial0-2" in Path(cache["dir"]).name  # the second attempt had its own


def test_warm_compile_cache_keeps_the_default(make_spec, tmp_path):
    record, _ = run(tmp_path, make_spec(warm_compile_cache=True), [{"fp32": 99.0}])
    cache = record["provenance"]["compile_cache"]
    assert cache["fresh"] is False
    assert Path(cache["dir"]).name.startswith("torchinductor_")
    assert record["provenance"]["env"]["TORCHINDUCTOR_CACHE_DIR"] is None


def test_spec_cache_dir_is_respected(make_spec, tmp_path):
    spec = make_spec(env_vars={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")})
    record, _ = run(tmp_path, spec, [{"fp32": 99.0}])
    assert record["provenance"]["compile_cache"] == {"dir": str(tmp_path / "mine"), "fresh": False}


def test_a_compiled_run_in_a_container_gets_this_machines_precompiled_headers(make_spec, tmp_path):
    """Inductor's precompiled headers live in its default cache folder, not the run's
    cache: a compiled run in a container (whose /tmp starts empty) gets the machine's
    folder of them, mounted, and the variable that links it (backends.base); a run that
    compiles nothing, or runs locally (where torch's own /tmp folder is the machine's),
    gets neither."""
    from workflow_scripts.backends.base import HEADERS_VAR
    from workflow_scripts.trial.environment import compile_cache, headers_folder, run_mounts

    env: dict[str, str] = {}
    cache, removed = compile_cache(make_spec(backend="inductor"), env, "c", container=True)
    assert cache["headers"] == env[HEADERS_VAR] == str(headers_folder()) and removed is None
    assert headers_folder().is_dir()
    out = tmp_path / "records" / "c" / "trial0.json"
    assert (cache["headers"], "rw") in run_mounts(out, None, cache)
    # (and every container run the study's initial weights, rank/initial_weights.py)
    assert (str((tmp_path / "initial-weights").resolve()), "rw") in run_mounts(out, None, cache)
    for spec, container in ((make_spec(), True), (make_spec(backend="inductor"), False)):
        env = {}
        cache, removed = compile_cache(spec, env, "n", container=container)
        if removed is not None:
            removed.rmdir()
        assert "headers" not in cache and HEADERS_VAR not in env, (spec["compile"], container)
        assert all(path != str(headers_folder()) for path, _ in run_mounts(out, None, cache))


def test_a_compiled_runs_later_trial_starts_from_its_first_trials_cache(make_spec, tmp_path):
    """Trial 0 of a compiled run compiles cold into the folder beside its record (emptied
    at each attempt: its compile latency is a cold one) and leaves it; a later trial runs
    on a copy of it (what trial 0 compiled is there when it starts), removed afterwards,
    and trial 0's folder is left as it was."""
    spec = make_spec(backend="inductor")
    kept = tmp_path / "records" / "t" / "compile-cache"
    kept.mkdir(parents=True)
    (kept / "stale").write_text("from an earlier run")
    plan = [{"fp32": 10.0}, {"fp32": 99.0}, {"fp32": 99.0}]
    first, _ = run(tmp_path, spec, plan, reference=REFERENCE)
    cache = first["provenance"]["compile_cache"]
    assert cache == {"dir": str(kept.resolve()), "fresh": True, "kept": True}
    assert first["attempts"] == 2 and first["provenance"]["cache_found"] == []  # cold, twice
    assert sorted(p.name for p in kept.iterdir()) == ["graph-1"]  # the kept attempt's

    later, _ = run(tmp_path, spec, plan[2:], trial_index=1,
                   first_trial=tmp_path / "records" / "t" / "trial0.json")  # fmt: skip
    cache = later["provenance"]["compile_cache"]
    assert cache["fresh"] is False and cache["from"] == "trial 0" and cache["removed"]
    assert later["provenance"]["cache_found"] == ["graph-1"]  # warm: trial 0's compile
    assert Path(cache["dir"]).parent == kept.parent.resolve() and not Path(cache["dir"]).exists()
    assert sorted(p.name for p in kept.iterdir()) == ["graph-1"]
    assert later["estimate"]["parts"]["compile"] < first["estimate"]["parts"]["compile"]


def test_an_uncompiled_run_or_a_first_trial_without_a_cache_compiles_fresh(make_spec, tmp_path):
    (tmp_path / "records" / "t").mkdir(parents=True)
    (tmp_path / "records" / "t" / "trial0.json").write_text("{}")
    for spec in (make_spec(), make_spec(backend="inductor")):  # (the latter: none kept)
        record, _ = run(tmp_path, spec, [{"fp32": 99.0}], trial_index=1,
                        first_trial=tmp_path / "records" / "t" / "trial0.json")  # fmt: skip
        cache = record["provenance"]["compile_cache"]
        assert cache["fresh"] is True and cache["removed"]
        assert record["provenance"]["cache_found"] == []
    assert not (tmp_path / "records" / "t" / "compile-cache").exists()


# --------------------------------------------------------------------------- calibration


def test_calibrate_writes_the_reference(tmp_path, capsys):
    env = fake_env(tmp_path, FAKE_PROBE)
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(env))
    out = tmp_path / "calibration" / "probe.json"
    args = [f"--env-json={env_json}", f"--out={out}", f"--log={tmp_path / 'c.log'}"]
    assert calibration.main([*args, "--sizes=1024"]) == 0
    ref = json.loads(out.read_text())
    assert ref["asked_threads"] == "auto" and ref["env_name"] == "fake"
    assert ref["provenance"]["cpu_model"]
    assert probe.reference_rate(ref, 1024, 1) == (50.0, "reference size 1024, 1 threads")
    assert "fp32 100.0 GFLOP/s" in capsys.readouterr().out
    assert ref["asked_imports"] == ""  # an environment without a backend module


def test_calibration_imports_the_backend_module_as_the_trials_do(tmp_path):
    env = {**fake_env(tmp_path, FAKE_PROBE), "name": "ipex"}
    ref = calibration.calibrate(env, tmp_path / "ipex.json", tmp_path / "c.log", [1024])
    assert ref["asked_imports"] == "intel_extension_for_pytorch"
    image = {**fake_env(tmp_path, FAKE_PROBE), "name": "localhost/x-xla:latest", "env": "xla"}
    ref = calibration.calibrate(image, tmp_path / "xla.json", tmp_path / "c.log", [1024])
    assert ref["asked_imports"] == "torch_xla"


def test_failed_calibration_leaves_an_empty_reference(tmp_path):
    env = fake_env(tmp_path, "#!/bin/sh\necho no torch here >&2\nexit 3\n")
    out = tmp_path / "probe.json"
    ref = calibration.calibrate(env, out, tmp_path / "c.log", [1024])
    assert json.loads(out.read_text()) == json.loads(json.dumps(ref, default=str))
    assert ref["entries"] == [] and "no torch here" in ref["error"]["tail"]
    assert probe.reference_rate(ref, 1024, 2)[0] is None


# --------------------------------------------------------------------------- probe helpers


def test_reference_rate_lookup_and_scaling():
    assert probe.reference_rate(REFERENCE, 1024, 2) == (100.0, "reference size 1024, 2 threads")
    assert probe.reference_rate(REFERENCE, 1024, 1, "bf16")[0] == 21.0
    rate, how = probe.reference_rate(REFERENCE, 1024, 4)  # nearest (2) scaled linearly
    assert rate == 200.0 and "scaled linearly to 4 threads" in how
    assert probe.reference_rate(REFERENCE, 1024, 3)[0] == 150.0  # ties: the larger count
    assert probe.reference_rate(REFERENCE, 2048, 2)[0] is None
    assert probe.reference_rate(None, 1024, 2) == (None, "no reference probe")
    assert probe.reference_rate(REFERENCE, 1024, None)[0] is None
    single = {"fp32_gflops": 80.0, "bf16_gflops": 30.0, "size": 1024, "threads": 2}
    assert probe.reference_rate(single, 1024, 2)[0] == 80.0  # one probe as the reference


def test_summarize_takes_medians():
    runs = [
        {"fp32_gflops": 90.0, "bf16_gflops": 30.0, "size": 512, "threads": 2},
        {"fp32_gflops": 100.0, "bf16_gflops": None, "size": 512, "threads": 2},
        {"fp32_gflops": 70.0, "bf16_gflops": 50.0, "size": 512, "threads": 2},
    ]
    out = probe.summarize(runs)
    assert out["fp32_gflops"] == 90.0 and out["bf16_gflops"] == 40.0
    assert (out["size"], out["threads"], out["runs"]) == (512, 2, runs)
    assert probe.summarize([])["fp32_gflops"] is None


def test_auto_threads():
    assert probe.auto_threads(1) == [1]
    assert probe.auto_threads(2) == [1, 2]
    assert probe.auto_threads(6) == [1, 2, 4, 6]
    assert probe.auto_threads(8) == [1, 2, 4, 8]


def test_a_batch_beyond_the_nodes_memory_is_warned_where_it_runs(make_spec, tmp_path):
    """The plan-time memory warning, again on the machine that runs the trial (a
    cluster node may have less memory than the submit host): in the log and the record,
    and the run still happens (the estimate is rough)."""
    from workflow_scripts import workloads
    from workflow_scripts.study import machine

    memory = machine.total_memory_mb()
    per_sample = workloads.get("resnet50").memory_mb[1]
    batch = int(memory / per_sample) + 1  # more than this machine's memory by the estimate
    spec = make_spec(model="resnet50", image_size=224, batch_size=batch)
    record, _ = run(tmp_path, spec, [{"fp32": 100.0}])
    assert record["status"] == "ok"
    (warning,) = record["warnings"]
    assert f"t.batch_size: batch {batch} of resnet50" in warning
    assert "may be killed for memory" in warning
    assert f"[launch] warning: {warning}" in (tmp_path / "logs" / "t.log").read_text()
    (tmp_path / "small").mkdir()
    small, _ = run(tmp_path / "small", make_spec(), [{"fp32": 100.0}])
    assert small["warnings"] == []


# --------------------------------------------------------------------------- ceiling


CEILINGS = [
    {"threads": 1, "fp32_gflops": 90.0, "fp32_size": 2048, "bf16_gflops": 200.0, "bf16_size": 2048},
    {"threads": 2, "fp32_gflops": 170.0, "fp32_size": 4096, "bf16_gflops": 60.0, "bf16_size": 1024},
]


def ok_record(achieved, precision="fp32", threads=2, world=1, probe_fp32=114.0):
    return {
        "status": "ok",
        "spec": {"precision": precision, "threads": threads},
        "checks": {"threads": threads, "world_size": world},
        "metrics": {"achieved_gflops": achieved},
        "probe": {"fp32_gflops": probe_fp32, "size": 1024, "threads": threads},
    }


def test_pct_of_peak_divides_by_the_calibrated_ceiling_not_the_probe():
    ref = {**REFERENCE, "ceiling": CEILINGS}
    # the case: a disturbed probe (114) below what the steps reached (118.6)
    m = trial.with_ceiling(ok_record(118.6), ref)["metrics"]
    assert m["ceiling_gflops"] == 170.0 and m["ceiling_dtype"] == "fp32"
    assert m["pct_of_peak"] == pytest.approx(100 * 118.6 / 170) and m["pct_of_peak"] <= 100
    assert "2 threads, size 4096" in m["ceiling_source"]
    # bf16 autocast: the faster of the bf16 and fp32 ceilings (here bf16 is emulated: fp32)
    m = trial.with_ceiling(ok_record(34.0, "bf16"), ref)["metrics"]
    assert (m["ceiling_dtype"], m["ceiling_gflops"]) == ("fp32", 170.0)
    m = trial.with_ceiling(ok_record(50.0, "bf16", threads=1), ref)["metrics"]
    assert (m["ceiling_dtype"], m["ceiling_gflops"]) == ("bf16", 200.0)
    # two ranks of 1 thread: the ceiling of 2 threads; 4 threads: the nearest scaled
    m = trial.with_ceiling(ok_record(85.0, threads=1, world=2), ref)["metrics"]
    assert m["ceiling_gflops"] == 170.0 and m["pct_of_peak"] == pytest.approx(50.0)
    m = trial.with_ceiling(ok_record(85.0, threads=4), ref)["metrics"]
    assert m["ceiling_gflops"] == 340.0 and "scaled linearly to 4" in m["ceiling_source"]


def test_above_the_ceiling_is_a_measurement_error_and_no_ceiling_no_percentage():
    ref = {**REFERENCE, "ceiling": CEILINGS}
    m = trial.with_ceiling(ok_record(180.0), ref)["metrics"]
    assert m["pct_of_peak"] is None and m["pct_of_peak_measured"] == pytest.approx(105.9, 0.01)
    assert "106% of the calibrated ceiling" in m["measurement_error"]
    # a calibration from before the ceiling: no percentage (the probe is never used)
    m = trial.with_ceiling(ok_record(50.0), REFERENCE)["metrics"]
    assert m["pct_of_peak"] is None and "recalibrate" in m["ceiling_source"]
    failed = {"status": "failed", "metrics": {}}
    assert trial.with_ceiling(failed, ref) == {"status": "failed", "metrics": {}}


def test_a_ceiling_is_no_lower_than_a_noise_probe_at_its_threads_and_sizes():
    """The calibration's noise probes are matmuls too: one faster than the ceiling's own
    search at the same threads and size (the machine was quieter then) raises the
    ceiling, while what the search measured (what the time estimate reads) stays."""
    top = {"threads": 2, "sizes": {"fp32": {256: 100.0, 512: 120.0, 1024: 110.0},
                                   "bf16": {512: 1.1}},
           "emulated": {"fp32": False, "bf16": True},
           "conv": {"fp32": {"gflops": 130.0}},
           "fp32_matmul_gflops": 120.0, "fp32_size": 512, "fp32_gflops": 130.0,
           "fp32_kernel": "conv3x3", "bf16_matmul_gflops": 1.1, "bf16_size": 512,
           "bf16_gflops": 1.1, "bf16_kernel": "matmul"}  # fmt: skip
    runs = [{"threads": 2, "size": 1024, "fp32_gflops": 150.0, "bf16_gflops": 3.0},
            {"threads": 2, "size": 1024, "fp32_gflops": 140.0, "bf16_gflops": None},
            {"threads": 1, "size": 1024, "fp32_gflops": 400.0},  # other threads
            {"threads": 2, "size": 2048, "fp32_gflops": 500.0}]  # a size not searched  # fmt: skip
    out = probe.with_probes(top, runs, (256, 512, 1024))
    assert (out["fp32_gflops"], out["fp32_kernel"]) == (150.0, "matmul")
    assert out["from_probes"] == {"fp32": {1024: 150.0}}
    # the search's own rates as they were
    assert out["sizes"] == top["sizes"] and (out["fp32_matmul_gflops"], out["fp32_size"]) == (
        120.0,
        512,
    )
    # an emulated dtype takes in nothing
    assert (out["bf16_gflops"], out["bf16_kernel"]) == (1.1, "matmul")
    # the convolution stays the ceiling where it is faster still; the input is not changed
    faster_conv = {**top, "conv": {"fp32": {"gflops": 160.0}}, "fp32_gflops": 160.0}
    out = probe.with_probes(faster_conv, runs, (256, 512, 1024))
    assert (out["fp32_gflops"], out["fp32_kernel"]) == (160.0, "conv3x3")
    assert out["from_probes"] == {"fp32": {1024: 150.0}} and "from_probes" not in top
    # probes no faster than the search: the ceiling as it was
    slower = [{**r, "fp32_gflops": 105.0} for r in runs[:2]]
    assert probe.with_probes(top, slower + runs[2:], (256, 512, 1024)) == top


def test_noise_signals_other_work_and_the_probe_after_the_steps():
    rec = ok_record(50.0, probe_fp32=100.0)
    rec["probe_after"] = {"fp32_gflops": 60.0, "size": 1024, "threads": 2}
    rec["other_work"] = {"share": 0.4, "other_cpu_s": 8.0, "cpus": 2, "threads": 2,
                         "wall_s": 10.0}  # fmt: skip
    check = trial.noise_check(rec, REFERENCE, 0.85)
    assert [x["signal"] for x in check["signals"]] == [
        trial.PROBE_BEFORE,
        trial.PROBE_AFTER,
        trial.OTHER_WORK,
    ]
    # no peers: 0.6 of the calibration is no disturbance (below 0.5 would be)
    assert check["caught_by"] == [trial.OTHER_WORK]
    assert check["passed"] is False and check["ratio"] == 1.0  # the probe before: fine
    # no peers: judged by the calibration at the cold start's 0.5; with peers, by theirs
    level = peers.ordinary([100.0] * 5)
    check = trial.noise_check(rec, REFERENCE, 0.85, {"before": level, "after": level})
    assert check["caught_by"] == [trial.PROBE_AFTER, trial.OTHER_WORK]
    reason = trial.noise_reason(check)
    assert "probe after steps: fp32 60.0 GFLOP/s = 0.60 x the median 100.0" in reason
    assert "other processes took 8.0 CPU s on the run's 2 CPUs in 10.0 s, 40%" in reason
    # without a reference the other work is still judged; nothing at all: no check
    check = trial.noise_check(rec, None, 0.85)
    assert check["caught_by"] == [trial.OTHER_WORK]
    assert trial.noise_check(ok_record(1.0, probe_fp32=None), None, 0.85) is None


def test_the_probe_after_the_steps_alone_discards_no_attempt_whose_steps_were_steady():
    level = peers.ordinary([100.0] * 5)
    levels = {"before": level, "after": level}
    quiet = {"share": 0.02, "other_cpu_s": 0.4, "cpus": 2, "threads": 2, "wall_s": 10.0}

    def record(steps, work=quiet, before=100.0):
        rec = ok_record(50.0, probe_fp32=before)
        rec["probe_after"] = {"fp32_gflops": 60.0, "size": 1024, "threads": 2}
        rec["step_times_s"] = steps
        if work is not None:
            rec["other_work"] = work
        return rec

    # the probe after read 0.6 of its peers, yet the 8 steps before it kept their pace
    # (the later half no slower than the earlier): what it read came after them
    check = trial.noise_check(record([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.1]), REFERENCE,
                              0.85, levels)  # fmt: skip
    assert check["passed"] is True and check["caught_by"] == [], check
    after = next(x for x in check["signals"] if x["signal"] == trial.PROBE_AFTER)
    assert after["kept_by_steps"]["steps"] == 8 and after["kept_by_steps"]["passed"]
    assert "kept: its 8 timed steps show none of it" in after["note"]
    # the later half slowed by more than the threshold allows: disturbed, as before
    slowed = record([1.0, 1.0, 1.0, 1.0, 1.3, 1.3, 1.3, 1.3])
    check = trial.noise_check(slowed, REFERENCE, 0.85, levels)
    assert check["caught_by"] == [trial.PROBE_AFTER] and check["passed"] is False
    # too few timed steps to tell, no other-work reading, or the probe before low too:
    # the probe after decides, as before
    for rec in (
        record([1.0, 1.0, 1.0]),
        record([1.0] * 8, work=None),
        record([1.0] * 8, before=60.0),
    ):
        check = trial.noise_check(rec, REFERENCE, 0.85, levels)
        assert trial.PROBE_AFTER in check["caught_by"] and check["passed"] is False, check


def test_other_work_share():
    # a 2-thread run on 2 CPUs: one busy process beside it takes half its threads' time
    assert contention.share(10.0, 10.0, cpus=2, threads=2) == 0.5
    # a 1-thread run on 2 CPUs: the same process fits on the free CPU
    assert contention.share(10.0, 10.0, cpus=2, threads=1) == 0.0
    assert contention.share(15.0, 10.0, cpus=2, threads=1) == 0.5
    start = {"t": 0.0, "cpus": [0, 1], "busy_s": 100.0, "own_s": 5.0}
    end = {"t": 4.0, "cpus": [0, 1], "busy_s": 110.0, "own_s": 12.0}
    work = contention.measure(start, end, threads=2)
    assert (work["own_cpu_s"], work["other_cpu_s"]) == (7.0, 3.0)
    assert work["share"] == pytest.approx(3.0 / 8.0) and work["judged"]
    short = contention.measure(start, {**end, "t": 0.5}, threads=2)
    assert short["share"] is None and not short["judged"]
    assert contention.measure(None, end, 2) is None


def test_snapshot_of_this_process():
    snap = contention.snapshot()
    assert snap["cpus"] == sorted(os.sched_getaffinity(0))
    busy = snap["busy_s"]
    t = __import__("time").process_time()
    while __import__("time").process_time() - t < 0.3:
        pass
    later = contention.snapshot()
    assert later["own_s"] - snap["own_s"] >= 0.2 and later["busy_s"] - busy >= 0.2


def test_the_window_counts_this_processs_page_faults_and_switches():
    """Pages written for the first time between two snapshots are faulted in: the
    window counts them (at least one per page); a sleep is a voluntary switch."""
    import mmap
    import time

    start = contention.snapshot()
    pages = 2000
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as region:  # a fresh mapping, as glibc's
        for i in range(pages):
            region[i * mmap.PAGESIZE] = 1
    time.sleep(0.01)
    work = contention.measure(start, contention.snapshot(), threads=1)
    assert work["minor_faults"] >= pages, work
    assert work["voluntary_switches"] >= 1 and work["major_faults"] >= 0
    assert work["involuntary_switches"] >= 0
    # a snapshot without them (an older record's) measures without them
    plain = {k: v for k, v in start.items() if k != "counters"}
    assert "minor_faults" not in contention.measure(plain, contention.snapshot(), 1)


def test_cpu_identification_beyond_the_model_name():
    """Family, model number and stepping, read where /proc/cpuinfo has them (x86)."""
    from workflow_scripts import sysinfo

    info = sysinfo._cpuinfo()
    topo = sysinfo.topology()
    assert topo["cpu_family"] == info.get("cpu family")
    assert topo["cpu_model_number"] == info.get("model")
    assert topo["cpu_stepping"] == info.get("stepping")
    if "cpu family" in info:
        assert topo["cpu_family"].isdigit() and topo["cpu_model_number"].isdigit()
