"""Noise probe: how fast this process multiplies dense matrices, right now.

A short calibration run of ``torch.matmul`` on two N x N matrices, in fp32 and in
bf16, each repeated (after one warm-up) until at least ``min_seconds`` have
passed, reported as GFLOP/s (2 N^3 floating-point operations per matmul). The
harness runs it in the training process just before the steps, so it sees the
same threads, pinning and allocator; a trial whose probe is well below what the
machine usually reaches was disturbed by something else running.

Bounded in time on any CPU: before a dtype is measured at a size, a pilot matmul
at :data:`PILOT_SIZE` (milliseconds even where the dtype is emulated) predicts
what the measurement will cost, and a measurement predicted to take longer than
its budget is skipped, with the prediction recorded. Without AVX-512 BF16 or AMX,
torch's bf16 matmul is emulated (~1 GFLOP/s at 1024 on 2 cores, ~180x below
fp32): the probe then measures fp32 only (the noise signals read fp32), and the
calibration records bf16 as ``emulated`` with the rate of a size that costs
seconds, not minutes.

Standard library and torch only (it runs in the backend environments); torch is
imported inside the functions, so the trial policy and the report can use the pure
helpers (:func:`summarize`, :func:`reference_rate`) without it.

    python -m workflow_scripts.rank.probe --size 1024                # one probe, as JSON
    python -m workflow_scripts.rank.probe --calibrate --sizes 1024 --threads auto --repeats 3 \\
        --out results/calibration/upstream.json                    # the reference
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from ..util import finite, int_list, write_json_atomic

DEFAULT_SIZE = 1024
MIN_SECONDS = 0.3
# A measurement's time is split into this many windows; the fastest one counts.
WINDOWS = 3
DTYPES = ("fp32", "bf16")
# The sizes the calibration tries for the machine's matmul ceiling (the best of them);
# larger ones are skipped once a size runs slower than the one before it.
CEILING_SIZES = (1024, 2048, 4096)
CEILING_REPEATS = 2
# The pilot matmul that predicts a measurement's cost: 256^3 x 2 = 34 MFLOP, ~35 ms
# at 1 GFLOP/s (emulated bf16), well under a millisecond where the dtype is native.
PILOT_SIZE = 256
# The most one measurement may cost (predicted from the pilot or the last size):
# a probe dtype (warm-up + timed matmuls) in a trial, and one ceiling size (all its
# repeats) in the calibration. fp32 at 4096 on one AVX2 core costs ~6 s; emulated
# bf16 at 2048 about 4 minutes.
PROBE_BUDGET_S = 1.5
CEILING_BUDGET_S = 5.0
# A dtype whose rate is below this share of fp32's at the same size is emulated
# (no native instructions): its ceiling search stops at that size. One whose pilot
# already says so is measured once at EMULATED_SIZE only (0.3 GFLOP: ~0.5 s at the
# ~1 GFLOP/s of emulated bf16, where 1024 took 6 s and 2048 minutes).
EMULATED_BELOW = 0.25
EMULATED_SIZE = 512


def load_avg() -> list[float] | None:
    try:
        return [round(x, 3) for x in os.getloadavg()]
    except OSError:
        return None


#: the probe's matrices in memory of their own (see :func:`_matrices`); False: torch's
#: allocator, as before (tests/benchmarks/prework_faults.py compares the two)
OUTSIDE_HEAP = True


def _outside_heap(size: int, torch_dtype):
    """A size x size tensor in an anonymous mapping of its own, which glibc's allocator
    never sees: the tensor's end unmaps it (``torch.frombuffer`` holds the mapping)."""
    import mmap

    import torch

    count = size * size
    nbytes = count * torch.finfo(torch_dtype).bits // 8
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch_dtype, count=count).view(size, size)


def _matrices(size: int, dtype: str):
    """Two size x size inputs of ``dtype`` from a private generator (the global RNG,
    which the training data may use, is left alone) and the output they multiply into.

    In memory of their own (:data:`OUTSIDE_HEAP`): allocated and freed by torch's
    allocator, the probe's 4 MB matrices (256 KB for a pilot) moved glibc's heap (its
    dynamic mmap threshold and where its free memory lies) before the steps, and a
    ResNet-50 step then took fewer page faults and ran up to about 10 % faster than
    the same step in a process that had not probed (tests/benchmarks/prework_faults.py)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(1234)
    if not OUTSIDE_HEAP:
        a = torch.randn(size, size, generator=gen).to(torch_dtype)
        b = torch.randn(size, size, generator=gen).to(torch_dtype)
        return a, b, None  # (a new output every matmul)
    a, b, out = (_outside_heap(size, torch_dtype) for _ in range(3))
    a.normal_(generator=gen)
    b.normal_(generator=gen)
    return a, b, out


def matmul_gflops(
    size: int, dtype: str, min_seconds: float = MIN_SECONDS, windows: int | None = WINDOWS
) -> float:
    """GFLOP/s of ``torch.matmul`` on two size x size CPU matrices of ``dtype``.

    One untimed warm-up, then matmuls for ``min_seconds`` in ``windows`` equal windows
    (each at least one matmul); the fastest window's rate. The fastest: the first tenth
    of a second after a pause runs slow on a VM (here 42-48 GFLOP/s, then 61-66), and
    one window of a whole probe read 0.6-0.7 x the calibration's median of three; a
    process competing for the CPUs slows every window. ``windows=None``: windows of
    ``min_seconds / WINDOWS``, up to :data:`WINDOWS` of them, until ``min_seconds`` have
    passed (where one matmul outlasts a window, fewer windows: no pilot is needed to
    bound the cost)."""
    import torch

    a, b, out = _matrices(size, dtype)
    flop = 2.0 * size**3
    best = 0.0
    count = WINDOWS if windows is None else max(1, windows)
    window_s = min_seconds / count
    with torch.no_grad():
        torch.matmul(a, b, out=out)  # warm-up: packing, thread pool, kernel selection
        start = time.perf_counter()
        for _ in range(count):
            reps = 0
            t0 = time.perf_counter()
            while True:
                torch.matmul(a, b, out=out)
                reps += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= window_s:
                    break
            best = max(best, flop * reps / elapsed / 1e9)
            if windows is None and time.perf_counter() - start >= min_seconds:
                break
    return best


def pilot_gflops(dtype: str, size: int = PILOT_SIZE, min_seconds: float = 0.05) -> float:
    """A first rate of ``dtype`` at a small size, what predicts the cost of a real
    measurement: the fastest of the timed matmuls after a warm-up, at least two and at
    least ``min_seconds`` of them (about 0.1 s where the dtype is emulated, less
    elsewhere). The fastest: a first call's thread-pool start or a preempted call would
    otherwise make the real measurement look dearer than it is."""
    import torch

    a, b, out = _matrices(size, dtype)
    best = math.inf
    with torch.no_grad():
        torch.matmul(a, b, out=out)
        start = time.perf_counter()
        calls = 0
        while calls < 2 or time.perf_counter() - start < min_seconds:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
            calls += 1
    return 2.0 * size**3 / max(best, 1e-9) / 1e9


def pilot_cost(
    dtype: str, size: int, min_seconds: float, budget_s: float, repeats: int = 1
) -> tuple[float, float]:
    """(pilot GFLOP/s, predicted seconds) of measuring ``dtype`` at ``size``. A pilot
    that predicts more than the budget is taken again and the faster one kept: the
    first matmuls of a process pay one-off costs (here the first pilot on a busy
    machine read 2 GFLOP/s fp32, the next ones 72)."""
    rate = pilot_gflops(dtype)
    cost = predicted_seconds(size, rate, min_seconds, repeats)
    if cost > budget_s:
        rate = max(rate, pilot_gflops(dtype))
        cost = predicted_seconds(size, rate, min_seconds, repeats)
    return rate, cost


def one_matmul_s(size: int, gflops: float) -> float:
    return 2.0 * size**3 / (max(gflops, 1e-9) * 1e9)


def windows_for(size: int, gflops: float, min_seconds: float) -> int:
    """:data:`WINDOWS` where a window holds a few matmuls, else one window (a size whose
    single matmul takes longer than a window gains nothing from splitting)."""
    return WINDOWS if WINDOWS * one_matmul_s(size, gflops) <= min_seconds else 1


def predicted_seconds(size: int, gflops: float, min_seconds: float, repeats: int = 1) -> float:
    """What :func:`matmul_gflops` will cost ``repeats`` times at ``size`` for a dtype that
    runs at ``gflops`` (with :func:`windows_for`'s windows): each call's warm-up matmul,
    then at least one timed matmul per window and at least ``min_seconds``."""
    one = one_matmul_s(size, gflops)
    return repeats * (one + max(windows_for(size, gflops, min_seconds) * one, min_seconds))


def skip_reason(size: int, gflops: float, seconds: float, budget_s: float, basis: str) -> str:
    return (
        f"skipped: predicted {seconds:.1f} s at size {size} (over the {budget_s:g} s budget) "
        f"from {gflops:.2f} GFLOP/s {basis}"
    )


def run(
    size: int = DEFAULT_SIZE,
    min_seconds: float = MIN_SECONDS,
    budget_s: float | None = PROBE_BUDGET_S,
    dtypes: tuple[str, ...] = DTYPES,
) -> dict:
    """One probe in this process, with its current threads (the record's ``probe``):
    fp32's rate at ``size``, and each other dtype of ``dtypes`` unless its pilot predicts
    that measuring it would take longer than ``budget_s`` (None: no limit); then its rate
    is None and ``skipped`` says why (emulated bf16 on an AVX2 CPU: ~5 s at 1024, against
    0.3 s for fp32). fp32 is always measured (the noise signals read it, and a disturbed
    machine makes a pilot slow too: skipping it would hide the disturbance), so it has
    no pilot: its windows end once ``min_seconds`` have passed, whatever its speed."""
    import torch

    before = load_avg()
    t0 = time.perf_counter()
    rates: dict = {}
    skipped: dict = {}
    for d in dtypes:
        windows: int | None = WINDOWS
        if budget_s is not None and d == "fp32":
            windows = None
        elif budget_s is not None:
            pilot, cost = pilot_cost(d, size, min_seconds, budget_s)
            if cost > budget_s:
                rates[f"{d}_gflops"] = None
                skipped[d] = skip_reason(size, pilot, cost, budget_s, f"at {PILOT_SIZE}")
                continue
            windows = windows_for(size, pilot, min_seconds)
        rates[f"{d}_gflops"] = matmul_gflops(size, d, min_seconds, windows)
    return {
        **rates,
        "size": size,
        "threads": torch.get_num_threads(),
        "load_avg_before": before,
        "seconds": time.perf_counter() - t0,
        "budget_s": budget_s,
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- reference


def summarize(runs: list[dict]) -> dict:
    """The median rate of each dtype over several probes of one size and thread count."""
    out: dict = {}
    for d in DTYPES:
        values = [r[f"{d}_gflops"] for r in runs if finite(r.get(f"{d}_gflops"))]
        out[f"{d}_gflops"] = statistics.median(values) if values else None
    first = runs[0] if runs else {}
    out["size"] = first.get("size")
    out["threads"] = first.get("threads")
    out["runs"] = runs
    return out


def dtypes_for(precision: str | None) -> tuple[str, ...]:
    """What a trial of ``precision`` probes: fp32, what the noise signals read, and bf16
    where the run computes in it (its ceiling is the faster of the two:
    :func:`peak_rate`). An fp32 or INT8 run's probe has no bf16 rate."""
    return DTYPES if precision == "bf16" else ("fp32",)


def peak_rate(probe_result: dict, precision: str) -> tuple[str, float | None]:
    """(dtype, GFLOP/s) of the ceiling for a run of this precision (int8: none, the
    calibration measures no INT8 kernel; its float ceilings are no bound for it)."""
    if precision == "int8":
        return "int8", None
    fp32 = probe_result.get("fp32_gflops")
    if precision != "bf16":
        return "fp32", fp32
    bf16 = probe_result.get("bf16_gflops")
    if bf16 is not None and (fp32 is None or bf16 >= fp32):
        return "bf16", bf16
    return "fp32", fp32


def ceiling(
    sizes: tuple[int, ...] = CEILING_SIZES,
    repeats: int = CEILING_REPEATS,
    min_seconds: float = MIN_SECONDS,
    budget_s: float | None = CEILING_BUDGET_S,
    conv: bool = True,
) -> dict:
    """The machine's dense ceiling with this process's current threads: per dtype, the
    best rate of torch's own dense kernels: ``torch.matmul`` (over ``repeats`` runs at
    each of ``sizes``: 1024 barely saturates a big machine; 4096 does) and, with
    ``conv``, a 3x3 convolution in channels_last (:data:`CONV_SHAPE`, oneDNN's kernel:
    faster than matmul where the BLAS does not use the CPU's widest vectors, as MKL on
    AMD); ``<dtype>_kernel`` says which, ``<dtype>_matmul_gflops`` keeps matmul's. The
    best, not the median: a ceiling is what the CPUs can do, and a disturbance only ever
    lowers a rate. A size that runs slower than
    the one before it ends the search for that dtype (the matrices outgrew the caches
    and the rate will not come back).

    Bounded in time: a pilot matmul (:func:`pilot_gflops`), then the last measured rate,
    predicts each size's cost; a size predicted over ``budget_s`` runs once instead of
    ``repeats`` times, or not at all (``skipped`` says why), and ends the search. A dtype
    slower than :data:`EMULATED_BELOW` x fp32 at the same size is ``emulated``: its
    search ends there, with the rate of a size that costs seconds."""
    import torch

    out: dict = {"threads": torch.get_num_threads(), "sizes": {}, "skipped": {},
                 "emulated": {}, "pilot": {}}  # fmt: skip
    for d in DTYPES:
        best, best_size, rates, notes = None, None, {}, {}
        rate = out["pilot"][d] = pilot_cost(d, sizes[0], min_seconds, budget_s or math.inf)[0]
        basis = f"at the pilot size {PILOT_SIZE}"
        emulated = False
        fp32_pilot = out["pilot"]["fp32"]
        tried, runs_at_most = sizes, repeats
        if d != "fp32" and budget_s is not None and rate < EMULATED_BELOW * fp32_pilot:
            tried, runs_at_most = (EMULATED_SIZE,), 1
            notes["pilot"] = (
                f"emulated: its pilot ran at {rate:.2f} GFLOP/s, below {EMULATED_BELOW:g} x "
                f"fp32's {fp32_pilot:.1f} at {PILOT_SIZE}; measured once at {EMULATED_SIZE} only"
            )
        for size in tried:
            runs = runs_at_most
            if budget_s is not None:
                if predicted_seconds(size, rate, min_seconds, repeats) > budget_s:
                    runs = 1
                cost = predicted_seconds(size, rate, min_seconds, runs)
                if cost > budget_s:
                    notes[size] = skip_reason(size, rate, cost, budget_s, basis)
                    break
            windows = windows_for(size, rate, min_seconds)
            rate = max(matmul_gflops(size, d, min_seconds, windows) for _ in range(runs))
            basis = f"at size {size}"
            rates[size] = rate
            fp32 = out["sizes"].get("fp32", {}).get(size, fp32_pilot if "pilot" in notes else None)
            emulated = d != "fp32" and fp32 is not None and rate < EMULATED_BELOW * fp32
            if best is not None and rate < best:
                break
            best, best_size = rate, size
            if emulated and "pilot" not in notes:
                notes[size] = (
                    f"emulated: {rate:.2f} GFLOP/s, below {EMULATED_BELOW:g} x fp32's "
                    f"{fp32:.1f} at size {size}; larger sizes not tried"
                )
                break
        if best is None and rates == {} and out["pilot"][d] > 0:
            # nothing fitted the budget: the pilot's rate, so labelled, is all there is
            best, best_size = out["pilot"][d], PILOT_SIZE
            emulated = d != "fp32" and out["pilot"][d] < EMULATED_BELOW * out["pilot"]["fp32"]
        out[f"{d}_matmul_gflops"] = best
        out[f"{d}_gflops"] = best
        out[f"{d}_size"] = best_size
        out[f"{d}_kernel"] = "matmul"
        out["sizes"][d] = rates
        out["emulated"][d] = emulated
        if notes:
            out["skipped"][d] = {str(k): v for k, v in notes.items()}
        if conv and not emulated:
            measured = out.setdefault("conv", {})[d] = conv_ceiling(d, min_seconds, budget_s)
            rate = measured.get("gflops")
            if finite(rate) and (best is None or rate > best):
                out[f"{d}_gflops"], out[f"{d}_kernel"] = rate, "conv3x3"
    return out


def with_probes(top: dict, runs: list[dict], sizes: tuple[int, ...]) -> dict:
    """The ceiling ``top`` with the matmuls of the noise probes ``runs`` taken in: a
    probe at the ceiling's thread count and one of its ``sizes`` is ``torch.matmul``
    too, and where one ran faster than the ceiling's search at that size (the machine
    was quieter then), the dtype's ceiling (``<dtype>_gflops``, what a run's % of peak
    divides by) is at least that rate, kernel ``matmul``; ``from_probes`` keeps those
    rates by size. What the search measured stays as it was: ``sizes``,
    ``<dtype>_matmul_gflops`` and ``<dtype>_size`` (the rates the time estimate's
    constants were set against), its stops and ``emulated`` (a dtype found emulated
    takes in nothing)."""
    lifted: dict = {}
    for r in runs:
        if r.get("threads") != top.get("threads") or r.get("size") not in sizes:
            continue
        for d in DTYPES:
            rate = r.get(f"{d}_gflops")
            searched = ((top.get("sizes") or {}).get(d) or {}).get(r["size"]) or 0.0
            if (top.get("emulated") or {}).get(d) or not finite(rate) or rate <= searched:
                continue
            at = lifted.setdefault(d, {})
            at[r["size"]] = max(rate, at.get(r["size"], 0.0))
    if not lifted:
        return top
    out = {**top, "from_probes": lifted}
    for d, rates in lifted.items():
        best = max(rates.values())
        if best > (out.get(f"{d}_gflops") or 0.0):
            out[f"{d}_gflops"], out[f"{d}_kernel"] = best, "matmul"
    return out


# The convolution the ceiling also measures: a 3x3 convolution of 256 channels on 28 x 28
# maps, batch 8, channels_last (7.4 GFLOP a call), oneDNN's kernel, as a CNN's training
# runs it. On AMD CPUs torch's fp32 matmul goes through MKL, which does not use AVX-512
# there: on a 2-vCPU Zen 5 matmul reached 214 GFLOP/s and this convolution ~500, and a
# ResNet-50 training step 225 (then "104% of the ceiling"). Its pilot: 64 channels on
# 14 x 14, batch 1 (58 MFLOP).
CONV_SHAPE = (8, 256, 28)
CONV_PILOT_SHAPE = (1, 64, 14)


def conv_flops(shape: tuple[int, int, int]) -> float:
    batch, channels, size = shape
    return 2.0 * batch * channels * channels * 9 * size * size


def conv_gflops(
    dtype: str, shape: tuple[int, int, int] = CONV_SHAPE, min_seconds: float = MIN_SECONDS
) -> float:
    """GFLOP/s of a 3x3 convolution (``shape``: batch, channels in and out, map size) of
    ``dtype`` in channels_last: the fastest of :data:`WINDOWS` windows after a warm-up,
    as :func:`matmul_gflops`."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    batch, channels, size = shape
    gen = torch.Generator().manual_seed(1234)
    cl = torch.channels_last
    x = torch.randn(batch, channels, size, size, generator=gen).to(torch_dtype, memory_format=cl)
    w = torch.randn(channels, channels, 3, 3, generator=gen).to(torch_dtype, memory_format=cl)
    flop = conv_flops(shape)
    conv = torch.nn.functional.conv2d
    best = 0.0
    with torch.no_grad():
        conv(x, w, padding=1)  # warm-up: the primitive's creation and its weights' layout
        one = None
        for _ in range(WINDOWS):
            reps = 0
            t0 = time.perf_counter()
            while True:
                conv(x, w, padding=1)
                reps += 1
                elapsed = time.perf_counter() - t0
                if one is None:
                    one = elapsed
                if elapsed >= min_seconds / WINDOWS:
                    break
            best = max(best, flop * reps / elapsed / 1e9)
            if one is not None and one * WINDOWS > min_seconds:
                break  # one call fills a window: more windows add nothing
    return best


def conv_ceiling(dtype: str, min_seconds: float, budget_s: float | None) -> dict:
    """The convolution's rate for ``dtype``, bounded in time: a pilot convolution predicts
    the measurement's cost (warm-up and at least ``min_seconds``); over the budget (bf16
    where it is emulated), skipped with the prediction."""
    pilot = conv_gflops(dtype, CONV_PILOT_SHAPE, min_seconds=0.02)
    one = conv_flops(CONV_SHAPE) / max(pilot, 1e-9) / 1e9
    cost = one + max(one, min_seconds)
    if budget_s is not None and cost > budget_s:
        return {"gflops": None, "pilot": pilot,
                "skipped": f"skipped: predicted {cost:.1f} s (over the {budget_s:g} s budget) "
                           f"from {pilot:.2f} GFLOP/s at its pilot shape"}  # fmt: skip
    return {"gflops": conv_gflops(dtype, CONV_SHAPE, min_seconds), "pilot": pilot}


# Two small training steps, what the study's time estimate scales by precision (the
# bf16/fp32 ratio differs by the kind of network: on a 2-vCPU AVX2 EPYC, bf16 emulated,
# a 32-px convolution net ran 36x slower in bf16, a 56-px one 13-16x, ResNet-50 at 224 px
# 9-12x, a transformer's MLP block 43x and BERT-base 40x):
# - the vision models': batch 8 of 64 x 56 x 56 activations (ResNet's first stage)
#   through two 3x3 convolutions (64 channels) with batch norm, pooled into a linear head;
# - the text models': 256 tokens of 768 through a transformer's MLP block (a linear to
#   4x, GELU, back, layer norm) and a linear head.
# Forward + backward, in fp32 and under bf16 autocast.
PROXY_SHAPE = (8, 64, 56, 56)
TEXT_PROXY_SHAPE = (256, 768)
PROXY_BUDGET_S = 4.0


def proxy_flops(shape: tuple[int, int, int, int] = PROXY_SHAPE) -> float:
    """FLOPs of one convolutional proxy step (2 per multiply-add; backward = 2 forwards)."""
    batch, channels, height, width = shape
    conv = 2.0 * channels * channels * 9 * height * width * batch
    head = 2.0 * channels * 10 * batch
    return 3.0 * (2 * conv + head)


def text_proxy_flops(shape: tuple[int, int] = TEXT_PROXY_SHAPE) -> float:
    """FLOPs of one text proxy step (2 per multiply-add; backward = 2 forwards)."""
    tokens, width = shape
    return 3.0 * 2.0 * tokens * (2 * width * 4 * width + width * 10)


def train_proxy(budget_s: float = PROXY_BUDGET_S, shape=PROXY_SHAPE) -> dict:
    """Seconds per convolutional proxy training step in fp32 and under bf16 autocast,
    and their ratio: how much slower (or faster) this CPU trains a convolutional network
    in bf16 than in fp32 (about 2x faster with AVX-512 BF16; much slower where bf16 is
    emulated). See :func:`proxy_seconds` for how each precision is timed."""
    import torch
    from torch import nn

    batch, channels, _, _ = shape
    gen = torch.Generator().manual_seed(1234)
    model = nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10),
    )  # fmt: skip
    x = torch.randn(*shape, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return proxy_seconds(model, x, y, proxy_flops(shape), shape, budget_s)


def text_proxy(budget_s: float = PROXY_BUDGET_S, shape=TEXT_PROXY_SHAPE) -> dict:
    """The same for a transformer's MLP block (the text models' estimate)."""
    import torch
    from torch import nn

    tokens, width = shape
    gen = torch.Generator().manual_seed(1234)
    model = nn.Sequential(
        nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
        nn.LayerNorm(width), nn.Linear(width, 10),
    )  # fmt: skip
    x = torch.randn(*shape, generator=gen)
    y = torch.randint(0, 10, (tokens,), generator=gen)
    return proxy_seconds(model, x, y, text_proxy_flops(shape), shape, budget_s)


def proxy_seconds(model, x, y, flops: float, shape, budget_s: float) -> dict:
    """Seconds per training step of ``model`` on ``(x, y)`` in fp32 and under bf16
    autocast, and their ratio. Each precision: one warm-up step, then timed steps (the
    fastest kept) while they fit their share of ``budget_s``; a precision whose warm-up
    alone overran it keeps that one step's time."""
    import torch
    from torch import nn

    out: dict = {"shape": list(shape), "flops": flops, "seconds": {}}
    t_start = time.perf_counter()
    for precision in ("fp32", "bf16"):
        share = budget_s / 2

        def step(precision=precision):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()

        t0 = time.perf_counter()
        step()  # warm-up
        best = time.perf_counter() - t0
        spent, timed = best, 0
        while timed < 5 and spent + best <= share:
            t0 = time.perf_counter()
            step()
            took = time.perf_counter() - t0
            best = min(best, took) if timed else took
            spent += took
            timed += 1
        out["seconds"][precision] = best
    fp32, bf16 = out["seconds"]["fp32"], out["seconds"]["bf16"]
    out["gflops"] = {k: out["flops"] / v / 1e9 for k, v in out["seconds"].items()}
    out["bf16_over_fp32"] = bf16 / fp32 if fp32 > 0 else None
    out["elapsed_s"] = time.perf_counter() - t_start
    return out


def ceiling_rate(
    reference: dict | None, precision: str, threads
) -> tuple[float | None, str | None, str]:
    """(GFLOP/s, dtype, how it was found) of the calibrated ceiling for a run of this
    precision on ``threads`` threads: the entry measured with that many threads, else the
    nearest count scaled linearly by threads; (None, None, why) without one."""
    ceilings = [c for c in (reference or {}).get("ceiling") or [] if isinstance(c, dict)]
    if not ceilings:
        why = "no calibrated ceiling" if reference else "no calibration"
        return None, None, why + " (recalibrate: snakemake -R calibrate)"
    if not finite(threads) or threads <= 0:
        return None, None, f"the run's thread count {threads!r} is unknown"
    near = nearest_threads(ceilings, threads)
    if near is None:
        return None, None, "the ceilings have no thread count"
    dtype, rate = peak_rate(near, precision)
    if rate is None:
        return None, None, f"the ceiling has no {precision} rate"
    if near.get(f"{dtype}_kernel") == "conv3x3":
        kernel = "3x3 convolution"
    else:
        kernel = f"size {near.get(f'{dtype}_size')}"
    if near["threads"] == threads:
        return float(rate), dtype, f"calibrated {dtype} ceiling, {threads} threads, {kernel}"
    scaled = float(rate) * threads / near["threads"]
    return (
        scaled,
        dtype,
        (
            f"calibrated {dtype} ceiling, {near['threads']} threads ({kernel}) "
            f"scaled linearly to {threads}"
        ),
    )


def auto_threads(n: int) -> list[int]:
    """Thread counts worth a reference on n CPUs: 1, 2, 4, ... and n itself."""
    counts, t = [], 1
    while t < n:
        counts.append(t)
        t *= 2
    return [*counts, n]


def wait_for_compile_pool(timeout: float = 120.0) -> float | None:
    """Wait until Inductor's compile worker pool, if this process started one, is up.

    Importing IPEX imports ``torch._inductor.async_compile``, which in torch 2.8
    starts the compile worker pool at once (when triton is installed): a sidecar
    process and its workers, each importing torch, about 10 s of CPU on 2 cores.
    A probe (or a training step) in that time shares the cores with them: here
    torch 2.8's fp32 matmul probed at 53-71 GFLOP/s in the first 8 s after the
    import and at 130-145 once the pool was up. Returns the seconds waited, or
    None when no pool is starting (nothing imported Inductor, or torch >= 2.9,
    which starts its pool only when a compile needs it).
    """
    module = sys.modules.get("torch._inductor.async_compile")
    if module is None:
        return None
    compile_ = module.AsyncCompile
    ready = getattr(compile_, "_ready_future", None)  # torch >= 2.9
    pool = getattr(compile_, "process_pool", None)
    if ready is None and getattr(pool, "cache_info", None) and pool.cache_info().currsize:
        ready = getattr(pool(), "ready_future", None)  # torch 2.8: created with the pool
    if ready is None:
        return None
    t0 = time.perf_counter()
    ready.result(timeout=timeout)
    return time.perf_counter() - t0


def calibrate(
    sizes: list[int],
    threads: list[int] | str = "auto",
    repeats: int = 3,
    min_seconds: float = MIN_SECONDS,
    imports: list[str] = (),
    ceiling_sizes: tuple[int, ...] = CEILING_SIZES,
    ceiling_budget_s: float | None = CEILING_BUDGET_S,
) -> dict:
    """The reference: ``repeats`` probes (median) per size and thread count, for noise
    detection, and per thread count the machine's matmul ceiling (:func:`ceiling`), the
    denominator of a run's % of peak.

    ``threads``: counts to measure, 0 meaning torch's default (all the CPUs this
    process may use), or ``"auto"`` for :func:`auto_threads` of that default; counts
    that resolve to the same number are measured once. ``imports``: modules to import
    first, as the trials do (``backends.env_imports``).
    """
    import importlib

    import torch

    for module in imports:
        importlib.import_module(module)
    pool_wait_s = wait_for_compile_pool()
    # what every trial's setup pays here: building an optimizer imports torch._dynamo
    # (torch.optim's constructors are wrapped by it), ~6 s on a 2-core Zen 1
    t0 = time.perf_counter()
    importlib.import_module("torch._dynamo")
    dynamo_import_s = time.perf_counter() - t0

    default = torch.get_num_threads()
    if threads == "auto":
        threads = auto_threads(default)
    counts = list(dict.fromkeys(t if t > 0 else default for t in threads or [0]))
    before = load_avg()
    t0 = time.perf_counter()
    entries, ceilings = [], []
    for count in counts:
        torch.set_num_threads(count)
        probes = [summarize([run(size, min_seconds) for _ in range(repeats)]) for size in sizes]
        entries += probes
        if ceiling_sizes:
            top = ceiling(tuple(ceiling_sizes), min_seconds=min_seconds, budget_s=ceiling_budget_s)
            runs = [r for e in probes for r in e["runs"]]
            ceilings.append(with_probes(top, runs, tuple(ceiling_sizes)))
    torch.set_num_threads(default)
    proxy = train_proxy() if ceiling_sizes else None
    text = text_proxy() if ceiling_sizes else None
    main = next(
        (e for e in entries if e["threads"] == default),
        entries[0] if entries else {},
    )
    return {
        "kind": "calibration",
        "size": main.get("size"),
        "threads": main.get("threads"),
        "fp32_gflops": main.get("fp32_gflops"),
        "bf16_gflops": main.get("bf16_gflops"),
        "entries": entries,
        "ceiling": ceilings,
        "train_proxy": proxy,
        "text_proxy": text,
        "repeats": repeats,
        "min_seconds": min_seconds,
        "default_threads": default,
        "compile_pool_wait_s": pool_wait_s,
        "dynamo_import_s": dynamo_import_s,
        "load_avg_before": before,
        "seconds": time.perf_counter() - t0,
        "torch_version": torch.__version__,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def nearest_threads(entries: list[dict], threads: int) -> dict | None:
    """The entry measured with the thread count nearest ``threads`` (the larger on a
    tie); None when no entry has one. Its rate scales about linearly with threads."""
    usable = [e for e in entries if finite(e.get("threads")) and e["threads"] > 0]
    if not usable:
        return None
    return min(usable, key=lambda e: (abs(e["threads"] - threads), -e["threads"]))


def reference_rate(
    reference: dict | None, size, threads, dtype: str = "fp32"
) -> tuple[float | None, str]:
    """The reference rate for a probe of ``size`` run with ``threads`` threads, and how
    it was found: an entry measured with the same size and threads, else the entry of
    that size with the nearest thread count scaled linearly by threads (matmul scales
    about linearly with cores), else None with the reason."""
    key = f"{dtype}_gflops"
    if not isinstance(reference, dict):
        return None, "no reference probe"
    entries = [e for e in reference.get("entries") or [] if isinstance(e, dict)]
    if not entries and finite(reference.get(key)):
        entries = [reference]  # a single probe used as the reference
    same_size = [e for e in entries if e.get("size") == size and finite(e.get(key))]
    if not same_size:
        return None, f"the reference has no probe of size {size}"
    for e in same_size:
        if e.get("threads") == threads:
            return float(e[key]), f"reference size {size}, {threads} threads"
    if not finite(threads) or threads <= 0:
        return None, f"the probe's thread count {threads!r} is unknown"
    near = nearest_threads(same_size, threads)
    if near is None:
        return None, "the reference probes have no thread count"
    rate = float(near[key]) * threads / near["threads"]
    return rate, (
        f"reference size {size}, {near['threads']} threads scaled linearly to {threads} threads"
    )


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure dense matmul GFLOP/s (fp32 and bf16).")
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE, help="N of the N x N matrices")
    ap.add_argument("--seconds", type=float, default=MIN_SECONDS, help="time per dtype")
    ap.add_argument(
        "--threads",
        default=None,
        help="intra-op threads; with --calibrate a comma list (0 = all) or auto (the default)",
    )
    ap.add_argument(
        "--calibrate", action="store_true", help="median of --repeats probes per size and threads"
    )
    ap.add_argument("--sizes", default=None, help="comma list of sizes for --calibrate")
    ap.add_argument("--repeats", type=int, default=3, help="probes per entry with --calibrate")
    ap.add_argument("--imports", default="", help="comma list of modules to import first")
    ap.add_argument(
        "--ceiling-sizes",
        default=",".join(map(str, CEILING_SIZES)),
        help="with --calibrate: comma list of sizes for the matmul ceiling (empty: none)",
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.calibrate:
        sizes = int_list(args.sizes) if args.sizes else [args.size]
        threads = int_list(args.threads) if args.threads not in (None, "auto") else "auto"
        imports = [m for m in args.imports.split(",") if m]
        ceiling_sizes = tuple(int_list(args.ceiling_sizes)) if args.ceiling_sizes else ()
        result = calibrate(sizes, threads, args.repeats, args.seconds, imports, ceiling_sizes)
        result["imports"] = imports
    else:
        if args.threads:
            import torch

            torch.set_num_threads(int(args.threads))
        result = run(args.size, args.seconds)
    text = json.dumps(result, indent=1)
    if args.out:
        write_json_atomic(args.out, result)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
