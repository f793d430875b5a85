"""Image data for ViTs: (pixels (B, C, H, W) float, labels (B,) long), normalised, split, augmented.

Specs: ``digits`` (scikit-learn's bundled 8x8 grey digits, offline; the CPU default), a local image folder
(one sub-folder per class, read with Pillow, resized to ``image_size``), ``hf:NAME`` (e.g. ``hf:cifar10``;
through ``datasets``, online only). Bad input raises ``DepthlabError`` with one line naming the bad value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.extras import needs
from depthlab.data.batches import SeededOrder

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class ImageData:
    """Normalised train / held-out tensors; ``mean`` / ``std`` per channel, from the training split."""

    train_x: torch.Tensor  # (N, C, H, W) float32, normalised
    train_y: torch.Tensor  # (N,) long
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[str]
    mean: torch.Tensor  # (C,)
    std: torch.Tensor  # (C,)
    augment: bool = True  # augment training batches (``TrainImages``); see ``load_images``

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]


def augment_batch(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Light augmentation, no flips (digits are not mirror-symmetric): small images (<= 32 px) move by up
    to 1 pixel each way (edge padding); larger ones get a random resized crop (scale 0.35..1)."""
    b, _, h, w = x.shape
    if max(h, w) <= 32:
        padded = F.pad(x, (1, 1, 1, 1), mode="replicate")
        dy, dx = torch.randint(0, 3, (2, b), generator=gen)
        return torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(b)])
    out = torch.empty_like(x)
    for i in range(b):
        scale = 0.35 + 0.65 * torch.rand((), generator=gen).item()
        ch, cw = max(1, int(h * scale ** 0.5)), max(1, int(w * scale ** 0.5))
        y0 = int(torch.randint(0, h - ch + 1, (), generator=gen))
        x0 = int(torch.randint(0, w - cw + 1, (), generator=gen))
        crop = x[i:i + 1, :, y0:y0 + ch, x0:x0 + cw]
        out[i] = F.interpolate(crop, size=(h, w), mode="bilinear", align_corners=False)[0]
    return out


def split_indices(n: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic, disjoint (train, held-out) split of ``range(n)``."""
    if not 0 < test_fraction < 1:
        raise DepthlabError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(n * test_fraction)))
    return order[n_test:].sort().values, order[:n_test].sort().values


def _finish(x: torch.Tensor, y: torch.Tensor, classes: list[str], test_fraction: float, seed: int,
            augment: bool) -> ImageData:
    if len(classes) < 2:
        raise DepthlabError(f"need at least 2 classes, found {len(classes)}: {classes}")
    tr, te = split_indices(len(y), test_fraction, seed)
    mean = x[tr].mean(dim=(0, 2, 3))
    std = x[tr].std(dim=(0, 2, 3)).clamp_min(1e-6)
    norm = (x - mean[:, None, None]) / std[:, None, None]
    return ImageData(norm[tr].contiguous(), y[tr], norm[te].contiguous(), y[te], classes, mean, std, augment)


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """scikit-learn's bundled 8x8 digits (1797 images, offline): pixels in [0, 1], (N, 1, 8, 8)."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as err:
        raise needs("the 'digits' data", "vit") from err
    ds = sk_digits()
    x = torch.tensor(ds.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(ds.target, dtype=torch.long), [str(c) for c in ds.target_names]


def folder_classes(root: str | Path) -> list[str]:
    """The class names of an image folder: its sub-folders that hold at least one image, sorted."""
    root = Path(root)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES
                                                                       for f in p.iterdir()))


def count_classes(spec: str) -> int | None:
    """How many classes the image data ``spec`` holds, without reading its images: 10 for ``digits``, the class
    sub-folders of a folder, the label names an ``hf:`` dataset declares (None when they cannot be read, e.g.
    offline: :func:`load_run_images` then checks the loaded data)."""
    if spec == "digits":
        return 10
    if spec.startswith("hf:"):
        try:
            import datasets

            features = datasets.load_dataset_builder(spec[3:]).info.features or {}
        except Exception:  # noqa: BLE001 - offline, not installed, unknown: the loaded data is checked instead
            return None
        names = [getattr(features.get(c), "names", None) for c in ("label", "labels", "fine_label")]
        return next((len(n) for n in names if n), None)
    n = len(folder_classes(spec)) if Path(spec).is_dir() else 0
    return n if n >= 2 else None  # fewer: the loader names what is wrong with the folder


def load_image_folder(root: str | Path, image_size: int, channels: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``root/<class>/<image>``: every image resized to ``image_size`` (bilinear), ``channels`` 1 (grey) or 3."""
    from PIL import Image

    root = Path(root)
    if not root.is_dir():
        raise DepthlabError(f"image folder {str(root)!r} does not exist")
    classes = folder_classes(root)
    if not classes:
        raise DepthlabError(f"image folder {str(root)!r} has no class sub-folder with images "
                            f"({', '.join(IMAGE_SUFFIXES)})")
    if len(classes) < 2:
        raise DepthlabError(f"image folder {str(root)!r} has one class only ({classes[0]!r}); need at least 2")
    mode = {1: "L", 3: "RGB"}.get(channels)
    if mode is None:
        raise DepthlabError(f"image folders are read with 1 or 3 channels, got channels={channels!r}")
    xs, ys = [], []
    for label, name in enumerate(classes):
        for f in sorted((root / name).iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as im:
                    im = im.convert(mode).resize((image_size, image_size), Image.BILINEAR)
                    t = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
            except OSError as err:
                raise DepthlabError(f"cannot read image {str(f)!r}: {str(err).splitlines()[0]}") from err
            xs.append(t.view(image_size, image_size, channels).permute(2, 0, 1).float() / 255.0)
            ys.append(label)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long), classes


def load_hf_images(name: str, image_size: int, channels: int, limit: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``hf:NAME`` through ``datasets`` (online): its train split, images resized to ``image_size``."""
    try:
        import datasets
    except ImportError as err:
        raise needs(f"hf:{name}", "hf-data") from err
    try:
        ds = datasets.load_dataset(name, split="train")
    except Exception as err:  # noqa: BLE001 - offline, unknown name, ...: one line for the user
        raise DepthlabError(f"cannot load hf:{name}: {first_line(err)}") from err
    image_col = next((c for c in ("img", "image", "pixel_values") if c in ds.column_names), None)
    label_col = next((c for c in ("label", "labels", "fine_label") if c in ds.column_names), None)
    if image_col is None or label_col is None:
        raise DepthlabError(f"hf:{name} has no image/label columns (found {', '.join(ds.column_names)})")
    feature = ds.features[label_col]
    classes = list(getattr(feature, "names", None) or sorted({str(v) for v in ds[label_col]}))
    mode = "L" if channels == 1 else "RGB"
    xs, ys = [], []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        im = row[image_col].convert(mode).resize((image_size, image_size))
        t = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
        xs.append(t.view(image_size, image_size, channels).permute(2, 0, 1).float() / 255.0)
        ys.append(int(row[label_col]))
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long), classes


def check_image_folder(root: str | Path) -> list[str]:
    """The class names of an image folder after every image file in it was opened and verified (Pillow reads its
    header and checks its structure, without decoding all pixels); DepthlabError naming the first file that is not
    an image Pillow can read, or what is wrong with the folder: before any model is loaded."""
    try:
        from PIL import Image
    except ImportError:
        raise needs("image folders", "vit") from None
    root = Path(root)
    if not root.is_dir():
        raise DepthlabError(f"image folder {str(root)!r} does not exist")
    classes = folder_classes(root)
    if len(classes) < 2:
        what = f"one class only ({classes[0]!r})" if classes else f"no class sub-folder with images ({', '.join(IMAGE_SUFFIXES)})"
        raise DepthlabError(f"image folder {str(root)!r} has {what}; need at least 2")
    for name in classes:
        for f in sorted((root / name).iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as im:
                    im.verify()
            except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...: one line
                raise DepthlabError(f"cannot read image {str(f)!r}: {first_line(err)[:120]}") from None
    return classes


def check_image_spec(spec: str) -> str:
    """``spec`` when it can name image data (``digits``, ``hf:NAME``, a folder whose images all open); else
    DepthlabError, before any work (a ViT asked to train on a text corpus, or on a folder holding a file that is not
    an image, is refused here, not after its run started)."""
    if spec == "digits" or spec.startswith("hf:"):
        return spec
    if Path(spec).is_dir():
        check_image_folder(spec)
        return spec
    what = "a file, not a folder of images" if Path(spec).is_file() else "no such folder"
    raise DepthlabError(f"unknown image data {spec!r} ({what}): a ViT trains on 'digits', a folder of class "
                        "sub-folders, or hf:NAME")


def load_images(spec: str, image_size: int = 8, channels: int = 1, test_fraction: float = 0.2, seed: int = 0,
                limit: int | None = None, augment: bool | None = None) -> ImageData:
    """``digits``, a folder path or ``hf:NAME`` -> normalised, split ``ImageData`` (split seeded by ``seed``).

    ``augment=None`` augments images of 16 px and more only: on the 8x8 digits a 1-pixel shift moves an eighth of
    the image and every 2x2 patch, and 150 steps of vit-tiny reach 35 % held-out accuracy with it, 94 % without."""
    if spec == "digits":
        x, y, classes = load_digits()
        if (x.shape[1], x.shape[2]) != (channels, image_size):
            if channels != 1:
                raise DepthlabError(f"digits are grey (channels=1), the model wants channels={channels}")
            x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    elif spec.startswith("hf:"):
        x, y, classes = load_hf_images(spec[3:], image_size, channels, limit)
    elif Path(spec).is_dir():
        x, y, classes = load_image_folder(spec, image_size, channels)
    else:
        check_image_spec(spec)
    return _finish(x, y, classes, test_fraction, seed, image_size >= 16 if augment is None else augment)


# ---------------------------------------------------------------------- a run's images
#: Seed of the train / held-out split of every ViT run (the run seed fixes init, order and augmentation):
#: the held-out images are the same for every seed of a comparison, and ``diagnose`` rebuilds them.
SPLIT_SEED = 0
HELD_OUT_FRACTION = 0.2


def load_run_images(data_spec: str, image_size: int, channels: int, num_classes: int, exact: bool = False) -> ImageData:
    """A ViT run's ``ImageData``: normalised, split by :data:`SPLIT_SEED`, checked against the model's classes
    (more classes than the head has outputs are refused; with ``exact``, for a new run, any other head size too:
    its extra outputs would never be trained)."""
    data = load_images(data_spec, image_size, channels, HELD_OUT_FRACTION, SPLIT_SEED)
    if data.num_classes > num_classes or (exact and data.num_classes != num_classes):
        raise DepthlabError(f"{data_spec!r} has {data.num_classes} classes but the model's head has num_classes="
                            f"{num_classes}; pass --set num_classes={data.num_classes}")
    return data


class TrainImages:
    """Training images as a function of the step: ``rank_batch(step, B, rank, world) -> (pixels, labels)``.

    Global image ``g`` of the run is image ``SeededOrder(N, seed).ids(g)`` (a fresh seeded permutation per
    epoch, as for token sequences), so a resumed run reads exactly the images it would have; the augmentation
    of a step is seeded by (seed, step, rank)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int, augment: bool) -> None:
        self.x, self.y, self.seed, self.augment = x, y, seed, augment
        self.order = SeededOrder(len(y), seed)

    def __len__(self) -> int:
        return len(self.y)

    def rank_batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        per = batch_size // world_size
        idx = torch.from_numpy(self.order.ids(step * batch_size + rank * per, per))
        x = self.x[idx]
        if self.augment:
            x = augment_batch(x, torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * step + rank))
        return x, self.y[idx]


class HeldOutImages:
    """(pixels, labels) batches of the first ``n`` held-out images, in the shape the diagnostics stream
    (``seq_len`` tokens per image: the class token and the patches)."""

    def __init__(self, data: ImageData, n: int, seq_len: int, batch_size: int, device: torch.device) -> None:
        self.x, self.y = data.test_x[:n], data.test_y[:n]
        self.seq_len, self.batch_size, self.device, self.split = seq_len, batch_size, device, "held-out images"
        self.requested = len(self.y) * seq_len
        self.short = False  # fewer held-out images than asked for is normal: all of them are used

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(self.y), self.batch_size):
            yield self.x[i:i + self.batch_size].to(self.device), self.y[i:i + self.batch_size].to(self.device)
