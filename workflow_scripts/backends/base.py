"""What a backend is: its environment and image, its knobs, and how it trains.

A backend module (``backends/<name>.py``) defines ``BACKEND``, an instance of a
:class:`Backend` subclass. The class attributes say where the backend runs and
which knobs it owns; the methods are called in two places:

- in the workflow's environment, by the study loader (:meth:`check`), the image
  and environment rules and the report (the attributes only);
- inside the backend's own environment, by the harness: :meth:`setup` once,
  :meth:`prepare` on the model and optimizer, :meth:`to_device` and :meth:`sync`
  around every step.

This module and every backend module import only the standard library at import
time (torch and the backend's libraries inside the methods), because the
workflow's environment has no torch.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

#: the variable that gives a compiled run in a container the folder (the host's, mounted
#: at its own path: trial/environment.py) of the machine's precompiled headers
HEADERS_VAR = "STUDY_INDUCTOR_HEADERS"


def share_precompiled_headers() -> None:
    """Link where TorchInductor keeps this process's precompiled headers (its default
    cache folder's ``precompiled_headers``, wherever ``TORCHINDUCTOR_CACHE_DIR`` points)
    to the folder that ``STUDY_INDUCTOR_HEADERS`` names: a container run's, the host's,
    shared by the image's later runs. Where the variable is unset or the link cannot be
    made, the run compiles its own, as before."""
    shared = os.environ.get(HEADERS_VAR)
    if not shared or not os.path.isdir(shared):
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    link = os.path.join(default_cache_dir(), "precompiled_headers")
    # (FileExistsError: another rank of the run linked it, or the folder was there)
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(shared, link)


class Backend:
    #: the value of the ``backend`` field
    name: str = ""
    #: the Python environment it runs in: ``envs/<env>.txt`` (backends may share one)
    env: str = ""
    #: its container image (``containers/<image>/Containerfile``), built FROM ``image_parent``
    image: str = ""
    image_parent: str = "common"
    #: the lock the image installs (None: its parent's environment, as inductor on eager)
    image_lock: str | None = None
    #: ``compile`` when the experiment leaves it unset
    default_compile: str = "none"
    #: further ``compile`` values that only this backend can run (e.g. ``ipex``)
    compile_options: tuple[str, ...] = ()
    #: knobs only this backend acts on, with their neutral value (any other value of
    #: the knob needs this backend)
    owns: dict[str, Any] = {}
    #: modules a trial imports at setup (the calibration imports them too)
    imports: tuple[str, ...] = ()
    #: distribution modules whose versions the records report: module -> key
    versions: dict[str, str] = {}
    #: environment variables every run of the backend gets
    env_vars: dict[str, str] = {}
    #: position in the report's backend comparison
    order: int = 100
    #: trains a DistributedDataParallel model on CPU tensors (torchrun's ranks)
    ddp: bool = True
    #: the harness counts the FLOPs after ``setup`` (a backend whose device must be
    #: claimed before any backward in the process, as torch_xla's); otherwise before it,
    #: so that no backend library's kernels are out of the counter's sight (importing
    #: IPEX hides a transformer's backward matmuls from ``FlopCounterMode``)
    flops_after_setup: bool = False
    #: how the backend serves a model in INT8 (``precision: int8``, mode inference), in
    #: the record's words; None: it has no INT8 path
    int8: str | None = None
    #: the study's estimate: its throughput relative to eager's at the same settings
    #: (torch-xla on the CPU ran ResNet-50 at half the eager rate), and the seconds it
    #: spends tracing and compiling its graph in the first steps, compiled or not
    estimate_speed: float = 1.0
    estimate_trace_s: float = 0.0
    #: whether its INT8 calibration is kept for, and read by, the later trials (serve's
    #: ``scales``)
    keeps_int8_calibration: bool = False

    # ------------------------------------------------------------------ plan time

    def check(self, spec: dict) -> list[str]:
        """Combination problems of a resolved spec with this backend, as sentences."""
        return []

    # ------------------------------------------------------------------ in the run

    def setup(self, spec: dict) -> None:
        """Import what the backend needs; called once before the model is built."""
        for module in self.imports:
            __import__(module)

    def device(self):
        import torch

        return torch.device("cpu")

    def prepare(self, model, optimizer, spec: dict):
        """The backend's own optimization of model and optimizer (before any compile);
        ``optimizer`` is None in inference mode."""
        return model, optimizer

    def serve(self, model, spec: dict, example: tuple, calibration: list[tuple], scales=None):
        """Inference: the prepared model (inputs in, logits out, eval mode) as the backend
        serves it (an INT8 model calibrated on ``calibration``, or from the calibration
        ``scales`` carries where the backend can read one: ``rank.inference.Int8Scales``;
        a traced graph built from ``example``), before any ``torch.compile``. Here: the
        model as it is."""
        return model

    def onednn_verbose(self) -> list:
        """Context managers that make every oneDNN library in the process print what it
        runs (torch's own here)."""
        import torch

        return [torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON)]

    def compile(self, model, spec: dict):
        """``torch.compile`` as the spec asks (``compile`` none: the model as it is);
        ``compile_freezing``: inductor's freezing (the weights folded in as constants)."""
        import torch

        if spec["compile"] == "none":
            return model
        share_precompiled_headers()
        if spec["compile"] == "inductor":
            if spec.get("compile_freezing"):
                import torch._inductor.config as inductor_config

                inductor_config.freezing = True
            mode = None if spec["compile_mode"] == "default" else spec["compile_mode"]
            return torch.compile(model, backend="inductor", mode=mode)
        return torch.compile(model, backend=spec["compile"])

    def weights_dtype(self, spec: dict) -> str:
        """The dtype the run's step holds the model's weights in: ``fp32`` (bf16 autocast
        keeps fp32 weights), or ``bf16`` where the backend casts them (the gradient
        check's own-precision reference then holds them in bf16 too)."""
        return "fp32"

    def to_device(self, x, y):
        return x, y

    def sync(self) -> None:
        """Wait until the step's work is done (eager CPU work is done on return)."""

    def loss_value(self, loss) -> float:
        return float(loss.float().item())
