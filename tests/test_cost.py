"""The study's own cost on any CPU: the calibration and the noise probe bounded in time
(real matmuls, in the real upstream environment), and the time estimate against real
trials."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.trials import policy
from workflow_scripts import calibration, runtimes, sysinfo
from workflow_scripts.plan import estimate
from workflow_scripts.rank import probe
from workflow_scripts.runtimes.base import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# Too big for any CPU this study runs on within a budget of seconds: 2 x 32768^3 =
# 70 TFLOP, over a minute even at 1 TFLOP/s.
HUGE = 32768


def in_env(env: dict, code: str, timeout: float = 600) -> dict:
    res = subprocess.run(
        [env["python"], "-c", code], env=runtimes.for_env(env).environment(), cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def native_bf16() -> bool:
    return estimate.bf16_native(sysinfo.topology()["cpu_flags"])


def test_a_calibration_with_a_size_too_slow_for_any_cpu_stays_within_its_budget(
    upstream_env, tmp_path
):
    """The ceiling search predicts each size's cost and skips what would overrun its
    budget: 32768 is skipped on any CPU, and the whole calibration stays within the sum
    of its measurements' budgets (plus each dtype's pilots)."""
    out = tmp_path / "cal.json"
    budget = 2.0
    code = f"""
import json, time
from workflow_scripts.rank import probe
t0 = time.perf_counter()
result = probe.calibrate([512], threads="auto", repeats=1, ceiling_sizes=(1024, {HUGE}),
                         ceiling_budget_s={budget})
result["elapsed"] = time.perf_counter() - t0
open({str(out)!r}, "w").write(json.dumps(result))
print(json.dumps({{"ok": True}}))
"""
    in_env(upstream_env, code)
    cal = json.loads(out.read_text())
    for c in cal["ceiling"]:
        for dtype in probe.DTYPES:
            skipped = c["skipped"].get(dtype, {})
            # the huge size never ran: skipped with its predicted cost, or never reached
            assert str(HUGE) not in c["sizes"][dtype]
            assert c[f"{dtype}_gflops"] > 0  # a rate, measured at a size that fits
            if c["emulated"][dtype]:
                assert c[f"{dtype}_size"] == probe.EMULATED_SIZE and "emulated" in str(skipped)
            elif str(HUGE) in skipped:
                assert (
                    "predicted" in skipped[str(HUGE)]
                    and f"{budget:g} s budget" in (skipped[str(HUGE)])
                )
        assert not c["emulated"]["fp32"]
        if native_bf16():  # AVX-512 BF16 / AMX: a real ceiling at the usual sizes
            assert not c["emulated"]["bf16"] and c["bf16_size"] == 1024
    # fp32 reached 1024 and stopped before the huge size, at every thread count
    assert all(c["fp32_size"] == 1024 and str(HUGE) in c["skipped"]["fp32"] for c in cal["ceiling"])
    # the bound: per thread count and dtype, one size within its budget (a measurement can
    # overrun its prediction by what one matmul costs more than predicted: x3 margin)
    per_count = len(probe.DTYPES) * 3 * budget + 10
    assert cal["elapsed"] < len(cal["ceiling"]) * per_count + 20, cal["elapsed"]
    # the bf16/fp32 ratios the estimate scales by: a convolution net's, a transformer's
    for key, shape in (("train_proxy", probe.PROXY_SHAPE), ("text_proxy", probe.TEXT_PROXY_SHAPE)):
        proxy = cal[key]
        assert proxy["shape"] == list(shape)
        assert proxy["seconds"]["fp32"] > 0 and proxy["bf16_over_fp32"] > 0
        assert proxy["elapsed_s"] < 2 * probe.PROXY_BUDGET_S + 5
    # before any calibration the estimate takes the ratio from the CPU's flags (native
    # 0.5x, emulated on AVX-512 3.5x, on AVX2 20x): where bf16 is emulated, within 3x of
    # what the proxies measure (where it is native the small proxies' ratio is not pinned
    # down on every kind: AMX's tiles, autocast's casts)
    guess = estimate.Machine({}, None, 2, sysinfo.topology()["cpu_flags"]).bf16_ratio("upstream")
    for key in ("train_proxy", "text_proxy"):
        ratio = cal[key]["bf16_over_fp32"] / guess
        assert native_bf16() or 1 / 3 < ratio < 3, (key, cal[key], guess)


def test_the_probe_skips_a_dtype_over_its_budget_and_says_why(upstream_env):
    code = """
import json
from workflow_scripts.rank import probe
tight = probe.run(1024, budget_s=0.001)
usual = probe.run(1024)
print(json.dumps({"tight": tight, "usual": usual}))
"""
    res = in_env(upstream_env, code)
    tight, usual = res["tight"], res["usual"]
    # over its budget (any CPU: a measurement takes 0.3 s at least), bf16 is skipped with
    # its predicted cost; fp32, what the noise signals read, is measured whatever it costs
    assert tight["bf16_gflops"] is None and "fp32" not in tight["skipped"]
    assert "at size 1024 (over the 0.001 s budget)" in tight["skipped"]["bf16"]
    assert tight["fp32_gflops"] > 0
    assert usual["fp32_gflops"] > 0
    if native_bf16():
        assert usual["bf16_gflops"] > 0 and not usual["skipped"]
    # whatever the CPU: the probe's cost stays within its budget per dtype, plus pilots
    assert usual["seconds"] < len(probe.DTYPES) * (probe.PROBE_BUDGET_S + 0.5)


def test_an_fp32_measurement_needs_no_pilot_to_stay_within_its_time(upstream_env):
    # (torch.matmul counted: each window is one matmul or more, the warm-up one more)
    code = """
import json, torch
from workflow_scripts.rank import probe
calls = [0]
matmul = torch.matmul
def counted(*args, **kwargs):
    calls[0] += 1
    return matmul(*args, **kwargs)
torch.matmul = counted
out = {}
for name, size, seconds, windows in (("tiny_window", 512, 1e-6, None),
                                     ("fixed", 512, 1e-6, 3), ("usual", 256, 0.06, None)):
    calls[0] = 0
    rate = probe.matmul_gflops(size, "fp32", seconds, windows)
    out[name] = {"rate": rate, "calls": calls[0]}
fp32_only = probe.run(256, min_seconds=0.03, dtypes=probe.dtypes_for("fp32"))
both = probe.run(256, min_seconds=0.03, dtypes=probe.dtypes_for("bf16"))
print(json.dumps({**out, "fp32_only": fp32_only, "both": both}))
"""
    res = in_env(upstream_env, code)
    # a matmul that outlasts the whole measurement ends it after one window (warm-up + 1),
    # where three fixed windows take three; a quick one fills all three windows
    assert res["tiny_window"]["calls"] == 2 and res["fixed"]["calls"] == 4
    assert res["usual"]["calls"] >= 4 and res["usual"]["rate"] > 0
    # an fp32 run's probe measures fp32 alone; a bf16 run's bf16 too (or says why not)
    assert set(k for k in res["fp32_only"] if k.endswith("_gflops")) == {"fp32_gflops"}
    assert res["fp32_only"]["fp32_gflops"] > 0 and not res["fp32_only"]["skipped"]
    assert (res["both"]["bf16_gflops"] or 0) > 0 or "predicted" in res["both"]["skipped"]["bf16"]


def test_the_estimate_against_real_trials(upstream_env, make_spec, tmp_path):
    """Three small trials, run for real with a real calibration: each record keeps its
    estimate beside its wall time; together they are within a factor of 2."""
    # the calibration as its rule runs it: around the process, so its start is measured
    reference = calibration.calibrate(
        upstream_env, tmp_path / "upstream.json", tmp_path / "calibration.log", [1024],
        repeats=1, ceiling_sizes=(1024, 2048),
    )  # fmt: skip
    assert not reference.get("error"), reference.get("error")
    assert reference["startup_s"] > 0 and reference["dynamo_import_s"] >= 0
    # a second start, warm, is what a trial's process pays: the estimate takes it
    warm = reference["warm_startup_s"]
    assert warm > 0
    assert estimate.Machine({"upstream": reference}, None, 2, []).process_start("upstream") == warm
    specs = [
        make_spec(id="cnn-fp32", steps=20),
        make_spec(id="cnn-bf16", precision="bf16", steps=5),
        make_spec(id="r18", model="resnet18", image_size=64, batch_size=8, steps=5),
    ]
    estimated = walls = 0.0
    for spec in specs:
        out = tmp_path / "records" / spec["id"] / "trial0.json"
        log = tmp_path / "logs" / f"{spec['id']}.log"
        rec = policy(spec, upstream_env, out, log, reference=reference, max_retries=0)
        assert rec["status"] == "ok", rec.get("error")
        est = rec["estimate"]
        assert est["basis"] == "calibration" and est["seconds"] > 0
        assert rec["trial_wall_s"] >= rec["provenance"]["process_wall_s"]
        # the estimate's FLOPs are the harness's count (FlopCounterMode), within 10 %
        counted = rec["metrics"]["flops_per_sample"]
        assert estimate.train_flops_per_sample(spec) == pytest.approx(counted, rel=0.10)
        estimated += est["seconds"]
        walls += rec["trial_wall_s"]
    assert 0.5 <= walls / estimated <= 2.0, (walls, estimated)
