"""Intel Extension for PyTorch 2.8 (its last release, on torch 2.8): ``ipex.optimize``
and ``torch.compile(backend="ipex")``."""

from .base import Backend


class Ipex(Backend):
    name = "ipex"
    env = "ipex"
    image = "ipex"
    image_lock = "ipex"
    compile_options = ("ipex",)
    owns = {"ipex_optimize": False}
    imports = ("intel_extension_for_pytorch",)
    versions = {"intel_extension_for_pytorch": "ipex"}
    order = 2

    def weights_dtype(self, spec: dict) -> str:
        """``ipex.optimize(dtype=torch.bfloat16)`` (ours, or Accelerate 1.7.0's through its
        ipex_config) holds the weights in bf16 (their fp32 master copy is the
        optimizer's): its gradients are those of a bf16 model, not of bf16 autocast's."""
        optimized = spec.get("ipex_optimize") or spec.get("accelerate_ipex")
        return "bf16" if optimized and spec["precision"] == "bf16" else "fp32"

    def prepare(self, model, optimizer, spec: dict):
        if not spec["ipex_optimize"]:
            return model, optimizer
        import intel_extension_for_pytorch as ipex
        import torch

        dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
        if optimizer is None:  # inference: the model alone (in eval mode)
            return ipex.optimize(model, dtype=dtype), None
        return ipex.optimize(model, optimizer=optimizer, dtype=dtype)


BACKEND = Ipex()
