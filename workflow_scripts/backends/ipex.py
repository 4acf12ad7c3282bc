"""Intel Extension for PyTorch 2.8 (its last release, on torch 2.8): ``ipex.optimize``
and ``torch.compile(backend="ipex")``."""

import os

from .base import Backend


class Ipex(Backend):
    name = "ipex"
    env = "ipex"
    image = "ipex"
    image_lock = "ipex"
    compile_options = ("ipex",)
    owns = {"ipex_optimize": False, "ipex_torchscript": False}
    keeps_int8_calibration = True
    int8 = "ipex.quantization static quantization, TorchScript (torch.jit.trace, freeze)"
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

    def check(self, spec: dict) -> list[str]:
        problems = []
        if spec["ipex_torchscript"] and spec["mode"] != "inference":
            problems.append("ipex_torchscript needs mode 'inference' (IPEX traces a served model)")
        if spec["ipex_torchscript"] and spec["compile"] != "none":
            problems.append(
                f"ipex_torchscript runs a TorchScript graph; compile {spec['compile']!r} "
                "would compile something else (use compile 'none')"
            )
        if spec["precision"] == "int8" and not spec["ipex_torchscript"]:
            problems.append(
                "precision 'int8' with backend 'ipex' needs ipex_torchscript true (IPEX runs "
                "a converted INT8 model as a traced, frozen TorchScript graph)"
            )
        if spec["precision"] == "int8" and spec["ipex_optimize"]:
            problems.append(
                "precision 'int8' with backend 'ipex' runs ipex.quantization's prepare and "
                "convert, not ipex.optimize (set ipex_optimize false)"
            )
        return problems

    def serve(self, model, spec: dict, example: tuple, calibration: list[tuple], scales=None):
        """The IPEX deck's serving recipes. ``precision: int8``: ``ipex.quantization``'s
        static post-training quantization (its ``default_static_qconfig_mapping``: 8-bit
        activations per tensor, 8-bit weights per channel), observed on the calibration
        batches (or their scales read from the first trial's qconf summary, which a
        calibration here writes for the later trials: ``scales``), converted.
        ``ipex_torchscript``: the model traced and frozen
        (``torch.jit.trace``, ``torch.jit.freeze``; under bf16 autocast for bf16), IPEX's
        graph path (its fusions run in the TorchScript graph)."""
        import intel_extension_for_pytorch as ipex
        import torch

        if spec["precision"] == "int8":
            from intel_extension_for_pytorch.quantization import convert, prepare

            qconfig = ipex.quantization.default_static_qconfig_mapping
            prepared = prepare(model, qconfig, example_inputs=example, inplace=False)
            loaded = _load_scales(prepared, scales)
            if loaded is None:  # a carried file it could not read: a clean start
                prepared = prepare(model, qconfig, example_inputs=example, inplace=False)
            if not loaded:
                with torch.no_grad():
                    for batch in calibration:
                        prepared(*batch)
                if scales is not None and scales.keep is not None:
                    tmp = scales.keep.with_name(scales.keep.name + ".tmp")
                    prepared.save_qconf_summary(qconf_summary=str(tmp))
                    os.replace(tmp, scales.keep)
                    scales.how = "calibrated, kept"
            model = convert(prepared)
        if not spec["ipex_torchscript"]:
            return model
        bf16 = spec["precision"] == "bf16"
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        with torch.no_grad(), autocast:
            traced = torch.jit.trace(model, example, check_trace=False)
            return torch.jit.freeze(traced)

    def onednn_verbose(self) -> list:
        """torch's oneDNN and IPEX's own (IPEX's kernels and its TorchScript fusions)."""
        import intel_extension_for_pytorch as ipex

        return [*super().onednn_verbose(), ipex.verbose(1)]


def _load_scales(prepared, scales) -> bool | None:
    """Read the calibration ``scales`` carries into ``prepared`` (IPEX's qconf summary):
    True; False where it carries none; None where its file could not be read (then the
    run calibrates, and ``scales.how`` says why)."""
    if scales is None or not scales.carried:
        return False
    try:
        prepared.load_qconf_summary(qconf_summary=str(scales.carried))
    except Exception as exc:  # noqa: BLE001 - then it calibrates, as trial 0 did
        scales.how = f"carried file unusable ({type(exc).__name__}: {exc}); calibrated"
        scales.carried = None
        return None
    scales.how = "carried"
    return True


BACKEND = Ipex()
