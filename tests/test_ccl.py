"""The study's "ccl" process-group backend (containers/oneccl/ccl_backend.cpp) in real
2-rank process groups, in the real oneccl environment.

Each test runs two ranks of a small worker script (written below) with the
environment's Python, rendezvousing over TCP on loopback. Every collective runs on the
ccl group and on a gloo group over the same ranks with the same inputs, in the same
processes, and the worker records how the results compare; the test checks the records
(exact for integers, allclose for floats) and that replicated results hash the same on
both ranks. The dead-rank test checks that a collective waiting for a dead peer fails
with the process-group timeout instead of hanging. The workers get no oneCCL or
libfabric variables: ``workflow_scripts.rank.distributed.ccl.register()`` has to set up
everything itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.ccl_ranks import describe, run_ranks
from tests.conftest import REPO

pytestmark = pytest.mark.slow

BUILD_SCRIPT = REPO / "containers" / "oneccl" / "build_ccl.py"
SOURCE = REPO / "containers" / "oneccl" / "ccl_backend.cpp"


# Variables that could make a worker pass for the wrong reason (register() sets them).
def built_from(lib: Path) -> str | None:
    """The SHA-256 of the source a build in ``lib`` was compiled from."""
    try:
        return json.loads((lib / "BUILD.json").read_text()).get("source_sha256")
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="session")
def ccl_env(oneccl_env) -> dict:
    """The oneccl environment and the folder holding the study_ccl module that its build
    compiled (envs.build_extensions), from the current source."""
    lib = Path(oneccl_env["extensions"]["ccl"]["dir"])
    build = json.loads((lib / "BUILD.json").read_text())
    assert build["source_sha256"] == hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    assert (lib / build["file"]).exists()
    return {"python": oneccl_env["python"], "prefix": oneccl_env["prefix"], "lib": lib,
            "build": build}  # fmt: skip


@pytest.fixture(scope="module")
def collectives_run(ccl_env, tmp_path_factory) -> list[dict]:
    ranks = run_ranks(ccl_env, "collectives", tmp_path_factory.mktemp("ccl-collectives"), 240)
    for r in ranks:
        assert r["json"] and r["json"].get("checks"), describe(ranks)
    return ranks


def test_build_record(ccl_env):
    build = ccl_env["build"]
    assert build["file"].startswith("study_ccl") and build["file"].endswith(".so")
    assert len(build["source_sha256"]) == 64 and build["torch"]
    assert "-lccl" in build["command"]


def test_registration_without_environment(collectives_run):
    for r in collectives_run:
        info = r["json"]
        assert info["backend"] == "ccl"
        assert info["registered"].startswith("study ccl backend from ")


def test_collectives_match_gloo(collectives_run):
    checks = collectives_run[0]["json"]["checks"]
    # every collective, dtype and size of the worker ran
    for name in (
        "allreduce/AVG/bfloat16/1000003",
        "allreduce/PRODUCT/int64/7",
        "broadcast/float32/1",
        "allgather/int64/1000003",
        "all_gather_into_tensor/bfloat16/7",
        "reduce_scatter/AVG/float32/1000003",
        "reduce_scatter_tensor/SUM/int64/1",
        "allreduce/non-contiguous",
        "second_group/allreduce",
    ):
        assert name in checks
    assert "allreduce/AVG/int64/7" not in checks
    for rank, r in enumerate(collectives_run):
        bad = {k: v for k, v in r["json"]["checks"].items() if not v["ok"]}
        assert not bad, f"rank {rank}: {json.dumps(bad, indent=1)}"
        ints = [
            v
            for v in r["json"]["checks"].values()
            if not v["dtype"].startswith(("torch.float", "torch.bfloat"))
        ]
        assert ints and all(v["equal"] for v in ints)


def test_replicated_results_agree_across_ranks(collectives_run):
    h0, h1 = (r["json"]["hashes"] for r in collectives_run)
    assert h0.keys() == h1.keys() and len(h0) > 50
    assert {k for k in h0 if h0[k] != h1[k]} == set()


def test_async_future(collectives_run):
    for r in collectives_run:
        assert r["json"]["checks"]["async/allreduce"]["ok"]


def test_ddp_matches_gloo(collectives_run):
    for r in collectives_run:
        assert r["json"]["checks"]["ddp/params"]["ok"], r["json"]["checks"]["ddp/params"]
    h0, h1 = (r["json"]["hashes"]["ddp/params"] for r in collectives_run)
    assert h0 == h1  # identical parameters on both ranks


def test_clear_errors(collectives_run):
    errors = collectives_run[0]["json"]["errors"]
    assert "AVG is not supported for integer tensors" in errors["avg_int"]
    assert "BAND" in errors["band"]
    assert "ccl" in errors["gather"] and "gather" in errors["gather"]


def test_clean_exit(collectives_run):
    for r in collectives_run:
        assert r["json"].get("destroyed"), describe(collectives_run)


def test_dead_rank_times_out(ccl_env, tmp_path):
    ranks = run_ranks(ccl_env, "dead", tmp_path, 90)
    rank0, rank1 = ranks
    assert rank1["returncode"] == 1 and rank1["json"]["first"] == [2.0] * 10, describe(ranks)
    info = rank0["json"]
    assert info is not None, describe(ranks)
    assert "error" in info, describe(ranks)
    assert "did not complete within the process-group timeout of 10 s" in info["error"]
    assert 9.5 <= info["elapsed_s"] < 30, info
    # the group is broken afterwards: the next collective fails at once
    assert "broken" in info["later_error"] and info["later_elapsed_s"] < 1
    # the uncaught error ends the process (no hang on the stuck collective)
    assert rank0["returncode"] not in (0, None, -9), describe(ranks)
    assert "process-group timeout" in rank0["output"]
    assert rank0["seconds"] < 60, describe(ranks)


def test_waiting_for_a_slow_peer_does_not_burn_a_core(ccl_env, tmp_path):
    # Rank 1 comes 4 s late to an allreduce. Rank 0 waits in it: on ccl its worker spins
    # for the size class's usual time and then sleeps between polls, so its process uses
    # little CPU, as gloo's does (a spinning worker used one whole core: CPU/wall 1.00).
    ranks = run_ranks(ccl_env, "slow", tmp_path, 120)
    assert all(r["returncode"] == 0 for r in ranks), describe(ranks)
    info = ranks[0]["json"]
    assert info["wait_policy"]["mode"] == "backoff"
    for name in ("ccl", "gloo"):
        waited = info[name]
        assert waited["result"] == [4.0] * 3  # ones, summed twice over 2 ranks
        assert waited["wall_s"] > 3.0, waited
        assert waited["cpu_s"] / waited["wall_s"] < 0.1, (name, waited)
    stats = info["ccl"]["stats"]
    assert stats["collectives"] == 1 and stats["waited_past_spin"] == 1, stats
    assert stats["sleeps"] > 100 and stats["slept_ns"] > 3e9, stats
    assert stats["spin_ns"] < 0.1e9, stats  # spun at most a fraction of the wait
    # rank 1 was late, so its peer was waiting: its allreduce completed at once
    assert ranks[1]["json"]["ccl"]["wall_s"] < 1.0, ranks[1]["json"]["ccl"]


def test_spin_mode_is_the_old_busy_wait(ccl_env, tmp_path, monkeypatch):
    # The comparison arm: STUDY_CCL_WAIT=spin polls without sleeping, and a rank waiting
    # for a late peer burns its core (which is what the backoff avoids).
    monkeypatch.setenv("STUDY_CCL_WAIT", "spin")
    ranks = run_ranks(ccl_env, "slow", tmp_path, 120)
    assert all(r["returncode"] == 0 for r in ranks), describe(ranks)
    info = ranks[0]["json"]
    assert info["wait_policy"]["mode"] == "spin"
    waited = info["ccl"]
    assert waited["stats"]["sleeps"] == 0
    assert waited["cpu_s"] / waited["wall_s"] > 0.5, waited


def test_a_missing_compiler_is_recorded_and_named(ccl_env, tmp_path):
    # The build script cannot run its compiler: it says what to install, in its exit,
    # its message and BUILD.json, and registering the backend repeats the reason.
    out = tmp_path / "study-ccl"
    proc = subprocess.run(
        [ccl_env["python"], str(BUILD_SCRIPT), "--out", str(out), "--cxx", "/nonexistent/g++"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "apt install g++" in proc.stderr and "python3-dev" in proc.stderr
    build = json.loads((out / "BUILD.json").read_text())
    assert build["status"] == "failed" and "/nonexistent/g++" in build["error"]
    from workflow_scripts.rank.distributed import ccl

    with pytest.raises(ccl.CCLUnavailable, match=r"could not be built here: cannot run the C\+\+"):
        ccl.register("study", lib_dir=str(out))


def test_an_environment_without_a_compiler_is_still_built(ccl_env, tmp_path, monkeypatch):
    # envs.build_extensions on an environment (a venv that sees the oneccl environment's
    # packages and oneCCL headers) whose compiler is missing: the environment is not
    # failed, its record says why the extension is missing, and nothing is stamped, so
    # the next build tries again.
    from workflow_scripts import envs

    prefix = tmp_path / "env"
    subprocess.run([ccl_env["python"], "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = next(prefix.glob("lib/python3*/site-packages"))
    real_site = next(Path(ccl_env["prefix"]).glob("lib/python3*/site-packages"))
    (site / "oneccl_env.pth").write_text(f"{real_site}\n")
    (prefix / "include").mkdir(exist_ok=True)
    (prefix / "include" / "oneapi").symlink_to(Path(ccl_env["prefix"]) / "include" / "oneapi")
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    log = tmp_path / "build.log"
    with open(log, "w") as fh:
        built = envs.build_extensions(prefix, REPO / "envs" / "oneccl.txt", fh)
    assert built["ccl"]["status"] == "failed", built
    assert "cannot run the C++ compiler '/nonexistent/g++'" in built["ccl"]["error"]
    assert not (prefix / "lib" / "study-ccl" / "SOURCES.sha256").exists()
    assert "extension ccl not built" in log.read_text()


def test_the_build_records_the_compiler(ccl_env):
    compiler = ccl_env["build"]["compiler"]
    # e.g. "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"
    assert compiler["command"] and compiler["version"]


def test_register_explains_what_is_missing(tmp_path):
    # In the test process itself: no module built in tmp_path, no Intel bindings (and no
    # torch needed to find that out).
    from workflow_scripts.rank.distributed import ccl

    before = dict(os.environ)
    with pytest.raises(ccl.CCLUnavailable, match=r"not built: .*build_ccl\.py --out DIR"):
        ccl.register("study", lib_dir=str(tmp_path))
    with pytest.raises(ImportError, match="oneccl_bindings_for_pytorch.* not installed"):
        ccl.register("intel")
    with pytest.raises(ValueError, match="unknown ccl implementation"):
        ccl.register("mpi")
    # a registration that fails sets nothing for oneCCL (the test process's later
    # children inherit its environment: a log level set here was taken for the user's)
    assert dict(os.environ) == before
