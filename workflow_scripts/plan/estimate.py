"""How long the study will take on this machine, before anything runs.

Each trial's wall time is predicted from its spec and what this machine measured:
the calibration of its environment (``results/calibration/<env>.json``: the fp32
matmul ceiling per thread count, the bf16/fp32 ratio of a small training step of the
model's kind, the cost of starting a process there), or, before a calibration exists,
a quick fp32 matmul in this process (one thread's rate by its own CPU time, times the
CPUs: a busy neighbour does not move it) and the CPU's flags (bf16 native with
AVX-512 BF16 or AMX, else emulated: on AVX-512 a few times fp32's step, on AVX2
tens of times). The arithmetic, per trial::

    step     = FLOPs per sample x batch / (fp32 ceiling x EFFICIENCY x backend speed)
               x bf16/fp32 ratio (bf16 runs) or INT8's (int8) + STEP_OVERHEAD_S
    timed    = steps x step, cut by time_budget_s as the harness cuts it (>= 2 steps),
               and the warm-up too (>= 1 step); with step_precision, the steps that
               the typical spread of step times takes to know the mean within it,
               on average (precision_steps)
    trial    = process start (x2 + TORCHRUN_S for a launcher's own start and rendezvous)
               + HARNESS_S + the setup's imports + FLOP count (FLOP_COUNT_S)
               + probes + compile
               + (warmup_steps or every epoch's steps) x step + timed
               + the gradient check's eager references (fp64, and the run's precision)
               capped at timeout_s; x 1 attempt (noisy reruns are not predicted)

A later trial (trial 1, 2, ...) carries what its first trial did once (trial/carry.py):
no FLOP count, no gradient check's references, no training of a model it serves (it
loads the first trial's weights), and a compile from the first trial's
cache (WARM_COMPILE_SHARE of a cold one; FROZEN_WARM_SHARE of a frozen graph's, which
that cache skips). A served model compiles its forward graph alone
(INFERENCE_COMPILE_SHARE of the model's training compile).

The constants are rough and say so: the study records each trial's estimate beside
its real wall time (``record.estimate``, ``record.trial_wall_s``) and the report
shows how far off the estimate was, per experiment and for the whole study.

Host side, standard library only (numpy, if present, for the quick measurement).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Collection, Iterable, Mapping

from .. import backends, launchers, metrics, workloads
from ..rank import gradcheck, probe, schedule
from ..runtimes import warm as warm_interpreter
from ..util import finite

# Share of the fp32 matmul ceiling a training step reaches (ResNet-50 fp32 eager
# measured 56-81 % on an AVX-512 machine; small models reach less, which the per-step
# overhead covers). At 0.6 the timed steps took 0.71x their estimate over a whole
# default study (2-vCPU EPYC, AVX-512) and a median step 0.70x (quartiles 0.63-0.81) over
# the 28 training experiments of a budget=1h run there (2026-12-01); a budget=1h run on
# an AVX2 EPYC took 0.71x its estimate: 0.75.
EFFICIENCY = 0.75
# Python/dispatch cost of one eager training step of a small model (seconds).
STEP_OVERHEAD_S = 0.01
# The harness's fixed work in a trial besides the steps and its setup's imports: model
# and data, the checks, writing the result (seconds).
HARNESS_S = 1.5
# A first trial's FLOP count (rank/measure.py): one step of one sample on fake tensors,
# no arithmetic, so about the same for every model and run: the model built and its
# step traced in 0.1-0.6 s on a busy 2-vCPU EPYC Zen 5, BERT-base and GPT-2 included,
# with up to 0.5 s more for the fake tensors' first use in a process (seconds).
FLOP_COUNT_S = 0.6
# Starting a trial's process (interpreter, torch, the backend's imports) when no
# calibration measured it; a container's start on top.
PROCESS_START_S = 6.0
# A trial forked from a warm interpreter (runtimes/warm.py): the fork and its script's
# start, with the server's own start (the imports) shared by the trials after it.
FORK_START_S = 0.5
CONTAINER_START_S = 2.0
# The trial's setup imports torch._dynamo (building an optimizer does), when no
# calibration measured it: 6-8 s on a 2-core Zen 1 EPYC.
SETUP_IMPORT_S = 5.0
# A launcher's own process imports torch too (a process start of its own, before the
# ranks'), then the process-group rendezvous: 0.3-0.5 s beyond two starts for the
# torchrun, Accelerate and oneCCL trials of the default study on a 2-vCPU EPYC (3.0 s
# in all against a warm start of 1.37 s; 4 s once assumed on top of 1.5 starts).
TORCHRUN_S = 0.5
# Starting DataLoader worker processes (each).
WORKER_START_S = 1.0
# A compile from the first trial's cache, as a share of a cold one: ResNet-50's first
# training step took 6.4 s warm against 58 s cold on 2 cores (AVX-512; Dynamo's tracing
# is still paid).
WARM_COMPILE_SHARE = 0.15
# ... and of a frozen graph's (compile_freezing): Inductor's FX graph cache skips a graph
# whose frozen weights are oneDNN-prepacked ("mkldnn tensors unpickleable", torch 2.14),
# so a later trial compiles it again from its other caches: 0.24-0.58 of the cold compile
# (the default study's 19 frozen serving runs on a 2-vCPU EPYC, AVX-512: 2-13 s after
# 8-34 s; the larger models' about half).
FROZEN_WARM_SHARE = 0.5
# A served (inference) model's compile, as a share of the model's training compile
# (compile_s): one forward graph, no backward, no AOTAutograd joint graph; 0.12-0.57 of
# compile_s in the default study's 21 compiled serving runs there (ResNet-50 9-17 s,
# BERT-base 14-34 s, max-autotune the dearest), whose training compiles took 40-50 s and
# 22-24 s (compile_s: 75 and 60).
INFERENCE_COMPILE_SHARE = 0.3
# Compiled graphs ~1.2x eager (a backend's own speed and tracing: Backend.estimate_*).
COMPILED_SPEED = 1.2
# An INT8 model's step over the same model's fp32 step, by the CPU's flags: oneDNN's
# INT8 kernels multiply-add four 8-bit values where fp32 does one with VNNI (AVX-512
# VNNI, AVX-VNNI) or AMX: 0.16-0.33 of the fp32 frozen step measured for ResNet-50 and
# BERT-base at batch 1 and 16 on a 2-vCPU EPYC with AVX-512 VNNI (GPT-2 at batch 1,
# bound by other work, 0.7); without VNNI, half the gain assumed (not measured).
INT8_VNNI_RATIO = 0.25
INT8_RATIO = 0.5
# bf16 autocast over fp32, from the CPU's flags when no calibration measured it:
# native bf16 (AVX-512 BF16, AMX) about 2x faster; emulated on AVX-512 without BF16
# (oneDNN's AVX-512 kernels convert), the calibration's training proxies 2.9-4.1x fp32's
# on a 2-vCPU Xeon that shows AVX-512 and VNNI but neither BF16 nor AMX (CPUID family 6,
# model 207): 3.5x; emulated on AVX2 (a slow fallback), a step measured 9-12x fp32's
# (ResNet-50) to 40x (BERT-base) on a 2-vCPU AVX2 EPYC: 20x between them.
BF16_NATIVE_RATIO = 0.5
BF16_AVX512_RATIO = 3.5
BF16_EMULATED_RATIO = 20.0
# The gradient check (rank/gradcheck.py) after the steps: an fp64 eager step (fp64
# matmuls run at about half the fp32 rate, its other work slower still) and, for a rung
# that is not plain eager, an eager step at the run's precision; each reference model
# rebuilt from the initial weights.
FP64_STEP_RATIO = 2.5
MODEL_BUILD_S = 1.0
# ... or, where another experiment made the same reference (rank/references.py), reading
# it: a BERT-base fp64 one is 0.9 GB
REFERENCE_READ_S = 0.5
#: what a first trial carries where another experiment made its references (trial())
READ_FP64, READ_OWN = "reference:fp64", "reference:own"
# The noise probe, each of its measurements: fp32 before the steps and after them (0.34 s
# each: medians of 10 fresh processes on a 2-vCPU AVX-512 EPYC), and bf16 before them
# where the run computes in bf16 and bf16 is native (0.4 s with its pilot; re-probes
# after a low one cost 0.16 s a trial more in a whole default study).
PROBE_S = 0.36
# One calibration, one collectives job and the report, when nothing measured them: the
# calibrations took 16-26 s each on a 2-vCPU AVX-512 EPYC and 17.5 s on an AVX2 one,
# the collectives 24-32 s and 63 s. A report (a round's, a stage's, the study's): its
# process and imports, then about 0.18 s per experiment it holds (fixture records of the
# default study's experiments on a 2-vCPU AVX2 EPYC, the report's main: 10 of them
# 2.9 s, 40 9.1 s, 159 28.6 s, 159 with 2 trials each 32.8 s; the trials' count
# matters little); progress.py scales it by the reports this run has measured.
CALIBRATION_S = 25.0
COLLECTIVES_S = 30.0
# ... and the most one took on the 2-vCPU machines measured (63 s on an AVX2 EPYC, 40-65 s
# on a Xeon with AMX, 2026-12-06): the least a budget's clock keeps for each not yet run,
# after the last trial (plan/clock.py), where taking too little runs the study past its end
COLLECTIVES_MOST_S = 65.0
REPORT_S = 6.0
REPORT_PER_EXPERIMENT_S = 0.18


def report_s(experiments: int) -> float:
    """One report's estimated seconds, of ``experiments`` experiments' records."""
    return REPORT_S + REPORT_PER_EXPERIMENT_S * max(0, int(experiments))


DIGITS_TRAIN_IMAGES = 1437  # scikit-learn's digits, the study's fixed 80 % split
DIGITS_TEST_IMAGES = 360
#: an INT8 model's preparation (export or observers, convert) or a TorchScript trace and
#: freeze, beyond its calibration's forward passes
SERVE_PREPARE_S = 3.0
#: the forward passes a served model's checks run after the steps (one: its logits on
#: the agreement batch, with the oneDNN trace), beside the fp32 eager reference's
SERVE_CHECK_STEPS = 1


def forward_flops(spec: Mapping) -> float | None:
    """FLOPs of one sample's forward pass (matmuls and convolutions), from the model's
    declaration (``workloads``), or None for a model it does not know; with dynamic
    padding, at the length its batches are padded to on average."""
    w = workloads.WORKLOADS.get(spec.get("model", ""))
    if w is None:
        return None
    if w.text and spec.get("padding") == "dynamic":
        seq_len = int(spec.get("seq_len") or w.seq_len)
        padded = workloads.expected_padded_length(seq_len, int(spec.get("batch_size") or 1))
        return _interpolated(w, spec, padded)
    return w.forward_flops(spec)


def _interpolated(w: workloads.Workload, spec: Mapping, length: float) -> float:
    """The model's forward FLOPs at a fractional sequence length (between its whole
    neighbours)."""
    low = int(length)
    a = w.forward_flops({**spec, "seq_len": low})
    b = w.forward_flops({**spec, "seq_len": low + 1})
    return a + (b - a) * (length - low)


def compile_s(model: str) -> float:
    """Inductor's one-off cold compile of the model on 2 cores (other models: the
    largest); Inductor's cold compile of ResNet-50 took 45-75 s on 2 cores (AVX-512),
    of the tiny CNN 25 s on a 2-core Zen 1."""
    w = workloads.WORKLOADS.get(model)
    return w.compile_s if w else max(x.compile_s for x in workloads.WORKLOADS.values())


def train_flops_per_sample(spec: Mapping) -> float | None:
    """A step's FLOPs per sample: training's forward + backward, ~3 forwards; an
    inference step's forward alone."""
    forward = forward_flops(spec)
    if forward is None:
        return None
    return forward if spec.get("mode") == "inference" else 3 * forward


# --------------------------------------------------------------------------- machine


def quick_fp32_gflops(
    size: int = 512, min_seconds: float = 0.2, cpus: int | None = None
) -> float | None:
    """This machine's fp32 matmul rate with numpy (BLAS), the estimate's basis before a
    calibration exists (~0.2 s): one thread's rate, timed by that thread's own CPU
    time, times ``cpus`` (default: the CPUs this process may use). A busy neighbour
    takes wall time from a measurement, not its thread's CPU time: timed by the wall on
    all CPUs, the same dry run read 6.0 h, 15.3 h, 46.9 h and 73.1 h as the machine's
    load changed. None without numpy."""
    try:
        import numpy as np
    except ImportError:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # (BLAS then uses its own threads: the rate is still this thread's)
        threadpool_limits = None
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    limit = threadpool_limits(limits=1) if threadpool_limits else contextlib.nullcontext()
    with limit:
        a @ b
        reps, c0, w0 = 0, time.thread_time(), time.perf_counter()
        # at least min_seconds of this thread's CPU time, at most 10x that of the wall
        while time.thread_time() - c0 < min_seconds and (
            time.perf_counter() - w0 < 10 * min_seconds or reps < 2
        ):
            a @ b
            reps += 1
        cpu = time.thread_time() - c0
    if cpu <= 0:
        return None
    return 2.0 * size**3 * reps / cpu / 1e9 * max(1, cpus)


def bf16_native(flags: Iterable[str]) -> bool:
    flags = set(flags)
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def bf16_kind(flags: Iterable[str]) -> str:
    """How this CPU computes bf16, by its flags: ``native`` (AVX-512 BF16 or AMX),
    ``avx512`` (emulated in AVX-512 registers: a few times fp32's step) or ``emulated``
    (AVX2 and older: a slow fallback, tens of times fp32's)."""
    flags = set(flags)
    if bf16_native(flags):
        return "native"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl"} <= flags else "emulated"


def int8_vnni(flags: Iterable[str]) -> bool:
    return bool(set(flags) & {"avx512_vnni", "avx_vnni", "amx_int8"})


class Machine:
    """What the estimate knows of this machine, per environment: its calibration if one
    exists, else the quick measurement and the CPU flags (``basis`` says which)."""

    def __init__(
        self,
        calibrations: Mapping[str, Mapping | None],
        quick_gflops: float | None,
        cpus: int,
        flags: Iterable[str],
        container: bool = False,
        preflight: Mapping[str, Mapping] | None = None,
        forks: bool = False,
    ):
        self.calibrations = dict(calibrations)
        self.quick = quick_gflops
        self.cpus = max(1, cpus)
        self.bf16 = bf16_kind(flags)
        self.int8_ratio = INT8_VNNI_RATIO if int8_vnni(flags) else INT8_RATIO
        self.container = container
        #: each experiment's measured pre-flight (:func:`read_preflight`), by id
        self.preflight = dict(preflight or {})
        #: a single-process trial is forked from a warm interpreter (runtime local)
        self.forks = forks

    @property
    def native(self) -> bool:
        """bf16 is native here (AVX-512 BF16 or AMX), by the flags."""
        return self.bf16 == "native"

    def calibration(self, env: str) -> Mapping | None:
        cal = self.calibrations.get(env)
        return cal if isinstance(cal, Mapping) and cal.get("ceiling") else None

    def basis(self, env: str) -> str:
        if self.calibration(env):
            return "calibration"
        bf16 = {"native": "native", "avx512": "emulated on AVX-512"}.get(self.bf16, "emulated")
        return f"quick measurement (fp32 matmul) and CPU flags (bf16 {bf16})"

    def fp32_rate(self, env: str, threads: int) -> float:
        """GFLOP/s of the fp32 matmul ceiling with ``threads`` threads."""
        cal = self.calibration(env)
        if cal:
            # the matmul rate, which the constants were set against (a convolution's
            # rate can be twice it where the BLAS uses narrower vectors)
            key = lambda c: c.get("fp32_matmul_gflops", c.get("fp32_gflops"))  # noqa: E731
            ceilings = [c for c in cal["ceiling"] if finite(key(c))]
            near = probe.nearest_threads(ceilings, threads)
            if near is not None:
                return float(key(near)) * threads / near["threads"]
        all_cpus = self.quick if finite(self.quick) else 50.0 * self.cpus
        return all_cpus * min(threads, self.cpus) / self.cpus

    def bf16_ratio(self, env: str, text: bool = False) -> float:
        """A bf16 autocast training step's time over fp32's, from the calibration's proxy
        of the model's kind (``text``: a transformer's MLP block, else a convolution net;
        a calibration from before the text proxy: the convolution one)."""
        cal = self.calibration(env) or {}
        proxies = ("text_proxy", "train_proxy") if text else ("train_proxy",)
        for key in proxies:
            ratio = (cal.get(key) or {}).get("bf16_over_fp32")
            if finite(ratio) and ratio > 0:
                return float(ratio)
        return {"native": BF16_NATIVE_RATIO, "avx512": BF16_AVX512_RATIO}.get(
            self.bf16, BF16_EMULATED_RATIO
        )

    def process_start(self, env: str) -> float:
        """A trial's process start: the calibration's second, warm start where it has
        one (calibration.warm_start_s), else its first, cold one, else the constants."""
        cal = self.calibrations.get(env)
        cal = cal if isinstance(cal, Mapping) else {}
        for key in ("warm_startup_s", "startup_s"):
            if finite(cal.get(key)) and cal[key] >= 0:
                return float(cal[key])
        return PROCESS_START_S + (CONTAINER_START_S if self.container else 0.0)

    def setup_import(self, env: str) -> float:
        cal = self.calibrations.get(env)
        measured = (cal or {}).get("dynamo_import_s") if isinstance(cal, Mapping) else None
        return float(measured) if finite(measured) else SETUP_IMPORT_S

    def calibration_s(self, env: str) -> float:
        cal = self.calibrations.get(env)
        wall = (cal or {}).get("process_wall_s") if isinstance(cal, Mapping) else None
        return float(wall) if finite(wall) else CALIBRATION_S


# --------------------------------------------------------------------------- one trial


def is_text(spec: Mapping) -> bool:
    """Whether the spec's model is a text model (the estimate's bf16 proxy: a
    transformer's, not a convolution net's)."""
    try:
        return bool(workloads.get(spec.get("model")).text)
    except (KeyError, ValueError, TypeError):
        return False


def _world(spec: Mapping) -> tuple[int, int]:
    """(ranks in all, threads per rank)."""
    ranks = int(spec.get("ranks") or 1) * int(spec.get("nodes") or 1)
    return ranks, int(spec.get("threads") or 0)


def _backend(spec: Mapping) -> backends.Backend:
    """The spec's backend (eager's figures for a spec without a known one)."""
    name = spec.get("backend")
    return backends.get(name if name in backends.names() else "eager")


#: the spread of a trial's step times (their coefficient of variation) at its deciles,
#: 10 % to 90 %: over the 440 trials of three or more timed steps of the default study,
#: run whole twice on a 2-vCPU AMD EPYC (Zen 5); it hardly moves with the step's length
#: (medians 2.6-3.1 % from 0.2 s to 10 s a step)
STEP_CV_DECILES = (0.0056, 0.0087, 0.0146, 0.0197, 0.0274, 0.0347, 0.042, 0.0557, 0.0999)


def precision_steps(precision: float | None, most: float) -> float:
    """The timed steps that a trial stopped by ``step_precision`` runs on average, of at
    most ``most``: at each decile of :data:`STEP_CV_DECILES`, the first count from
    ``metrics.MIN_PRECISION_STEPS`` at which the 95 % interval's half-width
    (``metrics.relative_half_width``: Student's t) reaches it, averaged; ``most`` without
    a precision. (At 0.02, of 8 steps 6.6 and of 100 steps 21.3; the two whole runs'
    trials ran 6.7 and 6.4, and 23.9 and 21.0.)"""
    if not precision or most <= metrics.MIN_PRECISION_STEPS:
        return most
    counts = []
    for cv in STEP_CV_DECILES:
        n = metrics.MIN_PRECISION_STEPS
        while n < most and metrics.t_975(n - 1) * cv / math.sqrt(n) > precision:
            n += 1
        counts.append(n)
    return round(sum(counts) / len(counts), 1)  # (as the estimate states it)


#: what a later trial carries from its first (trial/carry.py): its FLOP count, its
#: gradient check's references and (a compiled run) its compile, from the cache
CARRIED_PARTS = frozenset({"flop_count", "grad_check", "compile"})


def trial(
    spec: Mapping,
    machine: Machine,
    later: bool = False,
    far: float | None = None,
    carries: Iterable[str] = (),
) -> dict:
    """The predicted wall time of one attempt of this trial, with its parts: from its
    measured pre-flight where there is one (its wall time, plus the steps the whole
    trial runs beyond it at its measured step time), else from the model below.
    ``later``: a later trial, which carries its first trial's one-off work
    (:data:`CARRIED_PARTS`); ``carries``: those of them a trial carries where it is
    known (:func:`for_trial`); ``far``:
    the step time over its baseline's of one far from it, which stops at its first
    timed steps (one where it is slower by ``far_stop`` squared, else two)."""
    env = spec.get("env") or "upstream"
    pre = machine.preflight.get(spec.get("id"))
    ranks, threads = _world(spec)
    total_threads = (threads or max(1, machine.cpus // ranks)) * ranks
    rate = machine.fp32_rate(env, min(total_threads, machine.cpus)) * EFFICIENCY
    backend = _backend(spec)
    rate *= backend.estimate_speed
    compiled = spec.get("compile") not in (None, "none")
    if compiled:
        rate *= COMPILED_SPEED
    flops = train_flops_per_sample(spec)
    batch = int(spec.get("batch_size") or 1)
    notes = []
    if flops is None:
        notes.append(f"no FLOP count for model {spec.get('model')!r}: 1 s a step assumed")
        step = 1.0
    else:
        step = flops * batch / (rate * 1e9)
        if spec.get("precision") == "bf16":
            step *= machine.bf16_ratio(env, is_text(spec))
        elif spec.get("precision") == "int8":
            step *= machine.int8_ratio
        step += STEP_OVERHEAD_S
    if spec.get("data") == "image_folder":
        step += 0.003 * batch  # decoding and resizing with PIL
    if pre:
        step = float(pre["step_s"])
    serving = spec.get("mode") == "inference"
    epochs = 0 if serving else int(spec.get("epochs") or 0)
    warmup = int(spec.get("warmup_steps") or 0)
    if epochs:
        train = workloads.KEYWORDS_TRAIN if spec.get("data") == "keywords" else DIGITS_TRAIN_IMAGES
        per_epoch = math.ceil(train / batch)
        untimed, timed_steps = 0, epochs * per_epoch
    else:
        steps = int(spec.get("steps") or 1)
        untimed, timed_steps = warmup, steps
        budget = spec.get("time_budget_s")
        if finite(budget) and step > 0:
            timed_steps = min(steps, max(min(2, steps), math.ceil(budget / step)))
            # the warm-up ends once its steps took long enough (rank/harness.py)
            untimed = schedule.warmup_ends_after(spec, step)
        # and where the mean step time is known within step_precision first: on average
        timed_steps = precision_steps(spec.get("step_precision"), timed_steps)
        if far:
            squared = float(spec.get("far_stop") or math.inf) ** 2
            timed_steps = min(timed_steps, 1 if far > squared else metrics.MIN_FAR_STEPS)
    start = machine.process_start(env)
    if machine.forks and warm_interpreter.candidate(spec):
        start = FORK_START_S
    if ranks > 1 or launchers.get(spec.get("launcher") or "none").distributed:
        start = start * 2 + TORCHRUN_S
    parts = {
        "start": start,
        "harness": (
            HARNESS_S
            + machine.setup_import(env)
            + WORKER_START_S * int(spec.get("num_workers") or 0)
        ),
        "flop_count": FLOP_COUNT_S,
        "probes": (
            PROBE_S * (1 + len(probe.dtypes_for(spec.get("precision") if machine.native else None)))
            if int(spec.get("probe_size") or 0) > 0
            else 0.0
        ),
        "compile": (
            compile_s(spec.get("model")) * (INFERENCE_COMPILE_SHARE if serving else 1.0)
            if compiled
            else 0.0
        ),
        "warmup": untimed * step,
        "timed": timed_steps * step,
    }
    parts["compile"] += backend.estimate_trace_s  # its graph, traced in the first steps
    bf16 = machine.bf16_ratio(env, is_text(spec))
    parts["grad_check"] = _grad_check_s(spec, flops, batch, rate, bf16, set(carries))
    if serving:
        calibrated = "int8_calibration" in carries or (later and backend.keeps_int8_calibration)
        trained = "weights" in carries or later  # (a later trial loads its first's)
        parts["serve"] = _serve_s(spec, step, flops, batch, rate, calibrated, trained)
    carried = 0.0
    gone = CARRIED_PARTS if later else CARRIED_PARTS & set(carries)
    if gone:  # carried from the first trial: its FLOP count, check and compile cache
        before = sum(parts[k] for k in gone)
        if "compile" in gone:
            share = FROZEN_WARM_SHARE if spec.get("compile_freezing") else WARM_COMPILE_SHARE
            warm = (parts["compile"] - backend.estimate_trace_s) * share
            parts["compile"] = warm + backend.estimate_trace_s
        parts.update({k: 0.0 for k in gone - {"compile"}})
        carried = before - sum(parts[k] for k in gone)
    if pre:  # measured: the pre-flight's whole trial, then the steps it did not run
        more = max(0, untimed + timed_steps - int(pre["steps"]))
        measured = max(0.0, float(pre["wall_s"]) - carried)
        parts = {"preflight": measured, "more_steps": more * step}
    seconds = uncapped = sum(parts.values())
    timeout = spec.get("timeout_s")
    capped = finite(timeout) and seconds > timeout
    if capped:
        seconds = float(timeout)
        notes.append(f"capped at timeout_s {timeout}")
    return {
        "seconds": round(seconds, 2),
        "step_s": round(step, 4),
        "timed_steps": round(timed_steps, 1),
        "parts": {k: round(v, 2) for k, v in parts.items()},
        "basis": "pre-flight" if pre else machine.basis(env),
        "capped": bool(capped),
        "uncapped_s": round(uncapped, 2),
        "notes": notes,
    }


def _serve_s(
    spec: Mapping, step: float, flops: float | None, batch: int, rate: float,
    calibrated: bool = False, trained: bool = False,
) -> float:  # fmt: skip
    """An inference run's work outside its steps: the model trained first (``epochs``:
    fp32 eager training steps, three forwards' work each; none where it is ``trained``:
    a later trial loads its first trial's weights) and scored twice on its
    held-out split (the fp32 model, the served one), the INT8 calibration (none where
    it is ``calibrated``: carried from the first trial) and preparation or the
    TorchScript trace, and the checks after the steps."""
    from ..rank import inference

    fp32_forward = (flops * batch / (rate * 1e9) if flops else step) + STEP_OVERHEAD_S
    seconds = SERVE_CHECK_STEPS * step + fp32_forward  # (and the reference's logits)
    if spec.get("precision") == "int8":
        # (the calibration's forward passes run in fp32, through the observers)
        passes = 0 if calibrated else inference.CALIBRATION_BATCHES
        seconds += passes * fp32_forward * 2 + SERVE_PREPARE_S
    elif spec.get("ipex_torchscript"):
        seconds += SERVE_PREPARE_S
    epochs = int(spec.get("epochs") or 0)
    if epochs:
        text = spec.get("data") == "keywords"
        train = workloads.KEYWORDS_TRAIN if text else DIGITS_TRAIN_IMAGES
        held_out = workloads.KEYWORDS_TEST if text else DIGITS_TEST_IMAGES
        # (served weights are loaded, not trained: another experiment's, or, ``trained``,
        # the first trial's)
        if not spec.get("weights_from") and not trained:
            seconds += epochs * math.ceil(train / batch) * 3 * fp32_forward
        seconds += 2 * math.ceil(held_out / batch) * step
    return seconds


def _grad_check_s(
    spec: Mapping,
    flops: float | None,
    batch: int,
    rate: float,
    bf16: float,
    carries: Collection[str] = frozenset(),
) -> float:
    """The gradient check's references after the steps (none in inference, nor for plain
    fp32 eager, its own reference); those another experiment made (:data:`READ_FP64`,
    :data:`READ_OWN` in ``carries``: rank/references.py) are read instead."""
    if spec.get("mode") == "inference" or flops is None or not gradcheck.needs_reference(spec):
        return 0.0
    eager = rate / (COMPILED_SPEED if spec.get("compile") not in (None, "none") else 1.0)
    fp32_step = flops * batch / (eager * 1e9)
    if READ_FP64 in carries:
        seconds = REFERENCE_READ_S
    else:
        seconds = MODEL_BUILD_S + FP64_STEP_RATIO * fp32_step
    if not gradcheck.plain_eager(spec):
        own = fp32_step * (bf16 if spec.get("precision") == "bf16" else 1.0)
        seconds += REFERENCE_READ_S if READ_OWN in carries else MODEL_BUILD_S + own
    return seconds


# --------------------------------------------------------------------------- the study


def for_trial(
    spec: Mapping,
    reference: Mapping | None,
    container: bool,
    warm: bool = False,
    forks: bool = False,
    carried: Mapping | None = None,
    shared_references: Iterable[str] = (),
) -> dict:
    """One trial's estimate as its record keeps it: from the reference (its environment's
    calibration) the trial policy reads, else a quick measurement here. ``warm``: a
    later trial that starts from its first trial's compile cache; ``forks``: a
    one-process trial is forked from a warm interpreter (runtimes/warm.py);
    ``carried``: what the trial carries (trial/carry.py: the gradient comparison's
    ``negligible`` parameters, ``flops_per_sample``), whose work it then does not do;
    ``shared_references``: the gradient check's references (their kinds) that another
    experiment left (rank/references.py)."""
    from .. import sysinfo

    env = spec.get("env") or "upstream"
    calibrated = isinstance(reference, Mapping) and reference.get("ceiling")
    cpus = len(sysinfo.plan_cpus())
    machine = Machine(
        {env: reference if calibrated else None},
        None if calibrated else quick_fp32_gflops(cpus=cpus),
        cpus,
        sysinfo.topology().get("cpu_flags") or [],
        container=container,
        forks=forks,
    )
    carries = {"compile"} if warm else set()
    if isinstance(carried, Mapping):
        carries |= {"grad_check"} if "negligible" in carried else set()
        carries |= {"flop_count"} if "flops_per_sample" in carried else set()
        carries |= {"int8_calibration"} if "int8_calibration" in carried else set()
        carries |= {"weights"} if "weights" in carried else set()
    carries |= reference_carries(shared_references)
    return trial(spec, machine, carries=carries)


def reference_carries(kinds: Iterable[str]) -> set[str]:
    """What :func:`trial` is told of the gradient check's references another experiment
    made (their kinds, rank/references.py): :data:`READ_FP64`, :data:`READ_OWN`."""
    return {READ_FP64 if k == "fp64" else READ_OWN for k in kinds}
