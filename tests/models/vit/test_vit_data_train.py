"""ViT image data (digits, image folders, bad input) and the small standalone trainer."""

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.data.images import TrainImages, augment_batch, load_images, split_indices
from depthlab.models.vit import vit_from_preset

needs_sklearn = pytest.mark.skipif(__import__("importlib.util").util.find_spec("sklearn") is None,
                                   reason="the digits need scikit-learn")


@needs_sklearn
def test_digits_split_is_deterministic_disjoint_and_normalised():
    a, b = load_images("digits", seed=0), load_images("digits", seed=0)
    assert a.train_x.shape[1:] == (1, 8, 8) and len(a.train_y) + len(a.test_y) == 1797
    assert len(a.test_y) == round(1797 * 0.2) and a.num_classes == 10
    torch.testing.assert_close(a.test_x, b.test_x, rtol=0, atol=0)
    tr, te = split_indices(1797, 0.2, seed=0)
    assert not set(tr.tolist()) & set(te.tolist()) and len(set(tr.tolist()) | set(te.tolist())) == 1797
    assert not torch.equal(split_indices(1797, 0.2, seed=1)[1], te)
    assert abs(a.train_x.mean().item()) < 1e-4 and abs(a.train_x.std().item() - 1) < 1e-2  # training-split stats
    assert a.train_y.dtype == torch.long and a.train_x.dtype == torch.float32
    assert not a.augment  # 8x8: no shifts by default
    x, y = TrainImages(a.train_x, a.train_y, seed=0, augment=a.augment).rank_batch(0, 16)
    assert x.shape == (16, 1, 8, 8) and y.shape == (16,)


def test_augmentation_shifts_by_at_most_one_pixel_and_crops_large_images():
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(8, 1, 8, 8)
    x[:, :, 4, 4] = 1.0
    out = augment_batch(x, gen)
    for img in out:
        r, c = (img[0] == 1).nonzero()[0].tolist()
        assert abs(r - 4) <= 1 and abs(c - 4) <= 1
    big = augment_batch(torch.rand(2, 3, 32 + 8, 40), gen)
    assert big.shape == (2, 3, 40, 40)


def _png_folder(root, classes=("cat", "dog"), per_class=5, size=(12, 10)):
    from PIL import Image

    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            img = Image.new("RGB", size, color=(40 * k + i, 100, 200 - 30 * k))
            img.save(root / name / f"{i}.png")
    return root


def test_image_folder_loads_generated_pngs(tmp_path):
    root = _png_folder(tmp_path / "imgs")
    (root / "notes.txt").write_text("not an image")
    data = load_images(str(root), image_size=16, channels=3, test_fraction=0.2, seed=0)
    assert data.classes == ["cat", "dog"] and data.shape == (3, 16, 16)
    assert len(data.train_y) == 8 and len(data.test_y) == 2 and data.augment
    grey = load_images(str(root), image_size=8, channels=1)
    assert grey.shape == (1, 8, 8)


@pytest.mark.parametrize("case, match", [
    ("empty", "has no class sub-folder with images"),
    ("one-class", "has one class only ('cat')"),
    ("missing", "does not exist"),
    ("spec", "unknown image data 'nope.bin'"),
])
def test_bad_image_data_is_one_line(tmp_path, case, match):
    if case == "empty":
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / "x.txt").write_text("no image")
        spec = str(tmp_path)
    elif case == "one-class":
        spec = str(_png_folder(tmp_path / "one", classes=("cat",)))
    elif case == "missing":
        spec = str(tmp_path / "missing") + "/"
    else:
        spec = "nope.bin"
    with pytest.raises(DepthlabError) as err:
        if case == "missing":
            from depthlab.data.images import load_image_folder
            load_image_folder(spec, 8, 1)
        else:
            load_images(spec, image_size=8, channels=3)
    assert match in str(err.value) and "\n" not in str(err.value)


@needs_sklearn
def test_training_on_digits_beats_chance_clearly(tmp_path):
    from depthlab.train import TrainConfig, train

    torch.set_num_threads(1)
    cfg = vit_from_preset("vit-tiny", n_layers=4, d_model=32, n_heads=2, d_ff=64, init_std=0.1)
    summary = train(cfg, TrainConfig(data="digits", steps=150, lr=3e-3, batch_size=64, seed=0, eval_every=0,
                                     ckpt_every=0, track_depth=False, device="cpu"), tmp_path / "run", quiet=True)
    assert summary["eval_acc"] > 0.5, summary["eval_acc"]
    assert len(summary["layer_variance"]) == 4 and all(v > 0 for v in summary["layer_variance"])
    assert summary["eval_loss"] < 2.0
