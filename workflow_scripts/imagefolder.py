"""Generate a small, learnable image folder (<root>/<class>/<image>.jpg) with PIL."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from .cli import announce


def make_image_folder(root: str | Path, classes: int, per_class: int, size: int, seed: int = 0):
    """Each class gets its own background colour; rectangles of random colour add noise."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    root = Path(root)
    for c in range(classes):
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        base = (
            40 + 200 * c // max(1, classes - 1),
            240 - 200 * c // max(1, classes - 1),
            (80 * c) % 256,
        )
        for i in range(per_class):
            img = Image.new("RGB", (size, size), base)
            draw = ImageDraw.Draw(img)
            for _ in range(8):
                x0, y0 = rng.randrange(size), rng.randrange(size)
                x1 = x0 + rng.randrange(4, max(5, size // 2))
                y1 = y0 + rng.randrange(4, max(5, size // 2))
                colour = tuple(rng.randrange(256) for _ in range(3))
                draw.rectangle((x0, y0, x1, y1), outline=colour, width=2)
            img.save(d / f"img{i:04d}.jpg", quality=90)
    return root


def rule_argv(inputs, output, params, wildcards, log, settings: dict) -> list[str]:
    """The image_folder rule's command line (workflow_scripts.jobs)."""
    return [f"--out={output[0]}", f"--classes={params.classes}",
            f"--per-class={params.per_class}", f"--size={params.size}",
            f"--log={log[0]}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=32)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", type=Path, default=None, help="also append the result line here")
    args = ap.parse_args(argv)
    make_image_folder(args.out, args.classes, args.per_class, args.size, args.seed)
    n = sum(1 for _ in args.out.rglob("*.jpg"))
    line = f"image folder {args.out}: {args.classes} classes, {n} images of {args.size}px"
    announce(line, args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
