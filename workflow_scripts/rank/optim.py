"""The optimizer and learning-rate schedule of a training run, as its spec resolves them
(the model family's defaults: ``workloads.TRAINING_DEFAULTS``)."""

from __future__ import annotations

from .. import workloads

#: ``optimizer_impl``: torch's keyword arguments for each implementation
IMPLEMENTATIONS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def build(params, spec: dict):
    """torch's SGD (momentum 0.9) or AdamW (its defaults: betas (0.9, 0.999), eps 1e-8,
    weight decay 0.01) at the spec's learning rate and implementation."""
    import torch

    cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[spec["optimizer"]]
    args = {
        **workloads.OPTIMIZER_ARGS[spec["optimizer"]],
        **IMPLEMENTATIONS[spec["optimizer_impl"]],
    }
    return cls(params, lr=spec["lr"], **args)


def scheduler(optimizer, spec: dict, total_steps: int):
    """``lr_schedule: linear``: Hugging Face's linear schedule with warm-up (what
    Accelerate's nlp_example steps after every optimizer step) over the run's
    ``total_steps``; None for a constant rate."""
    if spec["lr_schedule"] != "linear":
        return None
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, spec["lr_warmup_steps"], total_steps)


def describe(optimizer) -> dict:
    """What steps the parameters: the optimizer's class, the implementation torch was
    asked for, and the function its ``step`` is (IPEX's ``ipex.optimize`` replaces it
    with a fused kernel of its own for the optimizers it knows)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer
    group = inner.param_groups[0] if inner.param_groups else {}
    step = getattr(inner.step, "__func__", inner.step)
    return {
        "class": type(inner).__name__,
        "foreach": group.get("foreach"),
        "fused": group.get("fused"),
        "step": f"{getattr(step, '__module__', '?')}.{getattr(step, '__qualname__', '?')}",
        "ipex_fused_step": bool(getattr(inner, "fused", False))
        and "intel_extension_for_pytorch" in str(getattr(step, "__module__", "")),
        "parameters": sum(len(g["params"]) for g in inner.param_groups),
    }
