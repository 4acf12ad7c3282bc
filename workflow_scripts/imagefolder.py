"""Generate a small, learnable image folder (<root>/<class>/<image>.jpg) with PIL."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from .commands import Arg, Command, announce


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


#: The image_folder rule's entry point.
COMMAND = Command(
    __doc__,
    (
        Arg("out", lambda job: job.output[0], type=Path),
        Arg("classes", "params.classes", type=int, default=10),
        Arg("per_class", "params.per_class", type=int, default=32),
        Arg("size", "params.size", type=int, default=256),
        Arg("seed", type=int, default=0),
        Arg("log", "log", type=Path, default=None, help="also append the result line here"),
    ),
)


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    make_image_folder(args.out, args.classes, args.per_class, args.size, args.seed)
    n = sum(1 for _ in args.out.rglob("*.jpg"))
    line = f"image folder {args.out}: {args.classes} classes, {n} images of {args.size}px"
    announce(line, args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
