"""Data sources: one in-memory batch, per-sample synthetic tensors, a PIL image folder."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


class SyntheticPerSample(Dataset):
    """The article's dataset: each sample is torch.randn(3, H, W), label index % 10."""

    def __init__(self, image_size: int, length: int = 1_000_000):
        self.image_size = image_size
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return torch.randn(3, self.image_size, self.image_size), index % 10


def image_folder_dataset(root: str | Path, image_size: int) -> Dataset:
    """torchvision's ImageFolder (PIL decoding) with the usual ImageNet training transforms."""
    from torchvision import datasets, transforms

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        ]
    )
    return datasets.ImageFolder(str(root), transform=transform)


def batches(spec: dict, image_folder: str | None, num_classes: int, rank: int = 0, world: int = 1):
    """An endless iterator of (inputs, labels) batches for the spec; for rank ``rank`` of
    ``world`` data-parallel ranks, its share of each global batch (its own samples)."""
    bs, size = spec["batch_size"] // world, spec["image_size"]
    gen = torch.Generator().manual_seed(spec["seed"] + rank)
    if spec["data"] == "synthetic":
        x = torch.randn(bs, 3, size, size, generator=gen)
        y = torch.randint(0, min(10, num_classes), (bs,), generator=gen)
        return itertools.repeat((x, y))
    if spec["data"] == "per_sample":
        dataset: Dataset = SyntheticPerSample(size)
    elif spec["data"] == "image_folder":
        root = spec.get("data_dir") or image_folder
        if not root:
            raise ValueError("data image_folder needs data_dir or a generated image folder")
        dataset = image_folder_dataset(root, size)
    else:
        raise ValueError(f"unknown data source {spec['data']!r}")
    sampler = None
    if world > 1:
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(
            dataset, num_replicas=world, rank=rank,
            shuffle=spec["data"] == "image_folder", seed=spec["seed"], drop_last=True,
        )  # fmt: skip
    loader = DataLoader(
        dataset,
        batch_size=bs,
        sampler=sampler,
        shuffle=spec["data"] == "image_folder" and sampler is None,
        num_workers=spec["num_workers"],
        drop_last=True,
        generator=gen,
        persistent_workers=spec["num_workers"] > 0,
    )
    if len(loader) == 0:
        raise ValueError(f"dataset of {len(dataset)} samples is smaller than one batch of {bs}")
    return _cycle(loader, sampler)


def _cycle(loader: DataLoader, sampler=None):
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        yield from loader
        epoch += 1
