"""Trainer: exact resume, atomic checkpoints, NaN stop, load_run, run-dir contents, bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from depthlab import from_preset
from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import sha256_file
from depthlab.base.store import checkpoint as ckpt_mod
from depthlab.cli import main
from depthlab.train import TrainConfig, TrainingDiverged, find_checkpoint, list_checkpoints, load_run, lr_at, train


def small_model(**kw):
    """The tiny preset shrunk: 2 blocks of width 32."""
    return from_preset("tiny", **{"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, **kw})


def small_train(**kw):
    base = dict(data="builtin", tokenizer="bytes", steps=6, batch_size=4, seq_len=32, eval_tokens=512,
                eval_every=3, variance_every=2, log_every=1, ckpt_every=3, lr=3e-3)
    return TrainConfig(**{**base, **kw})


def _losses(records):
    return [(r["step"], r["loss"]) for r in records]


class _StopAt:
    def __init__(self, step=None):
        self.step, self.records = step, []

    def __call__(self, rec):
        self.records.append(rec)
        if rec["step"] == self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("kw", [dict(), dict(pack=False, micro_batch_size=2, grad_clip=1.0), dict(streaming=True)],
                         ids=["packed", "padded-accum-clip", "streaming"])
def test_resume_gives_identical_losses(tmp_path, kw):
    straight = _StopAt()
    s1 = train(small_model(), small_train(**kw), tmp_path / "a", progress=straight, quiet=True)
    first = _StopAt(3)
    with pytest.raises(KeyboardInterrupt):
        train(small_model(), small_train(**kw), tmp_path / "b", progress=first, quiet=True)
    second = _StopAt()
    s2 = train(small_model(), small_train(**kw), tmp_path / "b", resume=True, progress=second, quiet=True)
    assert _losses(first.records) + _losses(second.records) == _losses(straight.records)
    assert [s for s, _ in _losses(second.records)] == [4, 5, 6]
    assert s1["eval_loss"] == s2["eval_loss"] and s1["layer_variance"] == s2["layer_variance"]
    # metrics.jsonl of the resumed run holds each step once
    steps = [json.loads(l)["step"] for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(l)]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_run_directory_and_load_run(tmp_path):
    out = tmp_path / "run"
    summary = train(small_model(scheme="lns"), small_train(), out, quiet=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["scheme"] == "lns" and cfg["model"]["vocab_size"] == 258
    assert {"model", "train", "versions", "command", "tokenizer"} <= set(cfg)
    assert TrainConfig.from_dict(cfg["train"]).to_dict() == cfg["train"]  # JSON round-trip
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert any({"step", "loss", "lr", "tokens", "tokens_per_s"} <= set(l) for l in lines)
    assert any({"eval_loss", "eval_ppl"} <= set(l) for l in lines)
    var = [l for l in lines if "layer_variance" in l]
    assert [l["step"] for l in var] == [0, 2, 4, 6] and all(len(l["layer_variance"]) == 2 for l in var)
    s = json.loads((out / "summary.json").read_text())
    assert {"eval_loss", "eval_ppl", "layer_variance", "tokens", "wall_s", "tokens_per_s"} <= set(s)
    assert s["tokens"] == 6 * 4 * 32 == summary["tokens"]
    assert [p.name for p in list_checkpoints(out)] == ["step-00000003", "step-00000006"]
    for path in (out, out / "checkpoint", out / "checkpoint" / "step-00000006"):
        model, tok, config = load_run(path)
        assert model.cfg.scheme == "lns" and tok.spec == "bytes" and config["model"] == cfg["model"]
    # the loaded model reproduces the final eval: same weights, same scheme
    x = torch.arange(32).unsqueeze(0)
    assert torch.isfinite(model(x).logits).all()
    # a checkpoint whose weights claim another scheme is refused, never loaded as the config's one
    ck = out / "checkpoint" / "step-00000006"
    from safetensors.torch import load_file, save_file

    sd = load_file(str(ck / "model.safetensors"))
    save_file(sd, str(ck / "model.safetensors"), metadata={"format": "pt", "scheme": "pre"})
    state = json.loads((ck / "trainer_state.json").read_text())
    state["files"]["model.safetensors"] = (ck / "model.safetensors").stat().st_size
    state["sha256"]["model.safetensors"] = sha256_file(ck / "model.safetensors")  # a consistent, re-labelled file
    (ck / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(DepthlabError, match="scheme"):
        load_run(ck)


def test_interrupted_checkpoint_write_is_never_loaded(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_save, calls = torch.save, {"n": 0}

    def crashing_save(obj, f, *a, **k):  # the optimizer file of the second checkpoint (step 6) fails
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ckpt_mod.torch, "save", crashing_save)
    with pytest.raises(DepthlabError, match="cannot write checkpoint step 6.*simulated"):  # one line, not a traceback
        train(small_model(), small_train(), out, quiet=True)
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    assert not any(".tmp-" in p.name for p in (out / "checkpoint").iterdir())  # a failed write cleans up
    (out / "checkpoint" / ".tmp-step-00000006-crashed").mkdir()  # what a kill -9 mid-write leaves
    assert find_checkpoint(out).name == "step-00000003"
    # a checkpoint dir cut short (e.g. a non-atomic copy) is skipped too
    bad = out / "checkpoint" / "step-00000009"
    shutil.copytree(out / "checkpoint" / "step-00000003", bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.truncate(100)
    assert find_checkpoint(out).name == "step-00000003"
    with pytest.raises(DepthlabError, match="incomplete"):
        find_checkpoint(bad)
    shutil.rmtree(bad)
    summary = train(small_model(), small_train(), out, resume=True, quiet=True)
    assert summary["tokens"] == 6 * 4 * 32
    assert find_checkpoint(out).name == "step-00000006"
    assert not any(".tmp-" in p.name for p in (out / "checkpoint").iterdir())  # stale ones removed


def test_nan_loss_stops_naming_the_step(tmp_path, monkeypatch, capsys):
    import depthlab.models.decoder as models  # the LM family builds through depthlab.models.decoder.build_model

    real_build = models.build_model
    calls = {"n": 0}

    def poisoned_build(cfg, device=None):
        model = real_build(cfg, device)

        def hook(_m, _i, out):  # training forwards only; the 4th one (step 4) returns NaN logits
            if _m.training:
                calls["n"] += 1
                if calls["n"] >= 4:
                    return out * float("nan")
            return out

        model.lm_head.register_forward_hook(hook)
        return model

    monkeypatch.setattr(models, "build_model", poisoned_build)
    with pytest.raises(TrainingDiverged, match="at step 4") as err:
        train(small_model(), small_train(), tmp_path / "a", quiet=True)
    assert err.value.step == 4 and err.value.checkpoint.name == "step-00000003"
    assert find_checkpoint(tmp_path / "a").name == "step-00000003"
    calls["n"] = 0
    code = main(["train", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
                 "--tokenizer", "bytes", "--steps", "6", "--batch-size", "4", "--seq-len", "32", "--eval-tokens",
                 "512", "--ckpt-every", "3", "--out", str(tmp_path / "b"), "-q"])
    assert code == 1
    err_lines = [l for l in capsys.readouterr().err.splitlines() if "error" in l]
    assert len(err_lines) == 1 and "step 4" in err_lines[0]


def test_schedule_warmup_cosine_floor():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup=0.1, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(99, cfg) == pytest.approx(1e-4)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))


def test_resolved_defaults_follow_spec():
    c = TrainConfig().resolve(from_preset("llama-130m"))
    assert (c.lr, c.steps, c.warmup_steps, c.seq_len, c.batch_size) == (1e-3, 20_000, 2_000, 256, 512)
    c = TrainConfig().resolve(from_preset("llama-1b"))
    assert (c.lr, c.steps, c.warmup_steps) == (5e-4, 100_000, 1_000)
    c = TrainConfig(batch_size=8).resolve(from_preset("tiny"), world_size=2)
    assert c.micro_batch_size == 4 and c.accum_steps(2) == 1


_SMALL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--steps", "2",
          "--batch-size", "4", "--seq-len", "16", "--eval-tokens", "256", "-q"]


@pytest.mark.parametrize("case", ["missing_data", "empty_file", "no_text_field", "bad_utf8", "seq_too_long",
                                  "batch_not_divisible", "unknown_tokenizer", "bad_set", "existing_run"])
def test_bad_input_one_line_exit_2_nothing_overwritten(tmp_path, capsys, case):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"keep": "me"}')
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(200)))
    extra = {
        "missing_data": ["--data", str(tmp_path / "nope.jsonl")],
        "empty_file": ["--data", str(tmp_path / "empty.txt")],
        "no_text_field": ["--data", str(data), "--text-field", "body"],
        "bad_utf8": ["--data", str(tmp_path / "bad.txt")],
        "seq_too_long": ["--data", str(data), "--seq-len", "100000", "--tokenizer", "bytes"],
        "batch_not_divisible": ["--data", str(data), "--micro-batch-size", "3", "--tokenizer", "bytes"],
        "unknown_tokenizer": ["--data", str(data), "--tokenizer", "sentencepiece:9"],
        "bad_set": ["--data", str(data), "--set", "n_layerz=2"],
        "existing_run": ["--data", str(data), "--tokenizer", "bytes"],
    }[case]
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 au lait\n")
    out = run if case == "existing_run" else tmp_path / "new"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = main(["train", *_SMALL, *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("depthlab train: error:"), err
    assert (run / "config.json").read_text() == '{"keep": "me"}'
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing created either


def test_resume_refuses_other_scheme_or_tokenizer(tmp_path):
    out = tmp_path / "run"
    train(small_model(), small_train(steps=2, ckpt_every=1), out, quiet=True)
    with pytest.raises(DepthlabError, match="scheme"):
        train(small_model(scheme="lns"), small_train(steps=2), out, resume=True, quiet=True)
    with pytest.raises(DepthlabError, match="tokenizer"):
        train(small_model(), small_train(steps=2, tokenizer="bpe:300"), out, resume=True, quiet=True)
    with pytest.raises(DepthlabError, match="seed"):
        train(small_model(), small_train(steps=2, seed=1), out, resume=True, quiet=True)


def test_cli_train_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *_SMALL, "--tokenizer", "bytes", "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()
    assert (out / "layer_variance.png").stat().st_size > 0 and (out / "loss.png").stat().st_size > 0
    assert main(["train", "--resume", str(out), "--scheme", "lns"]) == 2
    assert "scheme" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "-q"]) == 0


def test_cli_tokenize_then_train_on_shards(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(300)))
    shards = tmp_path / "shards"
    assert main(["tokenize", "--data", str(data), "--tokenizer", "bytes", "--out", str(shards)]) == 0
    assert (shards / "train.bin").stat().st_size > 0 and (shards / "val.bin").stat().st_size > 0
    assert main(["tokenize", "--data", str(data), "--out", str(shards)]) == 2  # never over an existing dir
    out = tmp_path / "run"
    assert main(["train", *_SMALL, "--data", str(shards), "--no-plots", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["train"]["tokenizer"] == "bytes"
    assert main(["train", *_SMALL, "--data", str(shards), "--tokenizer", "bpe:300", "--out", str(tmp_path / "r2")]) == 2
    assert "shards" in capsys.readouterr().err


def test_same_seed_same_data_and_init_whatever_the_scheme(tmp_path, monkeypatch):
    """compare relies on it: pre and lns runs see the same batches and start from the same weights."""
    import depthlab.models.decoder as models  # the LM family builds through depthlab.models.decoder.build_model
    from depthlab.data.batches import TokenSequences

    seen, inits = {}, {}
    real_batch, real_build = TokenSequences.rank_batch, models.build_model

    def spy_batch(self, step, *a, **k):
        out = real_batch(self, step, *a, **k)
        seen.setdefault(current["scheme"], []).append(out[0].clone())
        return out

    def spy_build(cfg, device=None):
        model = real_build(cfg, device)
        inits[cfg.scheme] = {k: v.clone() for k, v in model.state_dict().items()}
        return model

    monkeypatch.setattr(TokenSequences, "rank_batch", spy_batch)
    monkeypatch.setattr(models, "build_model", spy_build)
    current = {}
    for scheme in ("pre", "lns"):
        current["scheme"] = scheme
        train(small_model(scheme=scheme), small_train(steps=2, ckpt_every=0, eval_every=0), tmp_path / scheme, quiet=True)
    assert all(torch.equal(a, b) for a, b in zip(seen["pre"], seen["lns"])) and len(seen["pre"]) == 2
    assert inits["pre"].keys() == inits["lns"].keys()
    assert all(torch.equal(inits["pre"][k], inits["lns"][k]) for k in inits["pre"])
