"""ViTs through the project's trainer (the family seam): digits, exact resume, load_run, CLI errors."""

import json

import pytest

from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.models.vit import ViT, vit_from_preset
from depthlab.train import TrainConfig, load_run, train

needs_sklearn = pytest.mark.skipif(__import__("importlib.util").util.find_spec("sklearn") is None,
                                   reason="the digits need scikit-learn")
TINY = dict(n_layers=3, d_model=16, n_heads=2, d_ff=32)
TINY_SET = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]


def _model(scheme="lns", **kw):
    return vit_from_preset("vit-tiny", scheme=scheme, **{**TINY, **kw})


def _train_cfg(**kw):
    return TrainConfig(**{"data": "digits", "steps": 6, "batch_size": 16, "eval_every": 3, "variance_every": 3,
                          "track_removal": True, "ckpt_every": 3, **kw})


class _StopAt:
    def __init__(self, at=None):
        self.at, self.records = at, []

    def __call__(self, rec):
        self.records.append(rec)
        if self.at is not None and rec["step"] == self.at:
            raise KeyboardInterrupt


@needs_sklearn
def test_vit_trains_resumes_exactly_and_reloads(tmp_path):
    straight = _StopAt()
    s1 = train(_model(), _train_cfg(), tmp_path / "a", progress=straight, quiet=True)
    first = _StopAt(3)
    with pytest.raises(KeyboardInterrupt):
        train(_model(), _train_cfg(), tmp_path / "b", progress=first, quiet=True)
    second = _StopAt()
    s2 = train(_model(), _train_cfg(), tmp_path / "b", resume=True, progress=second, quiet=True)
    losses = [(r["step"], r["loss"]) for r in first.records + second.records]
    assert losses == [(r["step"], r["loss"]) for r in straight.records] and len(losses) == 6
    assert s1["eval_loss"] == s2["eval_loss"] and s1["eval_acc"] == s2["eval_acc"]
    assert 0.0 <= s1["eval_acc"] <= 1.0 and "eval_ppl" not in s1 and len(s1["layer_variance"]) == 3
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if "eval_acc" in x]
    assert [x["step"] for x in evals] == [3, 6] and evals[-1]["eval_images"] == 359
    probes = [x for x in lines if "layer_angular" in x]
    assert probes and len(probes[-1]["layer_removal"]) == 3  # depth tracking on held-out images
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["family"] == "vit" and config["tokenizer"] is None and config["model"]["image_size"] == 8
    model, tokenizer, _ = load_run(tmp_path / "a")
    assert isinstance(model, ViT) and tokenizer is None and model.cfg.scheme == "lns"
    with pytest.raises(DepthlabError, match="scheme"):
        train(_model("pre"), _train_cfg(), tmp_path / "a", resume=True, quiet=True)


@needs_sklearn
def test_cli_train_vit_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--preset", "vit-tiny", "--scheme", "lns", "--set", "lns_position=after-branch", *TINY_SET,
            "--data", "digits", "--steps", "2", "--batch-size", "16", "--no-plots", "-q"]
    assert main([*args, "--out", str(out)]) == 0
    assert "top-1 accuracy" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["scheme_options"] == {"position": "after-branch"}
    assert main(["train", "--resume", str(out), "-q", "--no-plots"]) == 0


def test_cli_rejects_bad_image_folders_in_one_line(tmp_path, capsys):
    pytest.importorskip("PIL")
    from PIL import Image

    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    one = tmp_path / "one"
    (one / "cat").mkdir(parents=True)
    Image.new("L", (8, 8)).save(one / "cat" / "a.png")
    for folder, words in ((empty, "no class sub-folder with images"), (one, "one class only")):
        out = tmp_path / f"out-{folder.name}"
        assert main(["train", "--preset", "vit-tiny", *TINY_SET, "--data", str(folder), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1 and not out.exists()


def test_the_default_data_of_a_vit_is_the_builtin_image_set():
    from depthlab.models.vit import vit_from_preset
    from depthlab.train import TrainConfig
    from depthlab.train.vit_family import vit_train_config

    cfg = vit_train_config(TrainConfig(), vit_from_preset("vit-tiny"))
    assert cfg.data == "digits" and TrainConfig().data == "builtin"


def test_the_head_is_sized_to_an_image_folder_or_a_mismatch_refused(tmp_path, capsys):
    """A 2-class folder: a preset's 10-class head becomes a 2-class head (a head whose 8 extra outputs would never
    be trained was kept before); a head set on purpose to another size is refused in one line, before any work."""
    pytest.importorskip("PIL")
    from PIL import Image

    folder = tmp_path / "two"
    for c, shade in (("cat", 40), ("dog", 200)):
        (folder / c).mkdir(parents=True)
        for i in range(12):
            Image.new("L", (8, 8), shade + i).save(folder / c / f"{i}.png")
    out = tmp_path / "run"
    args = ["train", "--preset", "vit-tiny", *TINY_SET, "--data", str(folder), "--steps", "2", "--batch-size", "4",
            "--no-plots", "-q"]
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model"]["num_classes"] == 2
    model, _, _ = load_run(out)
    assert model.classifier.out_features == 2
    assert main([*args, "--set", "num_classes=5", "--out", str(tmp_path / "five")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 2 classes" in err[0] and "num_classes=5" in err[0]
    assert not (tmp_path / "five").exists()
