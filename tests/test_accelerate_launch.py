"""Real trials through ``accelerate launch`` (workflow_scripts/rank/accelerate_launch.py,
the launcher ``accelerate``: tests/test_accelerate.py): one process in the upstream
environment against the study's own loop, two ranks by mpirun over Gloo and the study's
ccl against torchrun's DDP, and the legacy ipex_config on IPEX."""

from __future__ import annotations

import json

import pytest

from tests.trials import TWO_CPUS, assert_ok, bert, run

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def accelerated(rec: dict, processes: int, mixed: str = "no") -> dict:
    acc = rec["checks"]["accelerate"]
    assert acc["command"].startswith("accelerate launch --config_file ")
    out = acc["command"].split(" --out ")[1].strip("'")
    assert out.endswith(".harness.json") and "--spec-json SPEC " in acc["command"]
    assert acc["config"]["use_cpu"] is True and acc["config"]["num_processes"] == processes
    assert acc["num_processes"] == processes and acc["mixed_precision"] == mixed
    assert acc["distributed_type"] == ("MULTI_CPU" if processes > 1 else "NO")
    assert rec["provenance"]["versions"]["accelerate"]
    return acc


def test_one_process_is_the_studys_own_loop(upstream_env, make_spec, tmp_path):
    """Accelerate's step (prepare, autocast, backward) on one process computes what the
    study's plain loop computes: the same losses from the same seed and batch."""
    plain = assert_ok(run(bert(make_spec, id="plain"), upstream_env, tmp_path))
    spec = bert(make_spec, id="acc", launcher="accelerate")
    rec = assert_ok(run(spec, upstream_env, tmp_path))
    accelerated(rec, 1)
    assert rec["losses"] == pytest.approx(plain["losses"], rel=1e-4)
    assert rec["provenance"]["versions"]["accelerate"].startswith("1.15")
    bf16 = assert_ok(run(bert(make_spec, id="acc-bf16", launcher="accelerate",
                              precision="bf16"), upstream_env, tmp_path))  # fmt: skip
    accelerated(bf16, 1, "bf16")
    assert bf16["losses"] != rec["losses"]  # bf16 autocast computed something else
    assert bf16["losses"] == pytest.approx(rec["losses"], abs=0.05)
    # the dtype in effect, read inside the model where Accelerate's autocast runs (its
    # forward's outputs are converted back to fp32 after it)
    assert bf16["checks"]["output_dtype"] == "bfloat16"
    assert bf16["checks"]["output_dtype_of"] == "classifier"
    assert rec["checks"]["output_dtype"] == "float32"
    # Accelerate's step is another step: compared with fp64 and eager bf16, and passes
    check = bf16["gradient_check"]
    assert check["ok"] and check["comparison"]["own_precision_reference"] == "eager"


@pytest.mark.skipif(not TWO_CPUS, reason="two ranks need two CPUs")
def test_two_ranks_by_mpirun_train_torchruns_ddp_model(oneccl_env, make_spec, tmp_path):
    """Accelerate's multi-CPU launch: mpirun starts 2 ranks, each pinned to its own CPU,
    training one DDP model with the losses of torchrun's DDP at the same settings (over
    the study's ccl: the quick preset runs both process groups, see test_workflow)."""
    ddp = assert_ok(run(bert(make_spec, id="torchrun", launcher="torchrun", ranks=2,
                             dist_backend="ccl"), oneccl_env, tmp_path))  # fmt: skip
    spec = bert(make_spec, id="acc-ccl", launcher="accelerate", ranks=2, dist_backend="ccl")
    rec = assert_ok(run(spec, oneccl_env, tmp_path))
    acc = accelerated(rec, 2)
    assert acc["config"]["mpirun_config"]["mpirun_hostfile"].endswith("hostfile")
    checks = rec["checks"]
    assert checks["world_size"] == 2 and checks["dist_backend"] == "ccl"
    assert "study" in checks["ccl"]
    cpus = [set(c.split(",")) for c in checks["rank_cpus"]]
    assert not set.intersection(*cpus), "ranks share a core"
    assert rec["losses"] == pytest.approx(ddp["losses"], rel=1e-3)
    log = (tmp_path / "logs" / f"{spec['id']}.log").read_text()
    assert json.loads(log.split("accelerate config: ", 1)[1].splitlines()[0]) == acc["config"]


def test_the_legacy_stack_applies_ipex_config(ipex_env, make_spec, tmp_path):
    """Accelerate 1.7.0 on IPEX with ipex_config: prepare() calls ipex.optimize. In bf16
    that needs AVX-512 (or AVX-NE-CONVERT) for its weight prepack: elsewhere the record
    says so."""
    spec = bert(make_spec, id="legacy", launcher="accelerate", backend="ipex",
                accelerate_ipex=True)  # fmt: skip
    rec = run(spec, ipex_env, tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    assert accelerated(rec, 1)["use_ipex"] is True
    assert rec["provenance"]["versions"]["accelerate"] == "1.7.0"
    assert "'fuse_update_step'" in (tmp_path / "logs" / "legacy.log").read_text()  # IPEX's
    spec = bert(make_spec, id="legacy-bf16", launcher="accelerate", backend="ipex",
                accelerate_ipex=True, precision="bf16")  # fmt: skip
    bf16 = run(spec, ipex_env, tmp_path)
    if bf16["status"] != "ok":
        assert "BF16 weight prepack needs" in bf16["error"]["message"], bf16["error"]
    else:
        assert accelerated(bf16, 1, "bf16")["use_ipex"] is True
        # Accelerate's ipex.optimize(dtype=bf16) holds the weights in bf16: so does the
        # gradient check's own-precision reference
        check = bf16["gradient_check"]
        assert check["ok"] and check["comparison"]["own_precision_reference"] == (
            "eager with bf16 weights"
        )
