"""Models the study trains: torchvision ResNets and a small CIFAR-style CNN."""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("resnet50", "resnet18", "cnn")


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


def build(name: str, num_classes: int) -> nn.Module:
    if name == "cnn":
        return SmallCNN(num_classes=num_classes)
    if name in ("resnet50", "resnet18"):
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")


def num_classes(model: str) -> int:
    # torchvision's ResNets keep their 1000-way head, as in the article (labels are index % 10).
    return 10 if model == "cnn" else 1000
