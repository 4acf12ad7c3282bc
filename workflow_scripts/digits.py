"""Export scikit-learn's bundled digits (a real, learnable data set that ships inside a
PyPI package) for the accuracy experiments (``data: digits``).

1797 grey 8x8 images of the digits 0-9 (pixel values 0-16), from the UCI
"optical recognition of handwritten digits" set, as ``sklearn.datasets.load_digits``
reads them from the package itself (no download). Split once, stratified, with a
fixed seed, into a training and a held-out test part, so every trial of every
layout trains on the same samples and is scored on the same ones. Runs in the
workflow's own environment (where scikit-learn is); the training environments only
read the exported ``digits.npz`` (``workflow_scripts.rank.data``).

    python -m workflow_scripts.digits --out resources/digits
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from .commands import Arg, Command, announce
from .util import write_json_atomic

TEST_FRACTION = 0.2
SPLIT_SEED = 0
FILE = "digits.npz"
#: the training part: 1797 images less the 360 (20%, rounded up) held out
TRAIN_IMAGES = 1437


def export(out: str | Path, test_fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED) -> dict:
    """Write ``<out>/digits.npz`` (x_train, y_train, x_test, y_test; uint8 8x8 images)
    and ``<out>/SOURCE.json`` (where it came from, the split, the file's SHA-256)."""
    import numpy as np
    import sklearn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # 0..16
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    if test_fraction == TEST_FRACTION and len(x_train) != TRAIN_IMAGES:
        raise RuntimeError(f"digits: {len(x_train)} training images, expected {TRAIN_IMAGES}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{FILE}.tmp.npz"
    np.savez(tmp, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    tmp.replace(out / FILE)
    source = {
        "source": f"scikit-learn {sklearn.__version__} sklearn.datasets.load_digits",
        "images": int(len(images)),
        "classes": int(len(set(labels.tolist()))),
        "pixels": list(images.shape[1:]),
        "train": int(len(x_train)),
        "test": int(len(x_test)),
        "test_fraction": test_fraction,
        "split_seed": seed,
        "stratified": True,
        "sha256": hashlib.sha256((out / FILE).read_bytes()).hexdigest(),
    }
    write_json_atomic(out / "SOURCE.json", source)
    return source


#: The digits rule's entry point.
COMMAND = Command(
    __doc__.split("\n\n")[0],
    (
        Arg("out", lambda job: job.output[0], type=Path),
        Arg("log", "log", type=Path, default=None, help="also append the result line here"),
    ),
)


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    s = export(args.out)
    announce(
        f"digits {args.out / FILE}: {s['train']} training and {s['test']} test images "
        f"({s['source']})",
        args.log,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
