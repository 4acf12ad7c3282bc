"""Data-parallel trials: torchrun ranks with Gloo and with the study's ccl backend, in
the real upstream and oneccl environments, and the collectives microbenchmark job."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO, spec_of
from tests.trials import TWO_CPUS, assert_ok, rank_pids, run
from workflow_scripts import collectives, digits, experiment, metrics
from workflow_scripts.launchers.torchrun import free_port

pytestmark = [pytest.mark.slow, pytest.mark.torch]

needs_two = pytest.mark.skipif(not TWO_CPUS, reason="two ranks need two CPUs")


def ddp_spec(make_spec, **fields):
    fields.setdefault("launcher", "torchrun")
    fields.setdefault("ranks", 2)
    fields.setdefault("threads", 1)
    return make_spec(**fields)


def assert_ranks(record: dict, n: int) -> None:
    per_rank = record["rank_step_times_s"]
    assert len(per_rank) == n
    # the slowest rank decides each step
    for i, t in enumerate(record["step_times_s"]):
        assert t == max(r[i] for r in per_rank)
    m = record["metrics"]
    assert m["samples_per_s"] == pytest.approx(
        metrics.throughput(record["spec"]["batch_size"], record["step_times_s"])
    )
    assert len(m["rank_peak_rss_mb"]) == n
    assert m["peak_rss_mb"] == pytest.approx(sum(m["rank_peak_rss_mb"]))
    checks = record["checks"]
    assert checks["world_size"] == n
    cpus = [set(c.split(",")) for c in checks["rank_cpus"]]
    assert all(len(c) == record["spec"]["threads"] for c in cpus)
    assert not set.intersection(*cpus), "ranks share a core"
    # the record says which physical cores each rank got, and they are its own
    cores = [set(p["cores"]) for p in checks["rank_placement"]]
    assert all(cores) and not set.intersection(*cores), checks["rank_placement"]
    assert len(record["rank_probes"]) == n
    # DDP rewrites the step: its averaged gradients were compared with eager's (fp64 and
    # fp32, each rank's on its own batch, averaged over the ranks in a Gloo group of the
    # check's own) and agree
    check = record["gradient_check"]
    assert check["ok"] and check["comparison"]["own_precision_reference"] == "eager"
    assert check["comparison"]["compared"] == check["received"]["parameters"] == 10
    assert check["comparison"]["max_rel_error"] < 1e-3


@needs_two
def test_two_gloo_ranks_train_one_ddp_model(upstream_env, make_spec, tmp_path):
    rec = assert_ok(run(ddp_spec(make_spec), upstream_env, tmp_path))
    assert_ranks(rec, 2)
    assert rec["checks"]["dist_backend"] == "gloo"
    assert "torch.distributed.run" in rec["provenance"]["command"]
    # where each rank's group talked from: its host name, what that resolves to, the
    # rendezvous (torchrun's standalone one on this host)
    import socket

    for address in rec["checks"]["rank_addresses"]:
        assert address["hostname"] == socket.gethostname()
        assert address["resolves_to"] and "MASTER_ADDR" in address


def test_one_rank_is_a_world_of_one(upstream_env, make_spec, tmp_path):
    rec = assert_ok(run(ddp_spec(make_spec, ranks=1, threads=None), upstream_env, tmp_path))
    assert rec["checks"]["world_size"] == 1 and rec["checks"]["dist_backend"] == "gloo"


@needs_two
def test_two_ccl_ranks_train_one_ddp_model(oneccl_env, make_spec, tmp_path):
    assert (oneccl_env["extensions"]["ccl"]["dir"]).endswith("study-ccl")
    spec = ddp_spec(make_spec, dist_backend="ccl")
    assert spec["env"] == "oneccl"
    rec = assert_ok(run(spec, oneccl_env, tmp_path))
    assert_ranks(rec, 2)
    assert rec["checks"]["dist_backend"] == "ccl"
    assert "study" in rec["checks"]["ccl"]
    # oneCCL's configuration as the rank ran it: a non-MPI launch, told its local rank
    config = rec["checks"]["ccl_config"]
    assert config["CCL_PROCESS_LAUNCHER"] == "none" and config["CCL_LOCAL_SIZE"] == "2"
    assert config["CCL_LOCAL_RANK"] == "0" and config["CCL_WORKER_OFFLOAD"] == "0"
    assert config["study_ccl_wait"]["mode"] == "backoff"
    # the libfabric providers oneCCL opened (rank 0's log says them): shm between the
    # ranks of one host; and oneCCL's info lines, read for it, are not in the log (its
    # warnings are)
    assert config["ofi"]["providers"][0] == "shm" and config["ofi"]["libfabric"], config
    log = (tmp_path / "logs" / f"{spec['id']}.log").read_text()
    assert "|CCL_INFO| provider:" not in log and "|CCL_WARN|" in log


@needs_two
def test_two_ccl_ranks_with_the_worker_on_name_every_workers_cpu(oneccl_env, make_spec, tmp_path):
    """oneCCL's worker thread on (ccl_worker_offload): CCL_WORKER_AFFINITY lists each local
    rank's worker CPU, the last of its block (a single value fails to parse with 2 local
    ranks: the default study's pre-flight found it)."""
    spec = ddp_spec(make_spec, dist_backend="ccl", ccl_worker_offload=True)
    rec = assert_ok(run(spec, oneccl_env, tmp_path))
    assert_ranks(rec, 2)
    blocks = [[int(c) for c in cpus.split(",")] for cpus in rec["checks"]["rank_cpus"]]
    config = rec["checks"]["ccl_config"]
    assert config["CCL_WORKER_OFFLOAD"] == "1"
    assert config["CCL_WORKER_AFFINITY"] == ",".join(str(max(b)) for b in blocks)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    digits.export(folder)
    return str(folder)


def accuracy_spec(make_spec, **fields):
    return make_spec(data="digits", epochs=2, batch_size=32, lr=0.02, warmup_steps=1,
                     time_budget_s=None, **fields)  # fmt: skip


def assert_trained(record: dict) -> dict:
    assert record["status"] == "ok", record.get("error")
    m, spec = record["metrics"], record["spec"]
    # every step of every epoch trained (1437 // 32 = 44 a epoch), all but warm-up timed
    assert m["epochs"] == 2 and m["steps_per_epoch"] == 1437 // 32
    assert len(record["losses"]) == 2 * m["steps_per_epoch"]
    assert m["steps_timed"] == len(record["losses"]) - spec["warmup_steps"]
    assert m["train_samples"] == 2 * m["steps_per_epoch"] * 32
    assert m["test_samples"] == 360 and 0.3 < m["test_accuracy"] <= 1.0  # chance: 0.1
    # the training time is the slowest rank's, and each rank's holds its own steps; the
    # merged step times are per-step maxima over the ranks, whose sum can exceed it
    own_steps = record.get("rank_step_times_s") or [record["step_times_s"]]
    assert m["train_time_s"] >= max(sum(times) for times in own_steps)
    return m


@pytest.fixture(scope="module")
def one_process(upstream_env, digits_dir, tmp_path_factory) -> dict:
    return run(accuracy_spec(spec_of), upstream_env, tmp_path_factory.mktemp("one"),
               data_path=digits_dir)  # fmt: skip


def test_accuracy_of_one_process(one_process):
    m = assert_trained(one_process)
    assert m["test_loss"] < 2.3  # below a uniform guess's log(10)


@needs_two
def test_accuracy_of_two_ranks_gloo_and_ccl(
    upstream_env, oneccl_env, make_spec, digits_dir, tmp_path, one_process
):
    """The ranks score identical models; Gloo and ccl train the same model (the same
    seed, data order and sums), so their accuracy is the same. One process and two ranks
    draw the same global batches (one sampler's permutation, each rank every other
    index of it) and take the same optimizer steps: their first losses agree to float
    rounding (later, rounding differences grow in this chaotic phase of training, so
    the accuracy after a few epochs is not compared)."""
    accuracy = {}
    for backend, env in (("gloo", upstream_env), ("ccl", oneccl_env)):
        spec = accuracy_spec(make_spec, launcher="torchrun", ranks=2, threads=1,
                             dist_backend=backend)  # fmt: skip
        rec = run(spec, env, tmp_path / backend, data_path=digits_dir)
        m = assert_trained(rec)
        assert len(m["rank_test_accuracy"]) == 2
        assert m["rank_test_accuracy"][0] == m["rank_test_accuracy"][1] == m["test_accuracy"]
        accuracy[backend] = m["test_accuracy"]
        assert rec["losses"][:20] == pytest.approx(one_process["losses"][:20], rel=1e-4)
    assert accuracy["gloo"] == pytest.approx(accuracy["ccl"], abs=0.03)


@needs_two
def test_the_weak_scaling_arm_grows_the_batch_and_warms_the_rate_up(
    upstream_env, make_spec, digits_dir, tmp_path
):
    """batch_scaling weak: each rank keeps its batch (16), so 2 ranks train on a global
    batch of 32, and the rate is scaled by 2 and warmed up from the one-process rate
    over the first epoch (the rate each step applied, read from the optimizer); the
    held-out split is scored evals_per_epoch times an epoch, and the time to the target
    accuracy is the training time (scoring excluded) of the first score that reached it."""
    spec = make_spec(data="digits", epochs=2, batch_size=16, lr=0.01, warmup_steps=1,
                     time_budget_s=None, launcher="torchrun", ranks=2, threads=1,
                     batch_scaling="weak", lr_warmup_epochs=1, evals_per_epoch=2,
                     target_accuracy=0.5)  # fmt: skip
    assert spec["batch_size"] == 32 and spec["lr"] == 0.02
    rec = run(spec, upstream_env, tmp_path, data_path=digits_dir)
    m = assert_trained(rec)  # 44 steps an epoch of 32, every one trained
    assert m["learning_rate"] == {
        "one_process": 0.01, "scaled": 0.02, "warmup_steps": 44, "schedule": "constant",
    }  # fmt: skip
    curve = m["accuracy_curve"]
    assert [p["steps"] for p in curve] == [22, 44, 66, 88]
    # the rate of step k (from 0) is 0.01 + 0.01 k / 44 during the warm-up, then 0.02
    expected = [0.01 + 0.01 * 21 / 44, 0.01 + 0.01 * 43 / 44, 0.02, 0.02]
    assert [p["lr"] for p in curve] == pytest.approx(expected)
    assert curve[-1]["test_accuracy"] == m["test_accuracy"]
    times = [p["train_time_s"] for p in curve]
    assert times == sorted(times) and times[-1] == pytest.approx(m["train_time_s"])
    assert m["scoring_s"] > 0
    reached = [p for p in curve if p["test_accuracy"] >= 0.5]
    assert m["time_to_accuracy_s"] == (reached[0]["train_time_s"] if reached else None)


@needs_two
def test_a_reserved_comm_cpu_holds_the_ccl_worker_and_no_torch_thread(
    oneccl_env, make_spec, tmp_path
):
    """comm_cpu: the last CPU of the rank's block goes to oneCCL's worker thread (found
    pinned there in /proc), torch's threads to the others (one fewer of them); without
    it, torch has the whole block. (2 CPUs here: one rank of 2 threads; a world of one
    still starts oneCCL and its worker.)"""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    fields = dict(ranks=1, threads=2, dist_backend="ccl", ccl_worker_offload=True)
    rec = assert_ok(run(ddp_spec(make_spec, comm_cpu=True, **fields), oneccl_env, tmp_path / "on"))
    checks = rec["checks"]
    assert checks["comm_cpu"]["reserved"] == cpus[-1]
    assert checks["ccl_config"]["CCL_WORKER_AFFINITY"] == str(cpus[-1])
    assert checks["threads"] == 1 and checks["cpus"] == str(cpus[0])  # torch: the rest
    assert checks["comm_cpu"]["threads_on_it"], checks["comm_cpu"]  # the worker is there
    assert rec["provenance"]["env"]["OMP_NUM_THREADS"] == "1"
    off = assert_ok(run(ddp_spec(make_spec, **fields), oneccl_env, tmp_path / "off"))
    assert off["checks"]["comm_cpu"] is None and off["checks"]["threads"] == 2


@needs_two
def test_a_failing_rank_fails_the_trial_naming_it(upstream_env, make_spec, tmp_path):
    spec = ddp_spec(make_spec, data="image_folder", data_dir=str(tmp_path / "nowhere"))
    rec = run(spec, upstream_env, tmp_path)
    assert rec["status"] == "failed"
    assert rec["error"]["message"].startswith("rank ")
    assert "does not exist" in rec["error"]["message"]


@needs_two
@pytest.mark.parametrize("variant", ["gloo", "ccl-shm", "ccl-shm-offload"])
def test_collectives_job(variant, upstream_env, oneccl_env, tmp_path, capsys, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"  # (the temporary folder of the run's processes)
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    env = {"upstream": upstream_env, "oneccl": oneccl_env}[collectives.env_of(variant)]
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(env))
    out = tmp_path / f"{variant}.json"
    # each rank count a run of its own, in one record; 3 ranks need 3 CPUs (pinned)
    collectives.main(
        [f"--variant={variant}", f"--env-json={env_json}", f"--out={out}",
         f"--log={tmp_path / 'log'}", "--sizes-kb=1,1024", "--iterations=3", "--ranks=2,3"]
    )  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["ranks"] == [2, 3] and [b["ranks"] for b in rec["by_ranks"]] == [2, 3]
    assert rec["by_ranks"][0]["status"] == "ok", rec["by_ranks"][0]
    if len(os.sched_getaffinity(0)) >= 3:
        assert rec["status"] == "ok", rec.get("error")
    else:  # the count that cannot be placed fails, named; the other's rows stay
        assert rec["status"] == "failed" and rec["by_ranks"][1]["status"] == "failed"
        assert rec["error"]["message"].startswith("3 ranks: ")
        assert "3 ranks need 3 CPUs, but the trial has" in rec["error"]["message"]
    assert not list(tmp_path.glob(f".{variant}.r*"))  # no part left behind
    # nor a log folder of torchrun's (runtimes.measured.elastic_logs)
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []
    ok_counts = [b["ranks"] for b in rec["by_ranks"] if b["status"] == "ok"]
    assert rec["group"]["dist_backend"] == variant.split("-")[0]
    got = {(r["ranks"], r["dtype"], r["bytes"]) for r in rec["results"]}
    assert got == {(n, d, kb * 1024) for n in ok_counts for d in ("float32", "bfloat16")
                   for kb in (1, 1024)}  # fmt: skip
    for r in (r for r in rec["results"] if r["ranks"] == 2):
        lat = r["latency_s"]
        assert 0 < lat["min"] <= lat["median"] <= lat["max"] and lat["loop"] > 0
        assert r["iterations"] == 3 and r["checked_calls"] == 3  # every call checked
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2(n-1)/n = 1 for 2 ranks
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / lat["loop"] / 1e9)
        assert 0 < r["cpu_per_wall"] <= 2.5
        if variant.startswith("ccl"):
            # the backend's own cost per call, from its counters over the timed loop
            o = r["overhead_us"]
            assert o["collectives"] == 3 and 0 < o["handoff_us"] and 0 < o["in_ccl_us"]
            assert o["finish_us"] >= 0 and o["polls"] >= 1
        else:
            assert r["overhead_us"] is None
    if variant.startswith("ccl"):
        assert rec["group"]["ccl_wait"]["mode"] == "backoff"
    assert f"[collectives] {variant} x2,3:" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["gloo", "ccl"])
def test_the_microbenchmark_checks_sums_at_three_ranks(backend, upstream_env, oneccl_env, tmp_path):
    # Three ranks (more than this machine's CPUs may hold: unpinned), rank-dependent data
    # in the timed loop and in every checked call: a sum that is not over all three
    # ranks' own values fails the run.
    env = oneccl_env if backend == "ccl" else upstream_env
    spec = {**collectives.variant_spec("ccl-shm" if backend == "ccl" else "gloo", 3, 120),
            experiment.PIN_KEY: False}  # fmt: skip
    out = tmp_path / "r{rank}.json"
    subprocess.run(
        [env["python"], "-m", "torch.distributed.run", "--nproc-per-node=3",
         "--master-port", str(free_port()), f"--log-dir={tmp_path / 'torchrun'}",
         str(collectives.PROGRAM),
         "--spec-json", json.dumps(spec), "--sizes-kb=1,1000.5", "--dtypes=float32,bfloat16",
         "--iterations=4", f"--out={out}"],
        check=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(3)]
    for res in results:
        assert res["status"] == "ok", res.get("error")
        assert res["rank_cpus"] is None and res["group"]["world_size"] == 3
    rows = results[0]["results"]
    assert {(r["dtype"], r["bytes"]) for r in rows} == {
        ("float32", 1024), ("bfloat16", 1024), ("float32", 1024512), ("bfloat16", 1024512)
    }  # fmt: skip
    for r in rows:
        assert r["checked_calls"] == 4
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 4 / 3)  # 2(n-1)/n


CHECKED_DATA = """
import torch
from workflow_scripts.rank.distributed import allreduce_bench as ab

for n in (1, 3, 8, 10):
    pattern = ab.checked_pattern(n, torch.bfloat16)
    index = torch.arange(n) % ab.PERIOD
    for world in (2, 3, 5):
        for call in (0, 1, 7):
            parts = [ab.checked_data(pattern, r, call) for r in range(world)]
            assert all(p.shape == (n,) for p in parts)
            # element e of rank r: 1 + (r + call + e) % PERIOD
            e = torch.arange(n)
            for r, p in enumerate(parts):
                assert torch.equal(p, ((r + call + e) % ab.PERIOD + 1).to(torch.bfloat16))
            total = torch.stack([p.double() for p in parts]).sum(0).to(torch.bfloat16)
            assert torch.equal(total, ab.checked_expected(index, world, call, torch.bfloat16))
            if n >= ab.PERIOD:
                assert len({tuple(p.tolist()) for p in parts}) == min(world, ab.PERIOD)
                assert len(set(parts[0].tolist())) == ab.PERIOD  # differs along the tensor
            # every wrong element of a sum is found
            assert ab.wrong_elements(total.clone(), world, call) == 0
            spoiled = total.clone()
            spoiled[n - 1] += 1
            spoiled[0] += 1
            assert ab.wrong_elements(spoiled, world, call) == (1 if n == 1 else 2)
for world in (2, 3, 5):
    zero = sum(ab.loop_data(3, torch.float32, r, world) for r in range(world))
    assert torch.equal(zero, torch.zeros(3)), zero
print("checked")
"""


def test_checked_data_sums_are_rank_and_element_dependent(upstream_env):
    out = subprocess.run(
        [upstream_env["python"], "-c", CHECKED_DATA], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and "checked" in out.stdout, out.stderr


def test_variant_names():
    assert collectives.variant_spec("ccl-tcp-offload", 2, 60)["ccl_worker_offload"] is True
    assert collectives.env_of("gloo") == "upstream" and collectives.image_of("ccl-shm") == "oneccl"
    with pytest.raises(ValueError, match="allowed are gloo"):
        collectives.variant_spec("gloo-offload", 2, 60)


@needs_two
def test_ranks_killed_mid_training_leave_nothing_in_dev_shm(oneccl_env, make_spec, tmp_path):
    """oneCCL's shm transport keeps its segments in /dev/shm (libfabric unlinks them only
    at a clean exit): after its ranks are SIGKILLed mid-run, the run removes its own
    ranks' segments, and only theirs."""
    import signal
    import threading
    import time

    from workflow_scripts import shm

    spec = ddp_spec(make_spec, id=f"shm-{os.getpid()}", dist_backend="ccl", steps=100_000,
                    timeout_s=300)  # fmt: skip
    assert spec["ccl_transport"] == "shm"
    # a stand-in for another run's segment on the same host: never touched
    other = shm.SHM / f"{2**22 + os.getpid()}:0:0"
    other.write_bytes(b"")
    done = {}
    worker = threading.Thread(target=lambda: done.update(rec=run(spec, oneccl_env, tmp_path)))
    worker.start()
    try:
        log = tmp_path / "logs" / f"{spec['id']}.log"
        deadline = time.monotonic() + 240
        while not (log.exists() and "step 5/" in log.read_text(errors="replace")):
            assert worker.is_alive() and time.monotonic() < deadline, done
            time.sleep(0.2)
        pids = rank_pids(spec["id"])
        assert len(pids) == 2, pids
        assert shm.segments(pids), "the ranks made no shm segment: nothing to test"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        worker.join(timeout=240)
        assert not worker.is_alive()
        assert done["rec"]["status"] != "ok"
        assert shm.segments(pids) == [], "the killed ranks' segments are still there"
        assert other.exists()
        assert "shared-memory segment(s) the run's processes left" in log.read_text()
    finally:
        other.unlink(missing_ok=True)


@needs_two
def test_a_trials_processes_leave_nothing_in_the_temporary_folder(
    upstream_env, ipex_env, make_spec, tmp_path, monkeypatch
):
    """A rank ends without the interpreter's teardown (run_trial._exit_now), which would
    have removed the folders its imports made (torch._dynamo's for RemoteModule's code,
    which transformers and torchvision import; multiprocessing's pymp-* for a
    DataLoader's workers); torchrun leaves its log folder (torchelastic_*) for every
    run. A two-rank torchrun trial whose ranks load their data in a worker process
    leaves nothing behind in the temporary folder; an IPEX trial (torch 2.8's
    torch._dynamo makes a folder as it is imported) leaves only its compile pool's."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    spec = ddp_spec(make_spec, id="nothing-left", data="per_sample", num_workers=1, steps=3,
                    warmup_steps=1)  # fmt: skip
    record = run(spec, upstream_env, tmp_path / "out")
    assert_ranks(assert_ok(record), 2)
    assert sorted(p.name for p in scratch.iterdir()) == []
    spec = make_spec(id="nothing-left-ipex", backend="ipex", ipex_optimize=True, steps=2,
                     warmup_steps=1)  # fmt: skip
    assert_ok(run(spec, ipex_env, tmp_path / "out"), torch="2.8.")
    # what stays: torch's own compile cache (shared by every run on the machine), and the
    # folder of the compile pool that IPEX's import starts (a process of its own, killed
    # with the trial's process group: ending it cleanly costs 1.0 s a trial); the rank's
    # own folder is gone (before: 2 folders)
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")]
    assert len(left) <= 1 and all(name.startswith("tmp") for name in left), left
