"""Data sources: one in-memory batch, per-sample synthetic tensors, a PIL image folder,
and scikit-learn's digits (exported by ``workflow_scripts.digits``) with a held-out split;
for the text models, the synthetic sources as token ids (a causal LM's labels are its
next tokens), and a generated text-classification task with a held-out split
(``keywords``)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from .. import workloads
from . import tempdirs


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
    ids, drawn from a generator seeded by its index, its real length (``seq_len``, or a
    draw of ``padding: dynamic``'s distribution) and its index (the classifier's label
    is ``index % classes``)."""

    def __init__(self, w: workloads.Workload, seq_len: int, seed: int, dynamic: bool,
                 length: int = 1_000_000):  # fmt: skip
        self.w, self.seq_len, self.seed, self.dynamic = w, seq_len, seed, dynamic
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        seed = self.seed * 1_000_003 + index
        gen = torch.Generator().manual_seed(seed)
        x = torch.randint(TOKEN_LOW, vocab_size(self.w), (self.seq_len,), generator=gen)
        n = workloads.sample_lengths(self.seq_len, 1, seed)[0] if self.dynamic else self.seq_len
        return x, n, index


#: token ids the synthetic sources draw from (BERT's special and unused ids below)
TOKEN_LOW = 0
#: the id a padded position holds (BERT's [PAD]; GPT-2 has none, its mask hides them)
PAD_ID = 0


def vocab_size(w: workloads.Workload) -> int:
    return int(w.hf_config["vocab_size"])


def text_batch(w: workloads.Workload, ids, lengths, classes) -> tuple[dict, torch.Tensor]:
    """A text batch as a Hugging Face model takes it: token ids padded to the batch's
    longest sample and their attention mask (zero on the pads), and its labels: a
    causal LM's are its token ids (the model shifts them; -100 on the pads, which the
    loss ignores), a classifier's ``classes`` modulo its number of classes."""
    lengths = torch.as_tensor(lengths)
    longest = int(lengths.max())
    mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
    ids = ids[:, :longest].masked_fill(mask == 0, PAD_ID)
    if w.task == "causal-lm":
        labels = ids.masked_fill(mask == 0, -100)
    else:
        labels = torch.as_tensor(classes) % w.num_classes
    return {"input_ids": ids, "attention_mask": mask}, labels


class TextCollate:
    """The DataLoader's collate of (token ids, real length, class) samples into one
    padded text batch (a class, so that worker processes can take it)."""

    def __init__(self, w: workloads.Workload):
        self.w = w

    def __call__(self, samples):
        ids, lengths, classes = zip(*samples, strict=True)
        return text_batch(self.w, torch.stack(ids), lengths, classes)


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
    datasets of (token ids, length, label): background tokens holding one keyword of
    every class at distinct random positions, the label the class whose keyword comes
    first."""
    from torch.utils.data import TensorDataset

    k, classes = workloads.KEYWORDS_PER_CLASS, w.num_classes
    first = workloads.KEYWORDS_FIRST_TOKEN
    background = workloads.KEYWORDS_BACKGROUND
    gen = torch.Generator().manual_seed(workloads.KEYWORDS_SEED)
    # the keywords (k per class) above the background tokens
    keywords = torch.randperm(vocab_size(w) - first - background, generator=gen)[: classes * k]
    keywords = keywords + first + background

    def split(n: int) -> TensorDataset:
        x = torch.randint(first, first + background, (n, seq_len), generator=gen)
        where = torch.argsort(torch.rand(n, seq_len, generator=gen), dim=1)[:, :classes]
        which = torch.randint(0, k, (n, classes), generator=gen) + torch.arange(classes) * k
        x.scatter_(1, where, keywords[which])  # class c's keyword at position where[:, c]
        y = where.argmin(dim=1)  # the class whose keyword comes first
        return TensorDataset(x, torch.full((n,), seq_len), y)

    return split(workloads.KEYWORDS_TRAIN), split(workloads.KEYWORDS_TEST)


def held_out(spec: dict, data_path: str | None) -> DataLoader:
    """The held-out test split of the spec's data (digits or keywords), in batches."""
    if spec["data"] == "keywords":
        w = workloads.get(spec["model"])
        dataset = keyword_task(w, spec["seq_len"])[1]
        return DataLoader(dataset, batch_size=EVAL_BATCH, collate_fn=TextCollate(w))
    if spec["data"] == "digits":
        if not data_path:
            raise ValueError("data digits needs the exported digits folder")
        return DataLoader(digits_datasets(data_path, spec["image_size"])[1], batch_size=EVAL_BATCH)
    raise ValueError(f"data {spec['data']!r} has no held-out split")


#: samples per batch when a held-out split is scored
EVAL_BATCH = 256
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
    ``steps_per_epoch`` is None for the synthetic data (no epochs), which cycles through
    ``cycle``: one in-memory batch, or one per step with dynamic padding."""

    def __init__(self, loader: DataLoader | None, sampler=None, cycle=None):
        self.loader, self.sampler, self.cycle = loader, sampler, cycle
        self.steps_per_epoch = len(loader) if loader is not None else None
        self._it = itertools.cycle(cycle) if loader is None else self._cycle()

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


def synthetic_batch(spec: dict, bs: int, gen: torch.Generator, seed: int = 0) -> tuple:
    """One in-memory batch of ``bs`` samples: images and labels below 10, or a text
    batch (``seed``: which draw of dynamic padding's lengths)."""
    w = workloads.get(spec["model"])
    if w.text:
        seq_len = spec["seq_len"]
        ids = torch.randint(TOKEN_LOW, vocab_size(w), (bs, seq_len), generator=gen)
        dynamic = spec.get("padding") == "dynamic"
        lengths = workloads.sample_lengths(seq_len, bs, seed) if dynamic else [seq_len] * bs
        return text_batch(w, ids, lengths, torch.randint(0, w.num_classes, (bs,), generator=gen))
    size = spec["image_size"]
    x = torch.randn(bs, 3, size, size, generator=gen)
    return x, torch.randint(0, min(10, w.num_classes), (bs,), generator=gen)


#: with dynamic padding, the synthetic source cycles through this many batches at most
DYNAMIC_BATCHES = 64


def synthetic_cycle(spec: dict, bs: int, gen: torch.Generator, rank: int) -> list:
    """The in-memory batches of ``data: synthetic``: one, reused every step; with dynamic
    padding, one per step (each its own draw of lengths) up to DYNAMIC_BATCHES."""
    if spec.get("padding") != "dynamic":
        return [synthetic_batch(spec, bs, gen)]
    n = min(DYNAMIC_BATCHES, spec["warmup_steps"] + spec["steps"])
    return [
        synthetic_batch(spec, bs, gen, (spec["seed"] * 1000 + rank) * 1000 + i) for i in range(n)
    ]


def batches(spec: dict, data_path: str | None, rank: int = 0, world: int = 1) -> Batches:
    """The batches of the spec's data; for rank ``rank`` of ``world`` data-parallel
    ranks, its share of each global batch (its own samples). ``data_path``: the
    generated image folder, or the exported digits folder."""
    bs, size = spec["batch_size"] // world, spec["image_size"]
    gen = torch.Generator().manual_seed(spec["seed"] + rank)
    w = workloads.get(spec["model"])
    if spec["data"] == "synthetic":
        return Batches(None, cycle=synthetic_cycle(spec, bs, gen, rank))
    if spec["data"] == "per_sample" and w.text:
        dynamic = spec.get("padding") == "dynamic"
        dataset: Dataset = SyntheticTokens(w, spec["seq_len"], spec["seed"], dynamic)
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
        collate_fn=TextCollate(w) if w.text else None,
    )
    if len(loader) == 0:
        raise ValueError(f"dataset of {len(dataset)} samples is smaller than one batch of {bs}")
    if spec["num_workers"] > 0:
        tempdirs.on_exit(functools.partial(end_workers, loader))
    return Batches(loader, sampler)


def end_workers(loader: DataLoader) -> None:
    """End a DataLoader's persistent workers as it would at a normal exit (each then
    removes its own temporary folder: rank/tempdirs.py)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
