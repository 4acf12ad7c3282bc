"""Every result and provenance column of ``summary.csv``, declared once.

A :class:`Result` holds what the workflow knows of one figure a trial's record gives:
its column name, its kind (number, integer, text, flag), its unit and a help line, the
part of the summary it belongs to, where a plain figure sits in the record
(``source``: read as its kind, no code), how the report's per-experiment statistics
take it over an experiment's trials (``stat``) and, with a ``label``, the column the
report's experiment tables show it in. The summary's columns and their types
(``records.py``) and the statistics the report reads (``report/stats.py``,
``report/html.py``) are derived from :data:`RESULTS`, as the knobs' columns are from
``spec/fields.py`` (their place: :data:`SPEC`, between the served model's figures and
the provenance).

Adding a measured figure is one declaration here with its ``source`` (and the line of
the harness that writes it into the record); a figure computed from several parts of
the record also has its line in the section's function in ``records.py``.
"""

from __future__ import annotations

import dataclasses

from .. import backends, sysinfo

KINDS = ("number", "integer", "text", "flag")
#: the parts of a summary row, in the order of its columns (``spec``: the knobs'
#: columns, declared in spec/fields.py)
SECTIONS = ("main", "accuracy", "measurement", "gradient", "serving", "spec", "provenance", "error")
SPEC = "spec"
#: how the report's statistics take a figure over an experiment's trials:
#: ``first``: the value of the trials it uses, of any trial where they have none
#: (what the experiment is: its backend, versions, node type, ...); ``median`` over
#: the trials it uses (ok, not noisy; all ok ones when every one is noisy);
#: ``median_any`` over those or, without any, over every trial (a check's figures,
#: also of an incorrect run); ``median_ok`` over every ok trial (what noise does not
#: change); ``median_cold``: over the used trials that compiled into an empty cache (a
#: later trial starts from its first trial's: trial/carry.py), else over the ok ones
#: that did; ``distinct``: the distinct texts of every trial; ``distinct_ok``: of the
#: ok ones
STATS = ("first", "median", "median_any", "median_ok", "median_cold", "distinct", "distinct_ok")


@dataclasses.dataclass(frozen=True)
class Result:
    """One column of ``summary.csv`` that a trial's record gives."""

    name: str
    kind: str
    section: str
    unit: str = ""
    help: str = ""
    #: where a plain figure sits in the record (keys from its top), read as ``kind``;
    #: empty: its section's function in records.py computes it
    source: tuple[str, ...] = ()
    #: how the report's experiment statistics take it (:data:`STATS`); None: not at all
    #: (or by their own code, as the throughput and the accuracy)
    stat: str | None = None
    #: its column in the report's experiment tables (None: shown by its own sections)
    label: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"result {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.section not in SECTIONS or self.section == SPEC:
            raise ValueError(f"result {self.name}: section {self.section!r} is not a result's")
        if self.stat is not None and self.stat not in STATS:
            raise ValueError(f"result {self.name}: stat {self.stat!r} is not one of {STATS}")
        if self.label and not self.stat:
            raise ValueError(f"result {self.name}: a label needs a stat (what the table shows)")

    @property
    def numeric(self) -> bool:
        return self.kind in ("number", "integer")

    @property
    def integer(self) -> bool:
        return self.kind == "integer"

    @property
    def text(self) -> bool:
        return self.kind in ("text", "flag")


def _main() -> list[Result]:
    m = "main"
    step = [
        Result(f"step_time_{k}_s", "number", m, "s", f"{what} of the timed steps' times", stat=s)
        for k, what, s in (
            ("median", "the median", "median"),
            ("p90", "the 90th percentile", "median"),
            ("p95", "the 95th percentile", "median"),
            ("p99", "the 99th percentile", "median"),
            ("stdev", "the standard deviation", None),
            ("mean", "the mean", None),
        )
    ]
    return [
        Result("experiment", "text", m, help="the experiment's id"),
        Result("trial", "integer", m, help="the trial's index (0 first)"),
        Result("backend", "text", m, help="the backend it ran on", stat="first"),
        Result("status", "text", m, help="ok, incorrect, failed, crashed, timeout, oom, ..."),
        Result("samples_per_s", "number", m, "samples/s", "throughput of the timed steps"),
        *step,
        Result(
            "time_to_first_step_s",
            "number",
            m,
            "s",
            "from the process's start to the end of the first step (its compile: a cold one)",
            ("metrics", "time_to_first_step_s"),
            stat="median_cold",
        ),
        Result(
            "setup_s",
            "number",
            m,
            "s",
            "building the model, the data and the backend before the first step",
            ("metrics", "setup_s"),
            stat="median",
        ),
        Result(
            "peak_rss_mb",
            "number",
            m,
            "MB",
            "the processes' peak resident memory",
            ("metrics", "peak_rss_mb"),
            stat="median",
        ),
        Result(
            "final_loss",
            "number",
            m,
            help="the loss of the last step",
            source=("metrics", "final_loss"),
            stat="median",
        ),
        Result(
            "threads",
            "integer",
            m,
            help="intra-op threads (torch's own count if unset)",
            stat="first",
        ),
        Result("precision", "text", m, help="fp32, bf16, int8", stat="first"),
    ]


def _accuracy() -> list[Result]:
    a = "accuracy"
    return [
        Result("train_time_s", "number", a, "s", "time to train the epochs"),
        Result("test_accuracy", "number", a, help="held-out accuracy (0-1)"),
        Result("test_loss", "number", a, help="held-out loss"),
        Result(
            "time_to_accuracy_s", "number", a, "s", "training time until target_accuracy was met"
        ),
    ]


def _measurement() -> list[Result]:
    m = "measurement"
    return [
        Result(
            "noisy",
            "flag",
            m,
            help="marked noisy: left out of the report's medians "
            "(unless the noisy trials are the more)",
        ),
        Result(
            "probe_fp32_gflops",
            "number",
            m,
            "GFLOP/s",
            "the noise probe's fp32 matmul rate",
            stat="median",
        ),
        Result(
            "probe_bf16_gflops",
            "number",
            m,
            "GFLOP/s",
            "the noise probe's bf16 matmul rate (bf16 runs only)",
            stat="median",
        ),
        Result("probe_fp32_median_gflops", "number", m, "GFLOP/s", "its comparable trials' median"),
        Result("probe_bf16_median_gflops", "number", m, "GFLOP/s", "its comparable trials' median"),
        Result("probe_size", "integer", m, help="the probe's matrix size"),
        Result("probe_threads", "integer", m, help="the probe's threads"),
        Result("load_avg_1m", "number", m, help="the 1-minute load average before the steps"),
        Result(
            "compile_pool_wait_s",
            "number",
            m,
            "s",
            "waiting for inductor's compile workers",
            ("metrics", "compile_pool_wait_s"),
        ),
        Result("attempts", "integer", m, help="attempts the trial policy ran"),
        Result("discarded_attempts", "integer", m, help="noisy attempts run again"),
        Result(
            "flops_per_sample",
            "number",
            m,
            "FLOP",
            "FLOPs of one sample's step (counted)",
            stat="median",
        ),
        Result("tokens_per_s", "number", m, "tokens/s", "text models' throughput in tokens"),
        Result("achieved_gflops", "number", m, "GFLOP/s", "FLOPs done per second", stat="median"),
        Result(
            "ceiling_gflops",
            "number",
            m,
            "GFLOP/s",
            "the machine's calibrated ceiling (the best of the study's calibrations)",
            stat="median",
        ),
        Result("ceiling_dtype", "text", m, help="the ceiling's data type", stat="first"),
        Result("pct_of_peak", "number", m, "%", "achieved over the ceiling", stat="median"),
        Result("measurement_error", "text", m, help="why a figure is not one", stat="distinct"),
        Result("steps_timed", "integer", m, help="timed steps (fewer under a time budget)"),
        Result(
            "warmup_steps_run",
            "integer",
            m,
            help="untimed steps run: warmup_steps, or fewer where they took long enough "
            "(time_budget_s; a quarter of it where nothing compiles in the steps)",
            source=("metrics", "warmup_steps_run"),
        ),
        Result("time_budget_hit", "flag", m, help="the time budget ended the steps"),
        Result(
            "stop_reason",
            "text",
            m,
            help="why the timed steps ended: steps (all asked), time_budget, precision "
            "(step_precision reached), far_from_baseline (beyond far_stop of its baseline, "
            "the first run before it in its group doing the same work) or epochs",
            source=("metrics", "stop_reason"),
            stat="distinct",
        ),
        Result(
            "step_time_half_width",
            "number",
            m,
            help="the 95 % half-width of the trial's mean step time, of the mean",
            source=("metrics", "step_time_half_width"),
        ),
        Result("step_time_cv", "number", m, help="the step times' CV", stat="median"),
        Result("probe_after_fp32_gflops", "number", m, "GFLOP/s", "the probe after the steps"),
        Result("other_work_share", "number", m, help="CPU time others took on its CPUs"),
        Result("noise_signal", "text", m, help="what marked it noisy", stat="distinct"),
        Result("probe_s", "number", m, "s", "the probes' seconds"),
        Result(
            "trial_wall_s",
            "number",
            m,
            "s",
            "the trial's whole wall time",
            ("trial_wall_s",),
        ),
        Result(
            "retry_wall_s",
            "number",
            m,
            "s",
            "of it, the discarded attempts and the pauses after them (noise reruns)",
            ("retry_wall_s",),
        ),
        Result(
            "measuring_s",
            "number",
            m,
            "s",
            "of it, in warm-up and timed steps (the first step at a steady step's time)",
        ),
        Result("timed_s", "number", m, "s", "of it, in the timed steps"),
        Result("estimate_s", "number", m, "s", "the estimate of its wall time"),
        Result(
            "tokens_per_sample",
            "number",
            m,
            help="real tokens per sample (text)",
            stat="median",
        ),
        Result("compile_s", "number", m, "s", "the first compile"),
        Result("recompiles", "integer", m, help="recompiles after the first step"),
    ]


def _gradient() -> list[Result]:
    g = "gradient"
    return [
        Result("grad_check", "text", g, help="ok, received or incorrect (rank/gradcheck.py)"),
        Result(
            "grad_params_trained",
            "integer",
            g,
            help="parameter tensors with a usable gradient",
            stat="median_any",
        ),
        Result("grad_params", "integer", g, help="parameter tensors", stat="median_any"),
        Result(
            "grad_max_rel_error",
            "number",
            g,
            help="largest relative error of a gradient against fp64 eager",
            stat="median_any",
        ),
        Result("grad_eager_rel_error", "number", g, help="eager's own error at the precision"),
        Result("grad_check_s", "number", g, "s", "the check's seconds"),
    ]


def _serving() -> list[Result]:
    s = "serving"
    return [
        Result(
            "reference_accuracy",
            "number",
            s,
            help="held-out accuracy of the same weights in fp32 eager",
            stat="median_ok",
        ),
        Result(
            "accuracy_change",
            "number",
            s,
            help="test_accuracy - reference_accuracy",
            stat="median_ok",
        ),
        Result("logits_cosine", "number", s, help="logits' cosine vs fp32", stat="median_ok"),
        Result(
            "logits_rel_diff",
            "number",
            s,
            help="largest logit difference over the largest fp32 logit",
            stat="median_ok",
        ),
        Result("top1_agreement", "number", s, help="equal arg-maxes (share)", stat="median_ok"),
        Result(
            "int8_share",
            "number",
            s,
            help="INT8 kernels over the weight layers",
            stat="median_ok",
        ),
        Result("int8_isa", "text", s, help="the CPU feature INT8 ran on", stat="distinct_ok"),
        Result("serve_s", "number", s, "s", "making the served model", stat="median_ok"),
    ]


#: Python, torch and torchvision, then each backend's own library: a version column each
VERSION_KEYS = [
    "python",
    "torch",
    *sysinfo.LIBRARIES.values(),
    *backends.version_modules().values(),
]


def _provenance() -> list[Result]:
    p = "provenance"
    text = [
        ("affinity", "the CPUs it ran on"),
        ("omp_num_threads", "OMP_NUM_THREADS"),
        ("kmp_affinity", "KMP_AFFINITY"),
        ("ld_preload", "preloaded libraries"),
        ("openmp_runtime", "the OpenMP runtime"),
        ("cpu_model", "the CPU"),
        ("cpu_flags", "its flags"),
    ]
    counts = [
        ("logical_cpus", "logical CPUs"),
        ("physical_cores", "physical cores"),
        ("numa_nodes", "NUMA nodes"),
    ]
    tail = [
        ("env_lock_sha256", "text", "the environment's lock", "first"),
        ("image", "text", "the image"),
        ("image_id", "text", "its ID"),
        ("image_digest", "text", "its digest"),
        ("compile_cache_fresh", "flag", "compiled with an empty cache"),
        ("runtime", "text", "local, podman or docker"),
        ("git_revision", "text", "the workflow's revision"),
        ("git_dirty", "flag", "uncommitted changes"),
        ("hostname", "text", "the host"),
        ("node_type", "text", "CPU model and count", "first"),
        ("slurm_job_id", "text", "the SLURM job"),
        ("started_at", "text", "when it started"),
    ]
    return [
        Result("torch_num_threads", "integer", p, help="torch.get_num_threads()"),
        *(Result(name, "text", p, help=h) for name, h in text),
        *(Result(name, "integer", p, help=h) for name, h in counts),
        *(
            Result(f"{key}_version", "text", p, help=f"{key}'s version", stat="first")
            for key in VERSION_KEYS
        ),
        *(Result(name, kind, p, help=h, stat=(rest or [None])[0]) for name, kind, h, *rest in tail),
    ]


def _error() -> list[Result]:
    return [
        Result("error_type", "text", "error", help="the error's type"),
        Result("error", "text", "error", help="its message and the output's tail"),
    ]


def _declared() -> dict[str, Result]:
    found: dict[str, Result] = {}
    for parts in (_main, _accuracy, _measurement, _gradient, _serving, _provenance, _error):
        for r in parts():
            if r.name in found:
                raise ValueError(f"result {r.name} is declared twice")
            found[r.name] = r
    return found


RESULTS: dict[str, Result] = _declared()


def of(section: str) -> list[str]:
    """The columns of one section, in their order."""
    return [name for name, r in RESULTS.items() if r.section == section]


def with_stat(*stats: str) -> list[str]:
    """The columns the report's statistics take as one of ``stats``."""
    return [name for name, r in RESULTS.items() if r.stat in stats]


def labelled() -> list[Result]:
    """The results shown in the report's experiment tables, in their order."""
    return [r for r in RESULTS.values() if r.label]
