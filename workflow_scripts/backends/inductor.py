"""torch.compile with TorchInductor (the current release): C++ kernels built at run time,
so its image adds the compiler to the eager image."""

from .base import Backend


class Inductor(Backend):
    name = "inductor"
    env = "upstream"
    image = "inductor"
    image_parent = "eager"
    default_compile = "inductor"
    order = 1
    int8 = "PT2E static quantization (torchao's X86InductorQuantizer), torch.compile"

    def check(self, spec: dict) -> list[str]:
        if spec["compile"] != "inductor":
            return [
                f"backend 'inductor' means torch.compile with inductor (got compile "
                f"{spec['compile']!r}); use backend 'eager' for no compile"
            ]
        if spec["precision"] == "int8" and not spec["compile_freezing"]:
            return [
                "precision 'int8' with backend 'inductor' needs compile_freezing true "
                "(inductor folds the quantized weights in, prepacked for oneDNN's INT8 "
                "kernels, only when it freezes them)"
            ]
        return []

    def serve(self, model, spec: dict, example: tuple, calibration: list[tuple], scales=None):
        """``precision: int8``: PyTorch's own INT8 path for x86 CPUs, PT2E static
        post-training quantization as torchao's X86 Inductor tutorial runs it: the model
        exported (strict: torchvision's ResNets call one ReLU module several times, which
        the quantizer's partitions cannot hold in a non-strict export), annotated by
        ``X86InductorQuantizer``'s default config (8-bit activations per tensor, 8-bit
        weights per channel), observed on the calibration batches, converted; the
        compile (with freezing) then lowers it to oneDNN's INT8 kernels."""
        if spec["precision"] != "int8":
            return model
        import torch
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = xiq.X86InductorQuantizer()
        quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
        with torch.no_grad():
            exported = torch.export.export(model, example, strict=True).module()
            prepared = prepare_pt2e(exported, quantizer)
            for batch in calibration:
                prepared(*batch)
            return convert_pt2e(prepared)


BACKEND = Inductor()
