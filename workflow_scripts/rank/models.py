"""Models the study trains, built from their declaration (``workflow_scripts.workloads``):
torchvision ResNets, a small CIFAR-style CNN, and Hugging Face transformers built from
their configuration with random initial weights."""

from __future__ import annotations

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


class TextModel(nn.Module):
    """A transformers model whose forward takes the token ids and returns the logits
    (the loss is the harness's, as for the vision models)."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids).logits


def build_text(w: workloads.Workload, attention: str = "sdpa") -> nn.Module:
    """The transformers model of ``w`` with random weights (torch's global RNG).
    ``attention``: transformers' implementation; ``sdpa`` (its default, what a user
    trains with) or ``eager`` (plain matmuls, which ``FlopCounterMode`` counts)."""
    import transformers

    cls = getattr(transformers, w.hf_class)
    config = cls.config_class(**w.hf_config, use_cache=False, attn_implementation=attention)
    return TextModel(cls(config))


def build(name: str, attention: str = "sdpa") -> nn.Module:
    w = workloads.get(name)
    if w.text:
        return build_text(w, attention)
    if name == "cnn":
        return SmallCNN(num_classes=w.num_classes)
    import torchvision

    return getattr(torchvision.models, name)(weights=None, num_classes=w.num_classes)
