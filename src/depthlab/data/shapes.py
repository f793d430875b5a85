"""``builtin-shapes``: an image-text multiple-choice task made offline, in MMMU's format.

Each picture (:data:`IMAGE_SIZE` pixels square, white) holds 1 to 4 copies of one shape in one colour, each in its own
cell of a 3x3 grid (so they never touch), of random size and position within its cell. Each item asks one of three
questions, in turn: which shape, which colour, how many. The four options are always the same four, in alphabetical
(or numeric) order, so the answer can only come from the picture: a model that does not look at it is at chance (25 %)
because the answers are drawn uniformly.

    shapes_items(200, seed=0)     # the evaluation task (builtin-shapes): 200 items
    shapes_items(n, seed=s)       # more of them for training (another seed: other pictures)

Deterministic: the same seed gives the same pictures and questions.
"""

from __future__ import annotations

import random
from typing import Any

from depthlab.base.errors import DepthlabError
from depthlab.base.extras import needs
from depthlab.data.image_tasks import ImageItem, ImageRef, ImageTask

IMAGE_TASKS = ("builtin-shapes",)  # the built-in image-text tasks
IMAGE_SIZE = 48
EVAL_ITEMS = 200
SEED = 0
SHAPES = ("circle", "cross", "square", "triangle")
COLORS = {"blue": (30, 60, 220), "green": (20, 160, 40), "red": (220, 30, 30), "yellow": (230, 200, 0)}
COUNTS = ("1", "2", "3", "4")
#: question kind -> (question, options, the picture's attribute that answers it)
QUESTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "shape": ("Which shape is shown in the image?", SHAPES),
    "color": ("Which color are the shapes in the image?", tuple(COLORS)),
    "count": ("How many shapes are in the image?", COUNTS),
}


def _draw(draw: Any, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    else:  # cross: two bars a third of the size wide
        w = (x1 - x0) / 3
        draw.rectangle((x0 + w, y0, x1 - w, y1), fill=fill)
        draw.rectangle((x0, y0 + w, x1, y1 - w), fill=fill)


def picture(shape: str, color: str, count: int, rng: random.Random, size: int = IMAGE_SIZE) -> Any:
    """A PIL picture of ``count`` copies of ``shape`` in ``color`` (RGB, ``size`` pixels square)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise needs("the builtin-shapes task", "vit") from None
    im = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(im)
    cell = size // 3
    for c in rng.sample(range(9), count):  # a free pixel on each side within the cell: shapes never touch
        side = rng.randint(cell // 2, cell - 3)
        x = (c % 3) * cell + rng.randint(1, cell - side - 1)
        y = (c // 3) * cell + rng.randint(1, cell - side - 1)
        _draw(draw, shape, (x, y, x + side - 1, y + side - 1), COLORS[color])
    return im


def shapes_example(rng: random.Random, kind: str) -> tuple[Any, dict[str, str]]:
    """A random picture and its attributes (``shape``, ``color``, ``count``), the one asked drawn uniformly."""
    attrs = {"shape": rng.choice(SHAPES), "color": rng.choice(tuple(COLORS)), "count": rng.choice(COUNTS)}
    attrs[kind] = QUESTIONS[kind][1][rng.randrange(4)]
    return picture(attrs["shape"], attrs["color"], int(attrs["count"]), rng), attrs


def shapes_items(n: int = EVAL_ITEMS, seed: int = SEED) -> list[ImageItem]:
    """``n`` items, the three questions in turn."""
    rng = random.Random(seed)
    items = []
    for k in range(n):
        kind = tuple(QUESTIONS)[k % 3]
        pic, attrs = shapes_example(rng, kind)
        question, options = QUESTIONS[kind]
        items.append(ImageItem((ImageRef(picture=pic),), question, options, options.index(attrs[kind]),
                               f"builtin-shapes:{k + 1}"))
    return items


def builtin_image_task(name: str, limit: int | None = None) -> ImageTask:
    """``builtin-shapes``: the first ``limit`` (at most :data:`EVAL_ITEMS`) items of :func:`shapes_items`."""
    if name not in IMAGE_TASKS:
        raise DepthlabError(f"unknown image-text task {name!r}; choose one of: {', '.join(IMAGE_TASKS)}")
    items = shapes_items(min(limit or EVAL_ITEMS, EVAL_ITEMS), SEED)
    return ImageTask(name, items, "generated pictures of shapes", {"seed": SEED, "image_size": IMAGE_SIZE})
