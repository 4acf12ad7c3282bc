"""A calibration and a machine for the study's estimate, made by hand (the estimate's
and the progress line's tests)."""

from __future__ import annotations

from workflow_scripts.plan import estimate


def calibration(fp32_2t=100.0, startup=3.0, bf16_ratio=2.0, wall=40.0) -> dict:
    return {
        "ceiling": [
            {"threads": 1, "fp32_gflops": fp32_2t / 2, "bf16_gflops": 1.0},
            {"threads": 2, "fp32_gflops": fp32_2t, "bf16_gflops": 1.0},
        ],
        "train_proxy": {"bf16_over_fp32": bf16_ratio},
        "startup_s": startup,
        "process_wall_s": wall,
    }


def machine(cal=None, quick=None, flags=(), cpus=2, container=False) -> estimate.Machine:
    return estimate.Machine({"upstream": cal}, quick, cpus, flags, container)
