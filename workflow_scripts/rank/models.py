"""Models the study trains, built from their declaration (``workflow_scripts.workloads``):
torchvision ResNets, a small CIFAR-style CNN, and Hugging Face transformers built from
their configuration with random initial weights; and their forward pass with its loss,
one for every caller (the step, the gradient check's reference, the FLOP count)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from .. import workloads


class SmallCNN(nn.Module):
    """The small CNN of "Accelerate Model Training with PyTorch 2.X" (CIFAR-10 sized)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 16, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_text(w: workloads.Workload, attention: str = "sdpa", dropout: bool = False) -> nn.Module:
    """The transformers model of ``w`` with random weights (torch's global RNG), called
    as Hugging Face's examples call it: ``model(input_ids=..., attention_mask=...,
    labels=...)``, its own loss in the output. ``attention``: transformers'
    implementation; ``sdpa`` (its default, what a user trains with) or ``eager`` (plain
    matmuls, which ``FlopCounterMode`` counts). ``dropout``: the model's own (its
    config class's defaults), else every dropout off (``workloads.NO_DROPOUT``); the
    weights are the same either way (dropout has none, and draws nothing at build)."""
    import transformers

    cls = getattr(transformers, w.hf_class)
    given = workloads.with_dropout(w.hf_config) if dropout else w.hf_config
    config = cls.config_class(**given, use_cache=False, attn_implementation=attention)
    return cls(config)


def build(
    name: str, attention: str = "sdpa", dropout: bool = False, weights: Path | None = None
) -> nn.Module:
    """Model ``name`` with random initial weights from torch's CPU generator; with
    ``weights`` (the study's ``initial-weights`` folder), read from there where the same
    draw was kept, else drawn and kept (``initial_weights``): the same model either way."""
    return build_from(name, attention, dropout, weights)[0]


def build_from(
    name: str, attention: str = "sdpa", dropout: bool = False, weights: Path | None = None
) -> tuple[nn.Module, bool]:
    """:func:`build`'s model, and whether its weights were read (not drawn)."""
    from . import initial_weights

    made = functools.partial(construct, name, attention, dropout)
    return initial_weights.build(made, name, attention, weights)


def construct(name: str, attention: str = "sdpa", dropout: bool = False) -> nn.Module:
    """Model ``name``, its initial weights drawn from torch's CPU generator."""
    w = workloads.get(name)
    if w.text:
        return build_text(w, attention, dropout)
    if name == "cnn":
        return SmallCNN(num_classes=w.num_classes)
    import torchvision

    return getattr(torchvision.models, name)(weights=None, num_classes=w.num_classes)


def forward_loss(w: workloads.Workload, model: nn.Module, x, y, loss_fn=None):
    """(logits, loss) of one batch: a vision model's logits and its loss (``loss_fn``,
    the article's cross entropy by default); a transformers model called with the
    batch's token ids, attention mask and labels, as Hugging Face's examples train it
    (its own loss)."""
    if w.text:
        out = model(**x, labels=y)
        return out.logits, out.loss
    out = model(x)
    return out, (loss_fn or nn.functional.cross_entropy)(out, y)


def logits(w: workloads.Workload, model: nn.Module, x):
    """The logits of one batch (no loss)."""
    return model(**x).logits if w.text else model(x)
