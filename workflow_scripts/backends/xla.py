"""PyTorch/XLA 2.9 (its last release, on torch 2.9) on the CPU (``PJRT_DEVICE=CPU``)."""

from ..util import show
from .base import Backend


class Xla(Backend):
    name = "xla"
    env = "xla"
    image = "xla"
    image_lock = "xla"
    imports = ("torch_xla",)
    versions = {"torch_xla": "torch_xla"}
    env_vars = {"PJRT_DEVICE": "CPU"}
    estimate_speed = 0.5
    estimate_trace_s = 10.0
    order = 3
    ddp = False  # its tensors live on the XLA device: no DDP over CPU process groups
    flops_after_setup = True  # torch_xla.device() before the first backward in a process

    def check(self, spec: dict) -> list[str]:
        problems = []
        if spec["compile"] != "none" and spec["compile"] != "ipex":  # ipex: its own message
            problems.append(f"backend 'xla' needs compile 'none' (got compile {spec['compile']!r})")
        if spec["precision"] != "fp32":
            problems.append(
                f"backend 'xla' needs precision 'fp32' (got precision {spec['precision']!r})"
            )
        if spec["optimizer_impl"] != "default":
            problems.append(
                f"backend 'xla' needs optimizer_impl 'default' (got {spec['optimizer_impl']!r}: "
                "torch's foreach and fused optimizer kernels are CPU and CUDA kernels; on XLA "
                "the step is traced into the graph)"
            )
        if spec["channels_last"]:
            problems.append(
                f"backend 'xla' needs channels_last false (got {show(spec['channels_last'])})"
            )
        return problems

    def setup(self, spec: dict) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        # torch_xla.device() must come before the first backward in the process, or CPU
        # autograd trips an internal assert.
        self._device = torch_xla.device()
        self._xm = xm
        self._torch_xla = torch_xla

    def device(self):
        return self._device

    def to_device(self, x, y):
        if isinstance(x, dict):  # a text batch: token ids and attention mask
            return {k: v.to(self._device) for k, v in x.items()}, y.to(self._device)
        return x.to(self._device), y.to(self._device)

    def sync(self) -> None:
        self._torch_xla.sync()
        self._xm.wait_device_ops()

    def loss_value(self, loss) -> float:
        return float(loss.float().cpu().item())


BACKEND = Xla()
