"""What a trial measures besides its steps: the FLOP count, the noise probe around
the steps, the communication CPU, the compile statistics and the text tokens."""

from __future__ import annotations

import math
import os
import time

from .. import sysinfo, workloads
from ..util import finite
from . import probe
from .distributed import ranks


def count_flops_per_sample(spec: dict, fake: bool = True) -> float:
    """FLOPs of one step per sample: one forward + backward at batch size 1 (inference:
    the forward alone).

    Counted with ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per
    multiply-add of the matmuls and convolutions, the bulk of the work; norms and
    activations are not counted) on a fresh copy of the model built with the spec's
    seed, before any compile or ``ipex.optimize`` (a transformer with plain-matmul
    attention: the counter does not see inside the CPU's fused attention kernel, whose
    FLOPs are the same). Eval mode: batch norm with one sample fails in training mode
    on small images, and its FLOPs are not counted anyway. The global RNG is left as
    it was.

    ``fake``: the model, the batch and the step as fake tensors (``FakeTensorMode``:
    shapes and dtypes, no data), which the counter counts the same (every workload,
    both modes: tests/test_harness.py) without allocating the step's memory: a
    ResNet-50 step of one sample counted on real tensors took 89 thousand page faults
    and moved glibc's heap before the trial's own steps (tests/benchmarks/
    prework_faults.py), and a BERT-base one took 8 s where the fake one takes 0.4 s.
    Transformers reads fake tensors as a trace and skips its data-dependent shortcuts
    (an all-ones attention mask), which change no counted FLOP. ``fake=False``: real
    CPU tensors.
    """
    import contextlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from . import data, models

    mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
    with torch.random.fork_rng(devices=[]), mode:
        torch.manual_seed(spec["seed"])
        w = workloads.get(spec["model"])
        model = models.build(spec["model"], attention="eager")
        model.eval()
        x, y = data.synthetic_batch(
            {**spec, "padding": "fixed"}, 1, torch.Generator().manual_seed(spec["seed"])
        )
        counter = FlopCounterMode(display=False)
        with counter:
            _, loss = models.forward_loss(w, model, x, y)
            if spec["mode"] == "train":
                loss.backward()
    return float(counter.get_total_flops())


def achieved_gflops(flops_per_sample: float | None, samples_per_s: float) -> float | None:
    """GFLOP/s the timed steps computed (their share of the machine's calibrated matmul
    ceiling, ``pct_of_peak``, is the trial policy's: the calibration is its input)."""
    ok = flops_per_sample is not None and math.isfinite(samples_per_s)
    return flops_per_sample * samples_per_s / 1e9 if ok else None


def probe_or_error(size, dtypes: tuple[str, ...] = probe.DTYPES) -> dict | None:
    """The noise probe in this process now (None when the spec has none); a probe that
    fails must not fail the run."""
    if not size:
        return None
    try:
        return probe.run(int(size), dtypes=dtypes)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def counted_flops(spec: dict) -> dict:
    """The FLOP count of the spec's model (``flops_per_sample``, or ``flops_error`` when
    it could not be counted) and how long counting took."""
    t0 = time.perf_counter()
    flops_error = None
    try:
        try:
            flops = count_flops_per_sample(spec)
        except Exception:  # noqa: BLE001 - a model fake tensors cannot run: real ones
            flops = count_flops_per_sample(spec, fake=False)
    except Exception as exc:  # noqa: BLE001 - a missing FLOP count must not fail the run
        flops, flops_error = None, f"{type(exc).__name__}: {exc}"[:500]
    return {
        "flops_per_sample": flops,
        "flops_error": flops_error,
        "flops_count_s": time.perf_counter() - t0,
    }


def before_steps(spec: dict, counted: dict | None) -> dict:
    """What a trial does between its setup and its steps: wait for its own compile
    worker pool, count the FLOPs (unless ``counted`` before the setup), probe the
    machine (all ranks together)."""
    # The trial's own background work first: a compile worker pool that the setup
    # started (IPEX's import does) would share the cores with the probe and steps.
    try:
        pool_wait_s = probe.wait_for_compile_pool()
    except Exception:  # noqa: BLE001 - a pool that failed to start shows up in a compile
        pool_wait_s = None
    # After the setup where the backend needs it (torch_xla claims its device before
    # any backward in the process), before the steps; neither is part of setup_s.
    counted = counted or counted_flops(spec)
    ranks.barrier()  # the ranks probe together, and step together after
    probe_result = probe_again_while_low(
        spec, probe_or_error(spec.get("probe_size"), probe.dtypes_for(spec.get("precision")))
    )
    ranks.barrier()
    return {"compile_pool_wait_s": pool_wait_s, **counted, "probe": probe_result}


#: how often a probe below its floor is taken again before the steps, and the pause
#: before each: a moment's disturbance passes, and the steps then run on a quiet machine
#: where the whole attempt would have been discarded and run again
REPROBES = 3
REPROBE_PAUSE_S = 2.0


def _one_process() -> bool:
    """A run of one process: no launcher's world of several, no process group of several."""
    if ranks.world()[1] != 1:
        return False
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def probe_again_while_low(spec: dict, result: dict | None, pause_s: float = REPROBE_PAUSE_S):
    """The probe before the steps, taken again (up to :data:`REPROBES` times, after a
    pause) while its fp32 rate is below the floor the trial policy passed for its thread
    count (``probe_floors``: what such a probe ordinarily reads here, from the study's
    other trials); the earlier rates are kept (``reprobed``). A run of one process only
    (the ranks of a several-rank run probe together, and would step out of turn)."""
    from ..experiment import PROBE_FLOOR_KEY

    floors = spec.get(PROBE_FLOOR_KEY) or {}
    if not floors or not isinstance(result, dict) or not _one_process():
        return result
    floor = floors.get(str(result.get("threads")))
    if not finite(floor):
        return result
    earlier: list[float] = []
    spent = 0.0  # the earlier probes and the pauses after them
    while len(earlier) < REPROBES:
        rate = result.get("fp32_gflops")
        if not finite(rate) or rate >= floor:
            break
        earlier.append(rate)
        spent += float(result.get("seconds") or 0.0) + pause_s
        time.sleep(pause_s)
        again = probe_or_error(spec.get("probe_size"), probe.dtypes_for(spec.get("precision")))
        if not isinstance(again, dict) or not finite(again.get("fp32_gflops")):
            break
        result = again
    if earlier:
        result = {**result, "reprobed": {"floor_gflops": floor, "earlier_gflops": earlier,
                                         "pause_s": pause_s, "seconds": spent}}  # fmt: skip
    return result


def comm_cpu_check(spec: dict) -> dict | None:
    """With ``comm_cpu``: the CPU reserved for communication and the threads found pinned
    to it alone (oneCCL's worker), read from /proc after the steps."""
    if not spec.get("comm_cpu"):
        return None
    reserved = os.environ.get(ranks.RESERVED_VAR)
    threads = sysinfo.thread_cpus()
    return {
        "reserved": int(reserved) if reserved and reserved.isdigit() else reserved,
        "threads_on_it": [t["name"] for t in threads if t["cpus"] == reserved],
        "threads": len(threads),
    }


def text_tokens(x: dict) -> tuple[int, int, int]:
    """(real tokens, samples, padded length) of a text batch."""
    mask = x["attention_mask"]
    return int(mask.sum()), int(mask.shape[0]), int(mask.shape[1])


def text_metrics(spec: dict, tokens: list[tuple[int, int, int]], counted: float | None) -> dict:
    """A text model's tokens per sample over the timed steps (the real ones, and with
    the pads it computed on); with dynamic padding, its FLOPs per sample at the lengths
    the batches were padded to: the count at ``seq_len`` times the mean, over the timed
    steps, of the model's FLOPs at the step's padded length over its FLOPs at
    ``seq_len`` (``workloads.Workload.forward_flops``)."""
    samples = sum(n for _, n, _ in tokens)
    out = {
        "tokens_per_sample": sum(real for real, _, _ in tokens) / samples,
        "padded_tokens_per_sample": sum(n * width for _, n, width in tokens) / samples,
    }
    if counted is not None and spec.get("padding") == "dynamic":
        w = workloads.get(spec["model"])
        full = w.forward_flops(spec)
        scale = [w.forward_flops({**spec, "seq_len": width}) / full for _, _, width in tokens]
        out["flops_per_sample"] = counted * sum(scale) / len(scale)
    return out


def compile_stats(spec: dict, at_first_step: dict | None = None) -> dict | None:
    """torch.compile's work so far in this process (None without a compile): the graphs
    it made, its frame compilations and their seconds (Dynamo's and the backward's), its
    compile caches' hits and misses (Inductor's FX graphs, AOTAutograd's);
    with ``at_first_step``, also what it compiled after the first step (recompilations
    for new shapes, e.g. dynamically padded batches)."""
    if spec["compile"] == "none":
        return None
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError:
        return None
    frames = compilation_time_metrics.get("_compile.compile_inner", [])
    backward = compilation_time_metrics.get("compile_fx.<locals>.bw_compiler", [])
    out = {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frame_compiles": len(frames),
        "backward_compiles": len(backward),
        "compile_s": float(sum(frames) + sum(backward)),
        # what came from the compile cache (a later trial's: its first trial's, carry.py)
        "cache": {
            f"{key}_{what}": int(counters[section].get(f"{key}_{what}", 0))
            for section, key in (("inductor", "fxgraph_cache"), ("aot_autograd", "autograd_cache"))
            for what in ("hit", "miss")
        },
    }
    if at_first_step:
        out["recompiles_after_first_step"] = out["frame_compiles"] - at_first_step["frame_compiles"]
        out["compile_s_after_first_step"] = out["compile_s"] - at_first_step["compile_s"]
    return out
