"""Every experiment field and every top-level setting, declared once.

A :class:`Field` holds all that the workflow knows of one experiment knob: its
JSON schema (type and allowed values), its built-in default, a help line, its tag
in experiment ids, whether ``summary.csv`` has a column for it, its label in the
report and how the report compares runs that differ in it (its role, the order
differences are named in, its missing and reference values, whether it changes the
training trajectory). The config schema (``schema.py``), the defaults table, id
derivation (``config.py``), the summary columns (``summary/records.py``) and what the report
holds comparable (``report/compare.py``, ``report/quality.py``) are all derived from
:data:`FIELDS`. Adding a knob is one declaration here plus the
code that applies it (see docs/extending.md).

The backends and launchers contribute the allowed values of ``backend``,
``launcher`` and ``compile`` (``workflow_scripts/backends``, ``.../launchers``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import backends, launchers, workloads

ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
ID_ALLOWED = "1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
CPUS_PATTERN = "^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"


#: the report's comparison roles: ``workload`` changes what is trained (no throughput
#: ratio across it); ``setting`` changes how, and a backend head-to-head holds it fixed;
#: ``variant`` is a backend's own knob (part of the backend variant a head-to-head
#: compares); ``detail`` is named where runs differ but held fixed nowhere; ``none``
#: (role None) is never compared (a label, a claim, the number of steps)
COMPARE_ROLES = ("workload", "setting", "variant", "detail")
UNSET = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


def safe(text: str) -> str:
    """Text reduced to the characters an id may hold."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.-") or "x"


def _plain_tag(value: Any) -> str:
    return safe(str(value))


def _flag(on: str, off: str) -> Callable[[Any], str]:
    return lambda v: on if v else off


def _prefixed(prefix: str, fmt: str = "{}") -> Callable[[Any], str]:
    return lambda v: prefix + fmt.format(v)


def _family_training(spec: dict, key: str):
    """The model family's own value of a training knob (``workloads.TRAINING_DEFAULTS``)."""
    w = workloads.WORKLOADS.get(spec["model"])
    return workloads.TRAINING_DEFAULTS[w.family][key] if w else None


def _seq_len_reference(spec: dict, defaults: dict) -> int | None:
    w = workloads.WORKLOADS.get(spec["model"])
    return w.seq_len if w else None


@dataclasses.dataclass(frozen=True)
class Field:
    """One experiment field."""

    name: str
    #: JSON schema of one value (``$defs/<name>`` in the config schema)
    schema: dict | Callable[[], dict]
    #: built-in default (``compile: null`` resolves to the backend's own choice)
    default: Any
    help: str
    #: the field's tag in ids: ``<name>-<tags of the swept fields>``
    tag: Callable[[Any], str] = _plain_tag
    #: position in an id derived from the fields (None: in the id only when swept)
    id_pos: int | None = None
    #: in a derived id always (True) or only when the value differs from its reference
    id_always: bool = False
    #: the value at which a derived id leaves the field out: f(spec, resolved defaults)
    #: (None: the built-in default)
    id_reference: Callable[[dict, dict], Any] | None = None
    #: a column of summary.csv (where the record's spec holds it)
    column: bool = False
    #: the report's name for it
    label: str | None = None
    #: set on each experiment, never in ``defaults`` and never swept
    per_experiment: bool = False
    #: may hold a list of values in a sweep
    sweepable: bool = True
    #: how the report compares runs that differ in it (see :data:`COMPARE_ROLES`);
    #: None: never (None for a field with a summary column means "setting")
    compare: str | None = None
    #: the order differences are named in (None: after the numbered ones, in field order)
    compare_pos: int | None = None
    #: what a run without a value (an older record, a summary without the column) had
    missing: Any = None
    #: the value the plain fp32 eager reference has, for an optimization knob (UNSET: any)
    reference: Any = UNSET
    #: runs that differ in it train differently step by step: their loss curves are
    #: never compared (None for a field with a summary column means True)
    trajectory: bool | None = None
    #: its place among the settings that split a sweep's plot into several lines where
    #: its runs differ in them (None: it never does)
    series: int | None = None

    @property
    def role(self) -> str | None:
        if self.compare is not None:
            return None if self.compare == "none" else self.compare
        return "setting" if self.column else None

    @property
    def changes_trajectory(self) -> bool:
        if self.trajectory is not None:
            return self.trajectory
        return self.role in ("workload", "setting")

    def value_schema(self) -> dict:
        return self.schema() if callable(self.schema) else self.schema

    @property
    def types(self) -> list[str]:
        """The JSON types a value may have (empty for an enum)."""
        types = self.value_schema().get("type", [])
        return [types] if isinstance(types, str) else list(types)

    @property
    def integer(self) -> bool:
        return "integer" in self.types

    @property
    def numeric(self) -> bool:
        return "integer" in self.types or "number" in self.types


def _backend_schema() -> dict:
    return {"enum": backends.names()}


def _compile_schema() -> dict:
    return {"enum": [None, "none", *backends.compile_values()]}


def _launcher_schema() -> dict:
    return {"enum": launchers.names()}


def _data_dir_tag(value: Any) -> str:
    return "dir-" + (safe(Path(value).name) if value else "generated")


FIELDS: dict[str, Field] = {
    f.name: f
    for f in [
        Field(
            "id",
            {"type": "string", "pattern": ID_PATTERN, "description": ID_ALLOWED},
            None,
            "the experiment's name in results and the report (derived from the fields "
            "when left out)",
            per_experiment=True,
            sweepable=False,
        ),
        Field(
            "group",
            {"type": "string", "minLength": 1},
            None,
            "puts experiments side by side in the report; its first one is the baseline",
            column=True,
            label="group",
            per_experiment=True,
            sweepable=False,
            compare="none",
        ),
        Field(
            "claim_speedup",
            {"type": ["number", "null"], "exclusiveMinimum": 0},
            None,
            "the article's claimed speedup over the group's baseline, shown beside ours",
            column=True,
            label="claimed speedup",
            per_experiment=True,
            sweepable=False,
            compare="none",
        ),
        Field(
            "backend",
            _backend_schema,
            "eager",
            "where and how the model trains (workflow_scripts/backends)",
            id_pos=1,
            label="backend",
            compare="variant",
            compare_pos=0,
            reference="eager",
            trajectory=False,
            series=1,
        ),
        Field(
            "model",
            lambda: {"enum": workloads.names()},
            "resnet50",
            "what is trained (workflow_scripts/workloads.py): torchvision ResNet-50/18 from "
            "scratch, a small CNN, or a transformers model with random weights: BERT for "
            "sequence classification, GPT-2 for causal-LM fine-tuning, and tiny variants",
            id_pos=0,
            id_always=True,
            column=True,
            label="model",
            compare="workload",
            series=2,
        ),
        Field(
            "mode",
            {"enum": ["train", "inference"]},
            "train",
            "train: forward, backward and an optimizer step; inference: the forward pass alone, "
            "in eval mode under torch.inference_mode (as the IPEX deck measures it)",
            tag={"train": "train", "inference": "infer"}.get,
            id_pos=0.5,
            column=True,
            label="mode",
            compare="workload",
        ),
        Field(
            "batch_size",
            {"type": "integer", "minimum": 1},
            16,
            "samples per step",
            tag=_prefixed("bs"),
            id_pos=13,
            id_always=True,
            column=True,
            label="batch",
            compare_pos=14,
            series=8,
        ),
        Field(
            "image_size",
            {"type": ["integer", "null"], "minimum": 8},
            224,
            "input images are image_size x image_size pixels (image models; a text "
            "model's spec holds null)",
            tag=_prefixed("px"),
            id_pos=14,
            id_reference=lambda spec, defaults: (
                defaults["image_size"] if spec["image_size"] else None
            ),
            column=True,
            label="image size",
            compare="workload",
        ),
        Field(
            "seq_len",
            {"type": ["integer", "null"], "minimum": 2},
            None,
            "tokens per sample of a text model (null: the model's own, e.g. 128 for BERT "
            "as in Accelerate's example; an image model's spec holds null)",
            tag=_prefixed("seq"),
            id_pos=14.5,
            id_reference=_seq_len_reference,
            column=True,
            label="sequence length",
            compare="workload",
        ),
        Field(
            "attention",
            {"enum": [None, "sdpa", "eager"]},
            None,
            "a text model's attention implementation in transformers: sdpa (its default, "
            "torch's fused scaled_dot_product_attention) or eager (plain matmuls and softmax); "
            "null: sdpa for a text model (an image model's spec holds null)",
            tag=_prefixed("attn-"),
            id_pos=14.6,
            id_reference=lambda spec, defaults: "sdpa" if spec.get("seq_len") else None,
            column=True,
            label="attention",
            compare="setting",
            compare_pos=14.5,
            reference="sdpa",
            trajectory=False,
        ),
        Field(
            "dropout",
            {"type": "boolean"},
            False,
            "a transformer's own dropout (Hugging Face's configs: 0.1, as users fine-tune); "
            "false: every dropout off. The gradient check's step (the first) runs without "
            "it, the model in eval mode, and so does its reference; a compiled run then "
            "compiles again at its second step. Image models have none either way",
            tag=_flag("drop", "nodrop"),
            id_pos=14.7,
            column=True,
            label="dropout",
            compare="setting",
            compare_pos=14.6,
            missing=False,
        ),
        Field(
            "padding",
            {"enum": ["fixed", "dynamic"]},
            "fixed",
            "a text model's batches: fixed (every sample seq_len real tokens) or dynamic "
            "(sample lengths drawn from a fixed MRPC-like distribution up to seq_len, each "
            "batch padded to its longest, the attention mask zero on the pads: "
            "workflow_scripts/workloads.py); data synthetic or per_sample",
            tag=_prefixed("pad-"),
            id_pos=14.7,
            column=True,
            label="padding",
            compare="workload",
            missing="fixed",
        ),
        Field(
            "data",
            {"enum": ["synthetic", "per_sample", "image_folder", "digits", "keywords"]},
            "synthetic",
            "synthetic: one in-memory batch; per_sample: torch.randn per sample in a "
            "DataLoader; image_folder: JPEGs decoded with PIL; digits: scikit-learn's 8x8 "
            "digits upscaled to image_size, with a held-out test split (for epochs); "
            "keywords: a generated text-classification task (each sequence holds keywords "
            "of its class among random tokens), with a held-out test split (for epochs)",
            tag={
                "synthetic": "synthetic",
                "per_sample": "persample",
                "image_folder": "folder",
                "digits": "digits",
                "keywords": "keywords",
            }.get,
            id_pos=7,
            column=True,
            label="data",
            compare_pos=15,
        ),
        Field(
            "data_dir",
            {
                "type": ["string", "null"],
                # mounted into a run's container (podman --volume <path>:...): no ':' or ','
                "pattern": "^[^-:,\\x00-\\x1f][^:,\\x00-\\x1f]*$",
                "description": "a folder's path, not starting with '-', without ':', ',' or "
                "control characters",
            },
            None,
            "the image folder for data image_folder (null: a generated one)",
            tag=_data_dir_tag,
        ),
        Field(
            "num_workers",
            {"type": "integer", "minimum": 0},
            0,
            "DataLoader worker processes",
            tag=_prefixed("nw"),
            id_pos=8,
            column=True,
            label="workers",
            compare_pos=16,
            series=9,
        ),
        Field(
            "precision",
            {"enum": ["fp32", "bf16", "int8"]},
            "fp32",
            "fp32, bf16 autocast, or int8 (mode inference: static post-training quantization, "
            "through ipex.quantization with backend ipex, PT2E's X86InductorQuantizer with "
            "backend inductor)",
            id_pos=5,
            id_always=True,
            label="precision",
            compare="setting",
            compare_pos=2,
            reference="fp32",
            trajectory=False,
            series=3,
        ),
        Field(
            "channels_last",
            {"type": "boolean"},
            False,
            "channels_last memory format for the model and its inputs",
            tag=_flag("cl", "nocl"),
            id_pos=6,
            column=True,
            label="channels_last",
            compare_pos=3,
            reference=False,
            trajectory=False,
            series=4,
        ),
        Field(
            "compile",
            _compile_schema,
            None,
            "torch.compile backend (null: the backend's own choice)",
            tag=_prefixed("compile-"),
            id_pos=2,
            id_reference=lambda spec, defaults: backends.get(spec["backend"]).default_compile,
            column=True,
            label="compile",
            compare="variant",
            compare_pos=4,
            missing="none",
            reference="none",
            trajectory=False,
            series=5,
        ),
        Field(
            "compile_mode",
            {"enum": ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]},
            "default",
            "torch.compile mode",
            id_pos=3,
            column=True,
            label="compile mode",
            compare="variant",
            compare_pos=5,
            missing="default",
            trajectory=False,
        ),
        Field(
            "compile_freezing",
            {"type": "boolean"},
            False,
            "inductor's freezing (torch._inductor.config.freezing: the weights folded in as "
            "constants, prepacked for the CPU's kernels; mode inference)",
            tag=_flag("frozen", "nofrozen"),
            id_pos=3.5,
            column=True,
            label="freezing",
            compare="variant",
            compare_pos=5.5,
            missing=False,
            reference=False,
            trajectory=False,
        ),
        Field(
            "ipex_torchscript",
            {"type": "boolean"},
            False,
            "IPEX's graph path for inference: torch.jit.trace and torch.jit.freeze after "
            "ipex.optimize (or after ipex.quantization's convert, for int8)",
            tag=_flag("jit", "nojit"),
            id_pos=4.5,
            column=True,
            label="TorchScript",
            compare="variant",
            compare_pos=6.5,
            missing=False,
            reference=False,
            trajectory=False,
        ),
        Field(
            "ipex_optimize",
            {"type": "boolean"},
            False,
            "ipex.optimize(model, optimizer) (backend ipex)",
            tag=_flag("ipexopt", "noipexopt"),
            id_pos=4,
            column=True,
            label="ipex.optimize",
            compare="variant",
            compare_pos=6,
            reference=False,
            trajectory=False,
        ),
        Field(
            "launcher",
            _launcher_schema,
            "none",
            "none, run_cpu (torch.backends.xeon.run_cpu), torchrun (ranks processes, "
            "data-parallel), or accelerate (accelerate launch with a config file per trial, "
            "the step through Accelerator; ranks processes by mpirun)",
            tag=lambda v: "nolauncher" if v == "none" else safe(v).replace("_", ""),
            id_pos=10,
            column=True,
            label="launcher",
            compare_pos=7,
            trajectory=False,
            series=6,
        ),
        Field(
            "ranks",
            {"type": "integer", "minimum": 1},
            1,
            "processes per node of one data-parallel trial (launcher torchrun or accelerate), "
            "each pinned to "
            "its own threads CPUs; batch_size is the global batch, split evenly over them all",
            tag=_prefixed("r"),
            id_pos=15,
            column=True,
            label="ranks",
            compare_pos=10,
            missing=1,
        ),
        Field(
            "nodes",
            {"type": "integer", "minimum": 1},
            1,
            "machines of one data-parallel trial (launcher torchrun; more than 1 needs a "
            "cluster, snakemake --profile profiles/slurm): ranks processes on each, started "
            "by srun; the global batch splits over nodes x ranks",
            tag=_prefixed("n"),
            column=True,
            label="nodes",
            compare_pos=10.5,
            missing=1,
            trajectory=False,
        ),
        Field(
            "dist_backend",
            {"enum": ["gloo", "ccl"]},
            "gloo",
            "the torch.distributed process-group backend of a torchrun or accelerate trial: "
            "gloo, or ccl (oneCCL; environment/image oneccl)",
            id_pos=16,
            column=True,
            label="process group",
            compare_pos=11,
            trajectory=False,
        ),
        Field(
            "ccl_impl",
            {"enum": ["study", "intel"]},
            "study",
            "which ccl backend: the study's own (containers/oneccl/ccl_backend.cpp) or "
            "Intel's oneccl_bindings_for_pytorch where importable",
            tag=_prefixed("ccl-"),
            id_pos=17,
            column=True,
            label="ccl implementation",
            compare="detail",
            compare_pos=11.5,
            missing="study",
            trajectory=False,
        ),
        Field(
            "ccl_transport",
            {"enum": ["shm", "tcp"]},
            "shm",
            "oneCCL's transport between the ranks: shm (ofi with CCL_ATL_SHM=1) or tcp (ofi's "
            "tcp provider)",
            tag=_prefixed("ccl-"),
            id_pos=18,
            column=True,
            label="ccl transport",
            compare="detail",
            compare_pos=12,
            trajectory=False,
        ),
        Field(
            "ccl_worker_offload",
            {"type": "boolean"},
            False,
            "CCL_WORKER_OFFLOAD: oneCCL's progress worker thread per rank (slow on few cores)",
            tag=_flag("cclworker", "nocclworker"),
            id_pos=19,
            column=True,
            label="ccl worker offload",
            compare="detail",
            compare_pos=13,
            trajectory=False,
        ),
        Field(
            "comm_cpu",
            {"type": "boolean"},
            False,
            "reserve the last CPU of each rank's block for communication: oneCCL's worker "
            "thread (ccl_worker_offload) pinned to it, torch's threads on the others "
            "(threads - 1 of them); needs dist_backend ccl, ccl_worker_offload and threads >= 2",
            tag=_flag("commcpu", "nocommcpu"),
            column=True,
            label="comm CPU reserved",
            compare="detail",
            compare_pos=13.5,
            trajectory=False,
        ),
        Field(
            "accelerate_ipex",
            {"type": "boolean"},
            False,
            "Accelerate 1.7.0's ipex_config: {ipex: true} (launcher accelerate, backend ipex): "
            "accelerator.prepare calls ipex.optimize",
            tag=_flag("accipex", "noaccipex"),
            id_pos=19.5,
            column=True,
            label="Accelerate ipex_config",
            compare="variant",
            compare_pos=13.5,
            trajectory=False,
        ),
        Field(
            "allocator",
            {"enum": ["default", "jemalloc", "tcmalloc"]},
            "default",
            "the allocator run_cpu preloads",
            tag=lambda v: v if v != "default" else "defaultalloc",
            id_pos=11,
            column=True,
            label="allocator",
            compare_pos=8,
            trajectory=False,
            series=7,
        ),
        Field(
            "openmp",
            {"enum": ["gnu", "intel"]},
            "gnu",
            "the OpenMP runtime (intel: run_cpu preloads libiomp5)",
            tag=_flag("iomp", "gomp"),
            id_pos=12,
            column=True,
            label="OpenMP",
            compare="detail",
            compare_pos=9,
            trajectory=False,
        ),
        Field(
            "cpus",
            {
                "type": ["string", "null"],
                "pattern": CPUS_PATTERN,
                "description": "a CPU list like '0-3,6' (CPU numbers and a-b ranges, "
                "comma-separated) or null",
            },
            None,
            "the CPUs to pin to (null: all the process may use)",
            tag=lambda v: "cpus" + v.replace(",", "_") if v else "cpusall",
            column=True,
            label="CPUs",
            compare="none",
        ),
        Field(
            "warmup_steps",
            {"type": "integer", "minimum": 1},
            3,
            "untimed steps first (allocation, compilation); fewer where they took "
            "time_budget_s already, or a quarter of it in a run that compiles nothing in its "
            "steps (one at least; two for a compiled run with dropout)",
            tag=_prefixed("warmup"),
            column=True,
            label="warm-up steps",
            compare="none",
        ),
        Field(
            "steps",
            {"type": "integer", "minimum": 1},
            10,
            "timed steps",
            tag=_prefixed("steps"),
            column=True,
            label="steps",
            compare="none",
        ),
        Field(
            "epochs",
            {"type": "integer", "minimum": 0},
            0,
            "train this many passes over the training data (data digits or keywords) instead of "
            "warmup_steps + steps, with no time budget, then measure the held-out test "
            "accuracy; 0: a fixed number of steps",
            tag=_prefixed("ep"),
            id_pos=20,
            column=True,
            label="epochs",
            compare="workload",
            missing=0,
        ),
        Field(
            "weights_from",
            {"type": ["string", "null"]},
            None,
            "mode inference with epochs: serve the weights the named experiment trained (its "
            "first trial; an experiment of this study that trains the same model the same "
            "way) instead of training them again, so that every stack serves the same model",
            per_experiment=True,
            sweepable=False,
            compare="none",
        ),
        Field(
            "max_steps",
            {"type": ["integer", "null"], "minimum": 2},
            None,
            "stop after this many steps in all, warm-up included (an epochs run cut short, "
            "as the pre-flight cuts it); null: every step",
            tag=lambda v: f"max{v}" if v else "nomax",
        ),
        Field(
            "time_budget_s",
            {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]},
            None,
            "stop timing once the timed steps took this long (at least 2 are timed); "
            "null: always all steps",
            tag=lambda v: f"budget{v:g}" if v else "nobudget",
        ),
        Field(
            "step_precision",
            {
                "anyOf": [
                    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                    {"type": "null"},
                ]
            },
            None,
            "stop timing once the trial's mean step time is known within this fraction "
            "(the 95 % interval's half-width over the mean, from at least 3 timed steps), "
            "before steps or the time budget; null: always all steps",
            tag=lambda v: f"prec{v:g}" if v else "noprec",
        ),  # fmt: skip
        Field(
            "far_stop",
            {"anyOf": [{"type": "number", "minimum": 1.1}, {"type": "null"}]},
            None,
            "stop timing once the trial's first timed steps put it beyond this factor of the "
            "speed of the first experiment before it in its group doing the same work per "
            "step, either way "
            "(the 95 % interval of the mean of 2 steps or more wholly beyond; or one step "
            "slower by the factor squared): so far from its baseline, more steps change no "
            "verdict, and where its first trial stops slower by the factor squared, it runs "
            "no other; null: never",
            tag=lambda v: f"far{v:g}" if v else "nofar",
        ),
        Field(
            "threads",
            {"type": ["integer", "null"], "minimum": 1},
            None,
            "intra-op threads (null: all CPUs the process may use)",
            tag=lambda v: f"t{v}" if v is not None else "tdefault",
            id_pos=9,
            label="threads",
            compare="setting",
            compare_pos=17,
            trajectory=False,
            series=10,
        ),
        Field(
            "optimizer",
            {"enum": [None, "sgd", "adamw"]},
            None,
            "sgd (momentum 0.9, the article's) or adamw (torch's AdamW, weight decay 0.01, "
            "as Hugging Face's examples); null: the model family's (vision sgd, text adamw)",
            tag=_plain_tag,
            id_pos=12.5,
            id_reference=lambda spec, defaults: _family_training(spec, "optimizer"),
            column=True,
            label="optimizer",
            compare="setting",
            compare_pos=13.8,
            missing="sgd",
        ),
        Field(
            "optimizer_impl",
            {"enum": ["default", "foreach", "fused"]},
            "default",
            "the optimizer's implementation: torch's own choice (a loop over the parameters "
            "on CPU), foreach (multi-tensor kernels) or fused (one kernel per step); "
            "ipex.optimize may replace the step with IPEX's own (checks.optimizer says which ran)",
            tag=lambda v: "opt" + v,
            id_pos=12.6,
            column=True,
            label="optimizer implementation",
            compare="setting",
            compare_pos=13.9,
            missing="default",
            reference="default",
            trajectory=False,
        ),
        Field(
            "lr",
            {"type": ["number", "null"], "exclusiveMinimum": 0},
            None,
            "learning rate (null: the model family's: 0.01 for vision's SGD, 2e-5 for text's "
            "AdamW); with batch_scaling weak: the one-process rate, multiplied by the number "
            "of ranks",
            tag=_prefixed("lr", "{:g}"),
            column=True,
            label="learning rate",
            compare="none",
            trajectory=True,
        ),
        Field(
            "lr_schedule",
            {"enum": [None, "constant", "linear"]},
            None,
            "constant, or linear: Hugging Face's linear schedule with warm-up (from 0 up to "
            "lr over lr_warmup_steps, then down to 0 at the run's last step), stepped after "
            "every optimizer step; null: the model family's (vision constant, text linear)",
            tag=_plain_tag,
            column=True,
            label="lr schedule",
            compare="none",
            trajectory=True,
        ),
        Field(
            "lr_warmup_steps",
            {"type": ["integer", "null"], "minimum": 0},
            None,
            "the linear schedule's warm-up in optimizer steps (null: the model family's: "
            "100 for text, as Accelerate's nlp_example)",
            tag=_prefixed("warmupsteps"),
            column=True,
            label="lr warm-up steps",
            compare="none",
            trajectory=True,
        ),
        Field(
            "batch_scaling",
            {"enum": ["fixed", "weak"]},
            "fixed",
            "fixed: batch_size is the global batch, split over the ranks (N ranks run the "
            "optimizer of one process); weak: batch_size is each rank's batch, so the global "
            "batch grows with the ranks (nodes x ranks), and lr is scaled by as much (the "
            "linear scaling rule; lr_warmup_epochs warms it up)",
            tag=lambda v: "weak" if v == "weak" else "fixedbatch",
            column=True,
            label="batch scaling",
            compare="detail",
            missing="fixed",
            trajectory=True,
        ),
        Field(
            "lr_warmup_epochs",
            {"type": "number", "minimum": 0},
            0,
            "with batch_scaling weak: raise the learning rate linearly from the one-process "
            "rate to the scaled one over this many epochs (Goyal et al. 2017); 0: none",
            tag=_prefixed("warm", "{:g}"),
            column=True,
            label="lr warm-up (epochs)",
            compare="none",
            missing=0,
            trajectory=True,
        ),
        Field(
            "target_accuracy",
            {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
            None,
            "with epochs: the held-out accuracy (0-1) whose first reaching is timed "
            "(time_to_accuracy_s, training time only); null: not timed",
            tag=lambda v: f"target{v:g}" if v else "notarget",
            column=True,
            label="target accuracy",
            compare="none",
            trajectory=False,
        ),
        Field(
            "evals_per_epoch",
            {"type": "integer", "minimum": 1},
            1,
            "with epochs: score the held-out split this many times per epoch (evenly spaced; "
            "the last at the end), for time_to_accuracy_s; scoring time is not training time",
            tag=_prefixed("evals"),
            trajectory=False,
        ),
        Field(
            "seed",
            {"type": "integer", "minimum": 0},
            0,
            "RNG seed (model initialisation and data order); sweep it (seed: [0, 1, 2]) for "
            "the spread over seeds, which the report's accuracy table shows",
            tag=_prefixed("seed"),
            column=True,
            label="seed",
            compare="none",
            trajectory=True,
        ),
        Field(
            "timeout_s",
            {"type": "integer", "minimum": 1},
            1800,
            "a run still going after this many seconds is killed (status timeout)",
            tag=_prefixed("timeout"),
        ),
        Field(
            "probe_size",
            # a probe of a few milliseconds; 16384 already holds 3 GB of matrices
            {"type": "integer", "minimum": 0, "maximum": 16384},
            1024,
            "the noise probe's matrix size (N x N matmuls before the steps); 0: no probe",
            tag=_prefixed("probe"),
        ),
        Field(
            "warm_compile_cache",
            {"type": "boolean"},
            False,
            "keep torch.compile's caches between runs (default: a fresh, empty one for "
            "the first trial, copied to the later ones)",
            tag=_flag("warmcache", "coldcache"),
            column=True,
            label="warm compile cache",
            compare="none",
        ),
        Field(
            "env_vars",
            {
                "type": "object",
                "propertyNames": {
                    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                    "description": "an environment variable name (letters, digits, '_')",
                },
                # a variable beyond a page is no setting (and Linux refuses an
                # argument or variable beyond 128 KiB when the run starts)
                "additionalProperties": {"type": "string", "maxLength": 4096},
                "maxProperties": 64,
            },
            {},
            "extra environment variables of the run",
            sweepable=False,
        ),
    ]
}

#: the field names, in declaration order
NAMES = list(FIELDS)


def series_keys() -> tuple[str, ...]:
    """The fields that split a sweep's plot into lines, in their order."""
    ordered = sorted((f.series, n) for n, f in FIELDS.items() if f.series is not None)
    return tuple(n for _, n in ordered)


BUILTIN_DEFAULTS: dict[str, Any] = {name: f.default for name, f in FIELDS.items()}
PER_EXPERIMENT = tuple(n for n, f in FIELDS.items() if f.per_experiment)
NOT_SWEPT = ("name", *(n for n, f in FIELDS.items() if not f.sweepable))
INT_FIELDS = tuple(n for n, f in FIELDS.items() if f.integer)
#: fields an id derived from the fields shows, in id order
ID_FIELDS = tuple(sorted((n for n, f in FIELDS.items() if f.id_pos is not None),
                         key=lambda n: FIELDS[n].id_pos))  # fmt: skip
#: fields with a column in summary.csv (besides backend, precision and threads, which
#: the summary shows among its main columns)
COLUMN_FIELDS = tuple(n for n, f in FIELDS.items() if f.column)
#: what the loader adds to each spec: the environment (from the backend) and the preset
DERIVED_KEYS = ("env", "preset")


def compare_keys(*roles: str) -> tuple[str, ...]:
    """The fields of the given comparison roles, in the order differences are named."""
    order = {n: i for i, n in enumerate(FIELDS)}
    named = [n for n, f in FIELDS.items() if f.role in roles]
    return tuple(sorted(named, key=lambda n: (FIELDS[n].compare_pos is None,
                                              FIELDS[n].compare_pos or 0, order[n])))  # fmt: skip


def trajectory_keys() -> tuple[str, ...]:
    """Fields that must be equal for two runs to train the same trajectory step by step."""
    return tuple(n for n, f in FIELDS.items() if f.changes_trajectory)


def reference_values() -> dict[str, Any]:
    """What the plain fp32 eager reference run has, knob by knob (optimizations off)."""
    return {n: f.reference for n, f in FIELDS.items() if f.reference is not UNSET}


def missing_values() -> dict[str, Any]:
    """What a run recorded without the field had (fields that declare it)."""
    return {n: f.missing for n, f in FIELDS.items() if f.missing is not None}


def labels() -> dict[str, str]:
    """The report's label of every field that has one."""
    return {n: f.label for n, f in FIELDS.items() if f.label}


def id_reference(name: str, spec: dict, defaults: dict) -> Any:
    """The value at which a derived id leaves the field out."""
    field = FIELDS[name]
    return field.id_reference(spec, defaults) if field.id_reference else field.default
