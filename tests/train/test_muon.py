"""``--optimizer muon``: the update against a hand-written Newton-Schulz step and torch.optim.Muon, the split rule over
every scheme, training (every scheme, bf16, compile), bit-exact resume, bad input.

Tolerances (stated once):
- The trainer's Newton-Schulz run in float64 equals the hand-written one below (float64, from the formula) to 1e-12.
- ``NS_TOL``: in bf16 (as the trainer runs it, like Keller Jordan's, modded-nanogpt's and torch's) the relative
  Frobenius distance of the two updates is bf16's rounding (2^-9 per operation) through 5 iterations of 3 matmuls:
  measured 1.3-1.8 %, so 3 %; one iteration fewer moves it by 32 %, dropping the Nesterov term by more than 15 %.
- Against ``torch.optim.Muon`` (the same bf16 algorithm, where the installed torch has it): bit-equal.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from depthlab import from_preset
from depthlab.base.errors import ConfigError
from depthlab.cli import main
from depthlab.models.configure import from_preset as preset_config
from depthlab.models.schemes import SCHEMES
from depthlab.train import TrainConfig, train
from depthlab.train.muon import NS_COEFFICIENTS, MuonAdamW, muon_split, newton_schulz
from depthlab.train.optim import build_optimizer, skips_on_device

NS_TOL = 0.03

#: The hidden matrices of a depthlab block, by name (an independent statement of the rule in depthlab.train.muon).
HIDDEN = re.compile(r"blocks\.\d+\.(attn\.[qkvo]_proj|ffn\.(gate|up|down)_proj|ffn\.fc[12]|mlp\.fc[12])\.weight")


def small(scheme: str = "pre", **kw):
    return from_preset("tiny", **{"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "scheme": scheme, **kw})


def small_train(**kw) -> TrainConfig:
    base = dict(data="builtin", tokenizer="bytes", steps=6, batch_size=4, seq_len=32, eval_tokens=512, eval_every=3,
                variance_every=2, log_every=1, ckpt_every=3, lr=3e-3, optimizer="muon", weight_decay=0.1, device="cpu")
    return TrainConfig(**{**base, **kw})


# ------------------------------------------------------------------------------ the update
def ns_by_hand(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Newton-Schulz in float64 from the formula: X0 = G/‖G‖_F, X <- aX + b(XXᵀ)X + c(XXᵀ)²X, on the wide side."""
    a, b, c = NS_COEFFICIENTS
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.T if tall else x


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("shape", [(48, 32), (32, 48)], ids=["tall", "wide"])
def test_two_steps_equal_a_hand_written_newton_schulz_update(shape):
    torch.manual_seed(0)
    w0 = torch.randn(shape)
    grads = [torch.randn(shape), torch.randn(shape)]
    lr, wd, momentum = 0.02, 0.1, 0.95
    p = nn.Parameter(w0.clone())
    opt = MuonAdamW([{"params": [p], "muon": True}], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    w, buf = w0.double(), torch.zeros(shape, dtype=torch.float64)
    for g in grads:
        decayed = p.detach().double() * (1 - lr * wd)
        p.grad = g.clone()
        opt.step()
        buf = momentum * buf + (1 - momentum) * g.double()  # Nesterov: the update looks one momentum step ahead
        update = ns_by_hand((1 - momentum) * g.double() + momentum * buf)
        w = w * (1 - lr * wd) - lr * 0.2 * math.sqrt(max(shape)) * update
        got = (decayed - p.detach().double()) / (lr * 0.2 * math.sqrt(max(shape)))
        assert rel(got, update) < NS_TOL
        assert rel(p.detach(), w) < 1e-3
    # the formula itself, in float64: the same to rounding; the tolerance tells variants apart (a missing Nesterov
    # term, one iteration fewer)
    g = torch.randn(shape, dtype=torch.float64)
    assert rel(newton_schulz(g, dtype=torch.float64), ns_by_hand(g)) < 1e-12
    assert rel(ns_by_hand(buf), ns_by_hand((1 - momentum) * grads[1].double() + momentum * buf)) > 5 * NS_TOL
    assert rel(ns_by_hand(g, steps=4), ns_by_hand(g)) > 5 * NS_TOL
    s = torch.linalg.svdvals(newton_schulz(torch.randn(shape)).double())
    assert 0.6 < s.min() and s.max() < 1.3  # NS5 maps every singular value near 1 (Jordan's ~[0.7, 1.2])


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_muon_part_equals_torch_muon_and_adamw_part_equals_torch_adamw():
    """The trainer's optimizer on a real model against torch's own Muon (match_rms_adamw) on the Muon names and
    torch's AdamW on the others: bit-equal weights after 3 steps."""
    from depthlab import build_model

    torch.manual_seed(0)
    model = build_model(small("lns"))
    ref = build_model(small("lns"))
    ref.load_state_dict(model.state_dict())
    cfg = small_train(lr=1e-2).resolve(model.cfg)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    split = muon_split(ref)
    named = dict(ref.named_parameters())
    t_muon = torch.optim.Muon([named[n] for n in split["muon"]], lr=cfg.lr, weight_decay=cfg.weight_decay,
                              momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
    t_adamw = torch.optim.AdamW([named[n] for n in split["adamw"]], lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=True)
    x = torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for m, opts in ((model, (opt,)), (ref, (t_muon, t_adamw))):
            m(x, labels=x).loss.backward()
            for o in opts:
                o.step()
                o.zero_grad()
    for name, p in model.named_parameters():
        assert torch.equal(p, named[name]), name


# ------------------------------------------------------------------------------ the split, every scheme
def _schemes():
    return [pytest.param(s, id=s) for s in SCHEMES]


@pytest.mark.parametrize("scheme", _schemes())
def test_split_rule_over_every_scheme(scheme):
    from depthlab import build_model

    model = build_model(preset_config("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, scheme=scheme), "meta")
    split = muon_split(model)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(split["muon"] + split["adamw"]) == sorted(names)  # every parameter, once
    assert split["muon"] == [n for n in names if HIDDEN.fullmatch(n)]
    shapes = dict((n, p.shape) for n, p in model.named_parameters())
    assert all(len(shapes[n]) == 2 for n in split["muon"]) and len(split["muon"]) == 2 * 7
    assert "embed.weight" in split["adamw"] and all(n in split["adamw"] for n in names if "norm" in n or n.endswith(".bias"))
    # what stays with AdamW although it is 2-D: only the embedding, the head and the streams' mixing matrices
    other_2d = {n for n in split["adamw"] if len(shapes[n]) == 2}
    assert all(n in ("embed.weight", "lm_head.weight") or re.search(r"\.(res|w_res|phi)$", n) for n in other_2d), other_2d


def test_split_of_a_vit():
    from depthlab.models.kinds import kind_of_preset

    fam = kind_of_preset("vit-tiny")
    cfg = preset_config("vit-tiny", n_layers=2)
    model = fam.build(cfg, "meta")
    split = muon_split(model)
    assert split["muon"] and all(n.startswith("blocks.") and n.endswith(".weight") for n in split["muon"])
    assert not any(n.startswith("blocks.") for n in split["adamw"] if dict(model.named_parameters())[n].ndim == 2)


def test_a_model_without_hidden_matrices_is_refused_in_one_line():
    class NoLinears(nn.Module):  # blocks of gains only: nothing for Muon to orthogonalise
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.blocks = nn.ModuleList(nn.LayerNorm(4) for _ in range(2))

    with pytest.raises(ConfigError, match=r"^optimizer 'muon' needs linear layers inside the blocks of NoLinears.*adamw"):
        muon_split(NoLinears())
    with pytest.raises(ConfigError, match="2-D matrices only"):
        MuonAdamW([{"params": [nn.Parameter(torch.ones(3))], "muon": True}], lr=1.0, betas=(0.9, 0.999), eps=1e-8,
                  weight_decay=0.0)


# ------------------------------------------------------------------------------ training
def _loss_falls(scheme: str, steps: int = 50) -> tuple[float, float]:
    """(first loss, mean of the last 5) of ``steps`` Muon steps on one fixed batch of the built-in text."""
    from depthlab import build_model
    from depthlab.data import iter_documents

    text = "".join(d for _, d in zip(range(40), iter_documents("builtin", "train", "text")))
    data = torch.tensor(list(text.encode()[:4 * 33]), dtype=torch.long).view(4, 33)
    x, y = data[:, :-1], data[:, 1:]
    torch.manual_seed(0)
    model = build_model(small(scheme, vocab_size=256))
    cfg = small_train(lr=1e-2, steps=steps).resolve(model.cfg)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    losses = []
    for _ in range(steps):
        loss = model(x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses[0], sum(losses[-5:]) / 5


@pytest.mark.parametrize("scheme", _schemes())
def test_loss_falls_within_50_steps_for_every_scheme(scheme):
    first, last = _loss_falls(scheme)
    assert math.isfinite(last) and last < first - 1.0, (first, last)


def test_muon_run_records_its_split_and_never_defers(tmp_path):
    summary = train(small(), small_train(steps=2, ckpt_every=2), tmp_path / "run", quiet=True)
    assert math.isfinite(summary["eval_loss"])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    split = config["optimizer_split"]
    assert "blocks.0.attn.q_proj.weight" in split["muon"] and "embed.weight" in split["adamw"]
    assert split["rule"]["ns_steps"] == 5
    assert not skips_on_device(MuonAdamW([{"params": [nn.Parameter(torch.ones(2, 2))], "muon": True}], lr=1.0,
                                         betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True))
    assert main(["train", "--config", str(tmp_path / "run" / "config.json"), "--steps", "1", "--out",
                 str(tmp_path / "again"), "--no-plots", "-q"]) == 0  # config.json (with its split) is a valid --config
    # finetune --optimizer muon --dtype bf16: weights auto become fp32 (Muon's update needs them), autocast in bf16
    assert main(["finetune", str(tmp_path / "run"), "--data", "builtin-sft", "--steps", "2", "--batch-size", "2",
                 "--seq-len", "256", "--optimizer", "muon", "--dtype", "bf16", "--out", str(tmp_path / "sft"), "-q"]) == 0
    sft = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert sft["train"]["weights"] == "fp32" and sft["optimizer_split"]["muon"] == split["muon"]


class _StopAt:
    def __init__(self, step=None):
        self.step, self.records = step, []

    def __call__(self, rec):
        self.records.append(rec)
        if rec["step"] == self.step:
            raise KeyboardInterrupt


def test_resume_is_bit_exact(tmp_path):
    straight = _StopAt()
    s1 = train(small("lns"), small_train(), tmp_path / "a", progress=straight, quiet=True)
    first = _StopAt(3)
    with pytest.raises(KeyboardInterrupt):
        train(small("lns"), small_train(), tmp_path / "b", progress=first, quiet=True)
    second = _StopAt()
    s2 = train(small("lns"), small_train(), tmp_path / "b", resume=True, progress=second, quiet=True)
    losses = [(r["step"], r["loss"]) for r in first.records + second.records]
    assert losses == [(r["step"], r["loss"]) for r in straight.records]
    assert s1["eval_loss"] == s2["eval_loss"] and s1["layer_variance"] == s2["layer_variance"]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / r / "checkpoint" / "step-00000006" / "model.safetensors")) for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(tmp_path / "b" / "checkpoint" / "step-00000006" / "optimizer.pt", weights_only=False)
    kinds = {frozenset(s) for s in state["state"].values()}
    assert frozenset({"momentum_buffer"}) in kinds and frozenset({"step", "exp_avg", "exp_avg_sq"}) in kinds


@pytest.mark.parametrize("mode", ["bf16", "compile"])
def test_bf16_and_compiled_runs_track_fp32_eager(tmp_path, mode, monkeypatch):
    """bf16 autocast over fp32 weights, and the compiled training call (aot_eager: dynamo's capture and autograd
    graph without a C++ compile), each within the fast path's tolerances of the fp32 eager Muon run."""
    from depthlab.train import loop

    monkeypatch.setattr(loop, "compile_for_training", lambda m: torch.compile(m, backend="aot_eager"))
    kw = dict(steps=10, ckpt_every=10, eval_every=10, variance_every=10, dtype="fp32")
    curves = {}
    for name, extra in (("ref", {}), (mode, {"dtype": "bf16"} if mode == "bf16" else {"compile": True})):
        losses = {}
        train(small("lns"), small_train(**{**kw, **extra}), tmp_path / name, quiet=True,
              progress=lambda r, d=losses: d.__setitem__(r["step"], r["loss"]))
        curves[name] = losses
    gap = max(abs(curves[mode][s] - curves["ref"][s]) for s in curves["ref"])
    print(mode, gap)
    assert gap < (5e-3 if mode == "bf16" else 1e-4), gap
    assert gap > 0 or mode == "compile"  # autocast did run: bf16 matmuls round differently
    assert curves["ref"][10] < curves["ref"][1] - 0.3


# ------------------------------------------------------------------------------ bad input
_SMALL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--steps", "2",
          "--batch-size", "4", "--seq-len", "16", "--eval-tokens", "256", "--tokenizer", "bytes"]


@pytest.mark.parametrize("case", ["unknown_flag", "unknown_config", "bf16_flag", "bf16_config"])
@pytest.mark.parametrize("command", ["train", "compare", "finetune"])
def test_bad_optimizer_input_is_one_line_exit_2_before_training(tmp_path, capsys, case, command):
    settings = {"optimizer": "sgd"} if case.startswith("unknown") else {"optimizer": "muon", "weights": "bf16"}
    flags = [x for k, v in settings.items() for x in (f"--{k}", v)]
    cfg = tmp_path / "run.yaml"
    cfg.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    given = flags if case.endswith("flag") else ["--config", str(cfg)]
    out = tmp_path / "out"
    argv = {"train": ["train", *_SMALL, "--out", str(out)],
            "compare": ["compare", "--schemes", "pre,lns", *_SMALL, "--out", str(out)],
            "finetune": ["finetune", str(tmp_path / "nowhere"), "--data", "builtin-sft", "--out", str(out)]}[command]
    try:
        code = main([*argv, *given])
    except SystemExit as exit_:  # argparse refuses a bad choice on the command line itself
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"depthlab {command}: error:"), err
    assert ("'sgd'" in err[0] and "muon" in err[0]) if case.startswith("unknown") else "weights 'bf16'" in err[0]
    assert not out.exists()
