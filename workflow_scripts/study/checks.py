"""The plan-time checks of a resolved study that need no machine: combinations of
fields (the backends' and launchers' own rules, the knobs they own, the rules between
data fields), variables the study controls, and warnings for suspicious settings.
The checks that need the machine (CPUs, memory, files) are in ``machine.py``."""

from __future__ import annotations

import re

from .. import backends, digits, launchers, workloads
from ..spec import fields
from ..spec.fields import ID_ALLOWED, ID_PATTERN
from ..spec.settings import SETTING_DEFAULTS
from ..sysinfo import parse_cpu_list
from ..util import show

# Variables the study sets from the spec (the field to use instead): a run must not get
# them from env_vars, or the record would show the spec while the run used another value.
CONTROLLED_ENV = {
    "OMP_NUM_THREADS": "use threads",
    "MKL_NUM_THREADS": "use threads",
    "LD_PRELOAD": "use launcher run_cpu with allocator/openmp",
    "MALLOC_CONF": "use allocator",
    "GOMP_CPU_AFFINITY": "use cpus",
    "OMP_PROC_BIND": "use cpus",
    "OMP_PLACES": "use cpus",
    # and what a backend sets for every run of its own (Backend.env_vars)
    **{var: f"set by backend {b.name}" for b in backends.all_backends() for var in b.env_vars},
    "VIRTUAL_ENV": "the backend's environment",
    "PYTHONPATH": "the workflow's sources",
    "PATH": "the backend's environment",
    "CCL_ATL_TRANSPORT": "use ccl_transport",
    "CCL_ATL_SHM": "use ccl_transport",
    "FI_PROVIDER": "use ccl_transport",
    "FI_TCP_IFACE": "use ccl_transport",
    "CCL_KVS_IFACE": "set for ccl runs on one host (loopback)",
    "CCL_WORKER_OFFLOAD": "use ccl_worker_offload",
    "RANK": "set by the launcher (ranks)",
    "WORLD_SIZE": "set by the launcher (ranks)",
    "LOCAL_RANK": "set by the launcher (ranks)",
    "MASTER_ADDR": "set by the launcher (ranks)",
    "MASTER_PORT": "set by the launcher (ranks)",
}
CONTROLLED_PREFIXES = {"KMP_": "use openmp (run_cpu sets KMP_* for Intel OpenMP)"}


def _owner_problems(spec: dict, kind: str, owners: list) -> list[str]:
    """A knob that only some backends (or launchers) act on, set away from its neutral
    value while another one runs it (a knob may have several owners: torchrun's and
    accelerate's ranks)."""
    owned: dict[str, list] = {}
    for owner in owners:
        for knob, neutral in owner.owns.items():
            owned.setdefault(knob, []).append((owner.name, neutral))
    problems = []
    for knob, by in owned.items():
        names = [name for name, _ in by]
        if spec[kind] in names or all(spec[knob] == neutral for _, neutral in by):
            continue
        need = " or ".join(repr(n) for n in names)
        problems.append(
            f"{knob} {show(spec[knob])} needs {kind} {need} (got {kind} {spec[kind]!r})"
        )
    return problems


TEXT_DATA = ("synthetic", "per_sample", "keywords")
#: the text data whose sample lengths ``padding: dynamic`` draws (workloads.sample_lengths)
DYNAMIC_PADDING_DATA = ("synthetic", "per_sample")
#: the data sets with a held-out test split that ``epochs`` measures accuracy on
HELD_OUT = ("digits", "keywords")


def _workload_problems(spec: dict) -> list[str]:
    """What the model's family cannot take: a text model has no images (no image size,
    channels_last, image folder or digits), an image model no sequence length."""
    w = workloads.WORKLOADS.get(spec["model"])
    if w is None:
        return []  # the schema names the allowed models
    model = f"model {spec['model']!r} ({w.family})"
    if not w.text:
        if spec["attention"] is not None:
            return [f"attention {spec['attention']!r} needs a text model (got {model})"]
        if spec["padding"] != "fixed":
            return [f"padding {spec['padding']!r} needs a text model (got {model})"]
        if spec["data"] == "keywords":
            return [f"data 'keywords' needs a text classifier (got {model})"]
        if spec["seq_len"] is not None:
            return [f"seq_len {spec['seq_len']} needs a text model (got {model})"]
        if spec["image_size"] is None:
            return [f"image_size null needs a text model ({model} takes images)"]
        return []
    problems = []
    if spec["image_size"] is not None:
        problems.append(f"image_size {spec['image_size']} needs an image model (got {model})")
    if spec["channels_last"]:
        problems.append(f"channels_last needs an image model (got {model}: 2-D token ids)")
    if spec["data"] not in TEXT_DATA:
        problems.append(
            f"data {spec['data']!r} needs an image model (got {model}); a text model "
            f"takes data {' or '.join(repr(d) for d in TEXT_DATA)}"
        )
    if spec["data"] == "keywords" and w.task != "sequence-classification":
        problems.append(
            f"data 'keywords' (a text-classification task) needs a sequence-classification "
            f"model (got {model}, task {w.task})"
        )
    if spec["padding"] == "dynamic" and spec["data"] not in DYNAMIC_PADDING_DATA:
        problems.append(
            f"padding 'dynamic' needs data {' or '.join(repr(d) for d in DYNAMIC_PADDING_DATA)} "
            f"(got data {spec['data']!r}, whose sequences are all seq_len long)"
        )
    compiled = spec["compile"] not in (None, "none")
    timed_from_second = not spec["epochs"] and spec["mode"] == "train"
    if spec["dropout"] and compiled and timed_from_second and spec["warmup_steps"] < 2:
        problems.append(
            f"dropout with compile {spec['compile']!r} needs warmup_steps 2 at least (got "
            f"{spec['warmup_steps']}): the first step runs without dropout (the gradient "
            "check's) and the second compiles again with it, before the timed steps"
        )
    positions = w.hf_config.get("max_position_embeddings") or w.hf_config.get("n_positions")
    if positions and spec["seq_len"] > positions:
        problems.append(
            f"seq_len {spec['seq_len']} is longer than the {positions} positions of {model}"
        )
    return problems


def _inference_problems(spec: dict) -> list[str]:
    """Inference runs forward passes in one process: nothing to train for an accuracy,
    no gradients for data-parallel ranks to average."""
    if spec["mode"] != "inference":
        problems = []
        if spec["weights_from"]:
            problems.append(
                f"weights_from {spec['weights_from']!r} needs mode 'inference' (a served "
                "model takes trained weights; a training run trains its own)"
            )
        if spec["precision"] == "int8":
            problems.append(
                "precision 'int8' needs mode 'inference' (static post-training quantization "
                "of a model that is served, not trained)"
            )
        if spec["compile_freezing"]:
            problems.append(
                "compile_freezing needs mode 'inference' (inductor freezes the weights of a "
                "model that is served; a training step changes them)"
            )
        return problems
    problems = []
    if spec["epochs"] and spec["data"] not in HELD_OUT:
        problems.append(
            f"epochs {spec['epochs']} in mode 'inference' trains the model before it is "
            f"served and scores it on a held-out split: it needs data "
            f"{' or '.join(repr(d) for d in HELD_OUT)} (got data {spec['data']!r})"
        )
    if spec["weights_from"] and not spec["epochs"]:
        problems.append(
            f"weights_from {spec['weights_from']!r} needs epochs (the training the weights "
            "come from, and the held-out split the served model is scored on)"
        )
    backend = backends.get(spec["backend"])
    if spec["precision"] == "int8" and backend.int8 is None:
        with_int8 = [b.name for b in backends.all_backends() if b.int8]
        problems.append(
            f"precision 'int8' needs a backend with an INT8 path "
            f"({' or '.join(repr(n) for n in with_int8)}; got backend {backend.name!r})"
        )
    if spec["compile_freezing"] and spec["compile"] != "inductor":
        problems.append(
            f"compile_freezing needs compile 'inductor' (got compile {spec['compile']!r})"
        )
    if launchers.get(spec["launcher"]).distributed:
        problems.append(
            f"mode 'inference' runs one process (got launcher {spec['launcher']!r}: "
            "data-parallel training)"
        )
    return problems


def _schedule_problems(spec: dict) -> list[str]:
    """The learning-rate warm-up, the accuracy target and the scoring during training:
    each measured in epochs, so each needs a training of epochs."""
    problems = []
    warmup, epochs = spec["lr_warmup_epochs"], spec["epochs"]
    if warmup and spec["batch_scaling"] != "weak":
        problems.append(
            f"lr_warmup_epochs {show(warmup)} needs batch_scaling 'weak' (it warms the scaled "
            "learning rate up from the one-process rate; with batch_scaling 'fixed' nothing "
            "is scaled)"
        )
    elif warmup and not epochs:
        problems.append(f"lr_warmup_epochs {show(warmup)} needs epochs (it counts in epochs)")
    elif warmup and warmup > epochs:
        problems.append(
            f"lr_warmup_epochs {show(warmup)} is longer than the training (epochs {epochs})"
        )
    if spec["lr_schedule"] == "linear" and warmup:
        problems.append(
            f"lr_warmup_epochs {show(warmup)} (the weak-scaling warm-up) and lr_schedule "
            "'linear' (its own warm-up, lr_warmup_steps) both set the learning rate; use "
            "lr_schedule 'constant' with lr_warmup_epochs"
        )
    if spec["lr_schedule"] == "constant" and spec["lr_warmup_steps"]:
        problems.append(
            f"lr_warmup_steps {spec['lr_warmup_steps']} needs lr_schedule 'linear' (the "
            "constant schedule has no warm-up)"
        )
    if spec["target_accuracy"] is not None and not epochs:
        problems.append(
            f"target_accuracy {show(spec['target_accuracy'])} needs epochs (a training scored "
            "on a held-out split)"
        )
    if spec["evals_per_epoch"] > 1 and not epochs:
        problems.append(f"evals_per_epoch {spec['evals_per_epoch']} needs epochs")
    return problems


def check_spec(spec: dict) -> list[str]:
    """Combination problems of one resolved spec, as short sentences: the backend's and
    the launcher's own rules, the knobs they own, and the rules between data fields."""
    problems: list[str] = []
    backend = backends.get(spec["backend"])
    for other in backends.all_backends():
        if spec["compile"] in other.compile_options and other is not backend:
            problems.append(
                f"compile {spec['compile']!r} needs backend {other.name!r} "
                f"(got backend {backend.name!r})"
            )
    problems += _owner_problems(spec, "backend", backends.all_backends())
    problems += backend.check(spec)
    if spec["compile"] == "none" and spec["compile_mode"] != "default":
        problems.append(
            f"compile_mode {spec['compile_mode']!r} needs a compile (got compile 'none')"
        )
    elif spec["compile"] not in ("none", "inductor") and spec["compile_mode"] != "default":
        problems.append(
            f"compile_mode {spec['compile_mode']!r} needs compile 'inductor' (compile "
            f"{spec['compile']!r} ignores it)"
        )
    for name in spec["env_vars"]:
        field = CONTROLLED_ENV.get(name) or next(
            (f for prefix, f in CONTROLLED_PREFIXES.items() if name.startswith(prefix)), None
        )
        if field:
            problems.append(
                f"env_vars.{name} is set by the study itself ({field}); an override would "
                "run something else than the record says"
            )
    problems += _owner_problems(spec, "launcher", launchers.all_launchers())
    problems += launchers.get(spec["launcher"]).check(spec)
    problems += _workload_problems(spec)
    problems += _inference_problems(spec)
    problems += _schedule_problems(spec)
    if spec["data"] == "synthetic" and spec["num_workers"] != 0:
        problems.append(
            f"num_workers {spec['num_workers']} needs data 'per_sample' or 'image_folder' "
            "(data 'synthetic' reuses one in-memory batch; num_workers must be 0)"
        )
    if spec["epochs"] and spec["data"] not in HELD_OUT:
        problems.append(
            f"epochs {spec['epochs']} needs data 'digits' or 'keywords' (a data set with a "
            f"held-out test split that the accuracy is measured on; got data {spec['data']!r})"
        )
    if spec["data"] == "keywords" and spec["batch_size"] > workloads.KEYWORDS_TRAIN:
        problems.append(
            f"batch_size {spec['batch_size']} is larger than the {workloads.KEYWORDS_TRAIN} "
            "training sequences of data 'keywords'"
        )
    if spec["epochs"] and spec["time_budget_s"] is not None:
        problems.append(
            f"time_budget_s {show(spec['time_budget_s'])} would cut a training of epochs "
            f"{spec['epochs']} short (its accuracy then means nothing); set time_budget_s: "
            "null (timeout_s still ends a run that hangs)"
        )
    if spec["max_steps"] is not None and spec["max_steps"] <= spec["warmup_steps"]:
        problems.append(
            f"max_steps {spec['max_steps']} leaves no timed step after warmup_steps "
            f"{spec['warmup_steps']} (max_steps counts the warm-up too)"
        )
    if spec["data"] == "digits" and spec["batch_size"] > digits.TRAIN_IMAGES:
        problems.append(
            f"batch_size {spec['batch_size']} is larger than the {digits.TRAIN_IMAGES} "
            "training images of data 'digits'"
        )
    if spec["data_dir"] is not None and spec["data"] != "image_folder":
        problems.append(
            f"data_dir {spec['data_dir']!r} needs data 'image_folder' (got data {spec['data']!r})"
        )
    workload = workloads.WORKLOADS.get(spec["model"])
    if (
        workload
        and workload.batch_norm_1x1_at
        and spec["mode"] == "train"  # in eval mode batch norm uses its running statistics
        and spec["batch_size"] == 1
        and spec["image_size"] <= workload.batch_norm_1x1_at
    ):
        problems.append(
            f"model {spec['model']!r} at batch_size 1 with image_size {spec['image_size']} "
            "ends in 1x1 feature maps, where batch norm has one value per channel and cannot "
            f"train; use batch_size >= 2 or image_size >= {2 * workload.batch_norm_1x1_at}"
        )
    if workload and workload.min_image_size and spec["image_size"] < workload.min_image_size:
        problems.append(
            f"model {spec['model']!r} needs image_size >= {workload.min_image_size} "
            f"(got image_size {spec['image_size']})"
        )
    if spec["cpus"] is not None:
        try:
            parse_cpu_list(spec["cpus"])
        except ValueError as exc:
            problems.append(
                f"cpus {spec['cpus']!r} is not a CPU list ({exc}); "
                "allowed: CPU numbers and a-b ranges (a <= b), comma-separated, e.g. '0-3,6'"
            )
    if not re.match(ID_PATTERN, spec["id"]):
        problems.append(f"id {spec['id']!r} is not allowed; allowed: {ID_ALLOWED}")
    return problems


def setting_warnings(settings: dict) -> list[str]:
    """Legal values that probably do not do what the user wants."""
    out = []
    if settings["noise_threshold"] >= 0.95:
        out.append(
            f"config warning at noise_threshold: {settings['noise_threshold']:g} reruns (and "
            "then flags) nearly every trial: a probe varies by a few percent on a quiet "
            f"machine; the default is {SETTING_DEFAULTS['noise_threshold']:g}"
        )
    if settings["noise_retries"] > 5:
        out.append(
            f"config warning at noise_retries: {settings['noise_retries']} reruns of a "
            "disturbed trial can take hours on a busy machine; the default is "
            f"{SETTING_DEFAULTS['noise_retries']}"
        )
    most = settings.get("max_trials")
    if most is not None and most < settings["trials"]:
        out.append(
            f"config warning at max_trials: {most} is below trials ({settings['trials']}): "
            f"every experiment runs {settings['trials']} trials and no adaptive round (a "
            "max_trials above trials lets an undecided comparison run more)"
        )
    return out


def weights_problems(specs: list[dict]) -> list[tuple[str, str]]:
    """(experiment id, problem) for each ``weights_from`` that names no experiment of the
    study that trains the same model the same way (its trajectory fields), or one that
    takes its weights from another in turn."""
    by_id = {s["id"]: s for s in specs}
    problems = []
    for spec in specs:
        source = spec.get("weights_from")
        if not source:
            continue
        other = by_id.get(source)
        if other is None:
            problems.append((spec["id"], f"weights_from {source!r} names no experiment"))
            continue
        if other.get("weights_from") or other["mode"] != "inference" or not other["epochs"]:
            problems.append(
                (spec["id"], f"weights_from {source!r} must name an inference experiment that "
                 "trains its model itself (mode 'inference', epochs, no weights_from)")
            )  # fmt: skip
            continue
        differ = [k for k in fields.trajectory_keys() if spec.get(k) != other.get(k)]
        if differ:
            said = ", ".join(f"{k} {show(spec.get(k))} vs {show(other.get(k))}" for k in differ)
            problems.append(
                (spec["id"], f"weights_from {source!r} trains another model or another way "
                 f"({said}): the served weights would not be what this run says")
            )  # fmt: skip
    return problems
