"""Data sources: one in-memory batch, per-sample synthetic tensors, a PIL image folder,
and scikit-learn's digits (exported by ``workflow_scripts.digits``) with a held-out split;
for the text models, the synthetic sources as token ids (a causal LM's labels are its
next tokens), and a generated text-classification task with a held-out split
(``keywords``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from .. import workloads


class SyntheticPerSample(Dataset):
    """The article's dataset: each sample is torch.randn(3, H, W), label index % 10."""

    def __init__(self, image_size: int, length: int = 1_000_000):
        self.image_size = image_size
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return torch.randn(3, self.image_size, self.image_size), index % 10


class SyntheticTokens(Dataset):
    """The per-sample source of a text model: each sample is ``seq_len`` random token
    ids, drawn from a generator seeded by its index; its label the sequence
    classification's ``index % classes``, or a causal LM's next tokens."""

    def __init__(self, w: workloads.Workload, seq_len: int, seed: int, length: int = 1_000_000):
        self.w, self.seq_len, self.seed, self.length = w, seq_len, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randint(0, vocab_size(self.w), (self.seq_len,), generator=gen)
        return x, text_labels(self.w, x.unsqueeze(0), torch.tensor([index]))[0]


def vocab_size(w: workloads.Workload) -> int:
    return int(w.hf_config["vocab_size"])


def text_labels(w: workloads.Workload, x: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """The labels of token batch ``x``: a causal LM's next token at each position (the
    last position has none: -100, which the loss ignores); a classifier's ``classes``
    modulo its number of classes."""
    if w.task == "causal-lm":
        return torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)
    return classes % w.num_classes


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


def keyword_task(w: workloads.Workload, seq_len: int) -> tuple[Dataset, Dataset]:
    """``data: keywords`` (see ``workloads.KEYWORDS_*``) as (training, held-out test)
    tensors: token ids with keywords of the label's class at random positions."""
    from torch.utils.data import TensorDataset

    k, per_seq = workloads.KEYWORDS_PER_CLASS, workloads.KEYWORDS_PER_SEQUENCE
    first, vocab = workloads.KEYWORDS_FIRST_TOKEN, vocab_size(w)
    gen = torch.Generator().manual_seed(workloads.KEYWORDS_SEED)
    keywords = torch.randperm(vocab - first, generator=gen)[: w.num_classes * k] + first

    def split(n: int) -> TensorDataset:
        x = torch.randint(first, vocab, (n, seq_len), generator=gen)
        y = torch.randint(0, w.num_classes, (n,), generator=gen)
        where = torch.argsort(torch.rand(n, seq_len, generator=gen), dim=1)[:, :per_seq]
        which = torch.randint(0, k, (n, per_seq), generator=gen) + y[:, None] * k
        x.scatter_(1, where, keywords[which])
        return TensorDataset(x, y)

    return split(workloads.KEYWORDS_TRAIN), split(workloads.KEYWORDS_TEST)


def held_out(spec: dict, data_path: str | None) -> Dataset:
    """The held-out test split of the spec's data (digits or keywords)."""
    if spec["data"] == "keywords":
        return keyword_task(workloads.get(spec["model"]), spec["seq_len"])[1]
    if spec["data"] == "digits":
        if not data_path:
            raise ValueError("data digits needs the exported digits folder")
        return digits_datasets(data_path, spec["image_size"])[1]
    raise ValueError(f"data {spec['data']!r} has no held-out split")


DIGITS_FILE = "digits.npz"  # in the folder workflow_scripts.digits exports to


def digits_datasets(root: str | Path, image_size: int) -> tuple[Dataset, Dataset]:
    """scikit-learn's digits as (training, held-out test) tensors: the 8x8 grey images
    scaled to [-1, 1], upscaled (bilinear) to ``image_size`` and repeated over 3
    channels, so the study's models take them unchanged."""
    import numpy as np
    from torch.nn import functional as F
    from torch.utils.data import TensorDataset

    path = Path(root) / DIGITS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (made by the workflow's digits rule)")
    with np.load(path) as npz:
        parts = {k: npz[k] for k in ("x_train", "y_train", "x_test", "y_test")}

    def tensors(x, y):
        x = torch.from_numpy(x).float().unsqueeze(1) / 8.0 - 1.0  # 0..16 -> -1..1
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        return TensorDataset(x.expand(-1, 3, -1, -1).contiguous(), torch.from_numpy(y).long())

    return tensors(parts["x_train"], parts["y_train"]), tensors(parts["x_test"], parts["y_test"])


class Batches:
    """An endless iterator of (inputs, labels) batches, epoch after epoch;
    ``steps_per_epoch`` is None for the synthetic data (no epochs)."""

    def __init__(self, loader: DataLoader | None, sampler=None, batch=None):
        self.loader, self.sampler, self.batch = loader, sampler, batch
        self.steps_per_epoch = len(loader) if loader is not None else None
        self._it = itertools.repeat(batch) if loader is None else self._cycle()

    def _cycle(self):
        epoch = 0
        while True:
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            yield from self.loader
            epoch += 1

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)


def shuffled(spec: dict) -> bool:
    return spec["data"] in ("image_folder", "digits", "keywords")


def synthetic_batch(spec: dict, bs: int, gen: torch.Generator) -> tuple:
    """The one in-memory batch of ``bs`` samples: images and labels below 10, or token
    ids and their labels."""
    w = workloads.get(spec["model"])
    if w.text:
        x = torch.randint(0, vocab_size(w), (bs, spec["seq_len"]), generator=gen)
        return x, text_labels(w, x, torch.randint(0, w.num_classes, (bs,), generator=gen))
    size = spec["image_size"]
    x = torch.randn(bs, 3, size, size, generator=gen)
    return x, torch.randint(0, min(10, w.num_classes), (bs,), generator=gen)


def batches(spec: dict, data_path: str | None, rank: int = 0, world: int = 1) -> Batches:
    """The batches of the spec's data; for rank ``rank`` of ``world`` data-parallel
    ranks, its share of each global batch (its own samples). ``data_path``: the
    generated image folder, or the exported digits folder."""
    bs, size = spec["batch_size"] // world, spec["image_size"]
    gen = torch.Generator().manual_seed(spec["seed"] + rank)
    w = workloads.get(spec["model"])
    if spec["data"] == "synthetic":
        return Batches(None, batch=synthetic_batch(spec, bs, gen))
    if spec["data"] == "per_sample" and w.text:
        dataset: Dataset = SyntheticTokens(w, spec["seq_len"], spec["seed"])
    elif spec["data"] == "per_sample":
        dataset = SyntheticPerSample(size)
    elif spec["data"] == "image_folder":
        root = spec.get("data_dir") or data_path
        if not root:
            raise ValueError("data image_folder needs data_dir or a generated image folder")
        dataset = image_folder_dataset(root, size)
    elif spec["data"] == "digits":
        if not data_path:
            raise ValueError("data digits needs the exported digits folder")
        dataset = digits_datasets(data_path, size)[0]
    elif spec["data"] == "keywords":
        dataset = keyword_task(w, spec["seq_len"])[0]
    else:
        raise ValueError(f"unknown data source {spec['data']!r}")
    sampler = None
    if world > 1 or shuffled(spec):
        from torch.utils.data.distributed import DistributedSampler

        # The same shuffle on every rank (seed, epoch), each rank its own part of it:
        # rank r takes every world-th index from r, so global batch k is the slice
        # [k*B, (k+1)*B) of the epoch's permutation, whatever the world. One process
        # draws from the same sampler (a world of one), so 1 process and N ranks train
        # on the same global batches.
        sampler = DistributedSampler(
            dataset, num_replicas=world, rank=rank,
            shuffle=shuffled(spec), seed=spec["seed"], drop_last=True,
        )  # fmt: skip
    loader = DataLoader(
        dataset,
        batch_size=bs,
        sampler=sampler,
        shuffle=False,  # the sampler shuffles
        num_workers=spec["num_workers"],
        drop_last=True,
        generator=gen,
        persistent_workers=spec["num_workers"] > 0,
    )
    if len(loader) == 0:
        raise ValueError(f"dataset of {len(dataset)} samples is smaller than one batch of {bs}")
    return Batches(loader, sampler)
