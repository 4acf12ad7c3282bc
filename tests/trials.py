"""One trial through the trial policy (:func:`run`) and the checks every ok trial's
record passes (:func:`assert_ok`), for the tests that train real steps."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from workflow_scripts import trial

NOISE_FIELDS = {f.name for f in dataclasses.fields(trial.Noise)}


def policy(spec, env, out, log, **kwargs) -> dict:
    """The trial policy on one trial, its keywords :class:`trial.Trial`'s (``index``,
    ``data_path``, ``first_trial``, ...) and :class:`trial.Noise`'s (``reference``,
    ``max_retries``, ...)."""
    noise = {k: kwargs.pop(k) for k in NOISE_FIELDS & set(kwargs)}
    return trial.run(trial.Trial(spec, env, out, log, **kwargs), trial.Noise(**noise))


def run(spec, env, tmp_path, **kwargs) -> dict:
    out = tmp_path / "records" / f"{spec['id']}.json"
    log = tmp_path / "logs" / f"{spec['id']}.log"
    record = policy(spec, env, out, log, **kwargs)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record, default=str))
    if record["status"] == "ok":
        assert record["error"] is None
    return record


def assert_ok(record: dict, torch: str = "2.14.") -> dict:
    """The checks every ok trial passes (``torch``: its environment's torch release)."""
    assert record["status"] == "ok", record.get("error")
    m = record["metrics"]
    spec = record["spec"]
    assert m["steps_timed"] == len(record["step_times_s"])
    # every step asked for, unless the time budget or the precision reached ended them
    assert (
        m["steps_timed"] == spec["steps"]
        or m["time_budget_hit"]
        or (m["stop_reason"] in ("precision", "far_from_baseline"))
    )
    # the warm-up: warmup_steps, or fewer where its steps took the time budget already
    assert 1 <= m["warmup_steps_run"] <= spec["warmup_steps"]
    assert m["warmup_steps_run"] == spec["warmup_steps"] or spec["time_budget_s"]
    assert len(record["losses"]) == m["warmup_steps_run"] + m["steps_timed"]
    assert m["samples_per_s"] == pytest.approx(
        spec["batch_size"] * m["steps_timed"] / sum(record["step_times_s"])
    )
    dist = m["step_time_s"]
    assert dist["min"] <= dist["median"] <= dist["p90"] <= dist["p99"] <= dist["max"]
    assert m["time_to_first_step_s"] > 0 and m["peak_rss_mb"] > 50
    prov = record["provenance"]
    assert prov["versions"]["torch"].startswith(torch)
    assert prov["env_lock_sha256"] and prov["cpu_model"] and prov["logical_cpus"] >= 1
    assert prov["torch_num_threads"] >= 1
    return record


#: whether this process may use two CPUs (the two-rank tests)
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def bert(make_spec, **fields) -> dict:
    fields.setdefault("id", "bert")
    return make_spec(model="bert-tiny", image_size=None, seq_len=32, **fields)


def rank_pids(needle: str) -> list[int]:
    """The pids of the training ranks (python run_trial.py ..., not torchrun above them)
    whose command line holds ``needle``."""
    pids = []
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            argv = open(f"/proc/{proc}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        argv = argv.split("\0")
        script = [a for a in argv[1:3] if not a.startswith("-")][:1]  # python [-u] script
        if script and script[0].endswith("run_trial.py") and needle in " ".join(argv):
            pids.append(int(proc))
    return pids
