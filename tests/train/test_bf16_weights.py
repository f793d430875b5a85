"""bf16 weights with no fp32 copy (``weights="bf16"``, ``finetune --dtype bf16``): stochastic rounding is unbiased
and keeps updates that round-to-nearest loses, the optimizer is Adam(W), the CPU linears compute in fp32 without
saving an fp32 weight, and a fine-tuning run stores bf16 only and resumes exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from depthlab import from_preset
from depthlab.cli import main
from depthlab.train import TrainConfig, train
from depthlab.train.bf16_weights import StochasticRoundingAdam, stochastic_round, upcast_linears
from depthlab.train.finetune import finetune

ULP_AT_1 = 2.0**-7  # bf16 spacing in [1, 2)


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    g = torch.Generator().manual_seed(0)
    for x in (1 + ULP_AT_1 / 4, -(1 + 3 * ULP_AT_1 / 4), 3.0):
        out = stochastic_round(torch.full((200_000,), x), g).float()
        lo = torch.tensor(x).bfloat16().float()  # a neighbour; the other is one spacing away
        assert set(out.unique().tolist()) <= {lo.item(), (lo - ULP_AT_1).item(), (lo + ULP_AT_1).item(),
                                              (lo + 2 * ULP_AT_1).item(), (lo - 2 * ULP_AT_1).item()}
        assert out.mean().item() == pytest.approx(x, abs=4 * ULP_AT_1 / 200_000**0.5)
    assert torch.equal(stochastic_round(torch.tensor([3.0, -0.5, float("inf")]), g).float(),
                       torch.tensor([3.0, -0.5, float("inf")]))  # representable values stay


def test_small_updates_accumulate_where_round_to_nearest_loses_them():
    """lr 1e-3 for 200 Adam steps moves a weight at 1.0 to 0.8 in fp32; each step is below half a bf16 spacing, so
    torch's Adam on a bf16 parameter never moves it, the stochastic-rounding Adam does."""
    ours, theirs, ref = (nn.Parameter(torch.ones(256, dtype=dt)) for dt in (torch.bfloat16, torch.bfloat16, torch.float32))
    opts = [StochasticRoundingAdam([ours], lr=1e-3, seed=1), torch.optim.Adam([theirs], lr=1e-3),
            torch.optim.Adam([ref], lr=1e-3)]
    for _ in range(200):
        for p, opt in zip((ours, theirs, ref), opts):
            p.grad = torch.ones_like(p)
            opt.step()
    assert ref.mean().item() == pytest.approx(0.8, abs=1e-4)
    assert theirs.float().mean().item() == 1.0
    assert ours.float().mean().item() == pytest.approx(0.8, abs=3e-3)


@pytest.mark.parametrize("decoupled", [False, True])
def test_the_update_is_adams_to_within_the_rounding(decoupled):
    """Against torch's fp32 Adam / AdamW from the same (bf16-representable) start and gradients: after 8 steps with
    weight decay every weight is within a few bf16 spacings (the rounding's random walk), on average within one."""
    torch.manual_seed(0)
    start = torch.randn(64, 32).bfloat16()
    grads = [torch.randn(64, 32) for _ in range(8)]
    p16, p32 = nn.Parameter(start.clone()), nn.Parameter(start.float())
    ours = StochasticRoundingAdam([p16], lr=3e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1, decoupled=decoupled)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    ref = cls([p32], lr=3e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    for g in grads:
        p16.grad, p32.grad = g.bfloat16(), g.bfloat16().float()
        ours.step(), ref.step()
    # at least one bf16 spacing of each weight along its path (start or end, whichever is larger)
    spacing = 2.0**-7 * torch.maximum(p32.detach().abs(), start.float().abs()).clamp_min(2.0**-6)
    moved = (p32.detach() - start.float()).abs()
    err = (p16.detach().float() - p32.detach()).abs()
    assert (moved / spacing).mean() > 10  # the weights moved far more than the tolerance
    assert (err <= 6 * spacing).all() and (err / spacing).mean() < 1


def test_cpu_linears_compute_in_fp32_and_save_no_fp32_weight():
    torch.manual_seed(0)
    lin = nn.Linear(48, 40).bfloat16()
    ref = nn.Linear(48, 40)
    ref.load_state_dict({k: v.float() for k, v in lin.state_dict().items()})
    upcast_linears(lin)
    x = torch.randn(3, 5, 48, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = lin(x)
    assert y.dtype == torch.float32 and torch.allclose(y, ref(x), atol=1e-5)
    assert not any(t.dtype == torch.float32 and t.shape == lin.weight.shape for t in saved)  # the bf16 weight only
    gy = torch.randn_like(y)
    y.backward(gy)
    gx = x.grad.clone()
    x.grad = None
    ref(x).backward(gy)
    assert torch.allclose(gx, x.grad, atol=1e-5)
    assert lin.weight.grad.dtype == torch.bfloat16 and torch.equal(lin.weight.grad, ref.weight.grad.bfloat16())
    assert torch.equal(lin.bias.grad, ref.bias.grad.bfloat16())
    assert torch.allclose(F.linear(x, ref.weight, ref.bias), lin(x), atol=1e-5)


def _optimizer_tensors(ckpt):
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)["state"]
    return [t for s in state.values() for k, t in s.items() if k != "step"]


def test_finetune_dtype_bf16_stores_bf16_only_learns_and_resumes_exactly(tmp_path):
    base = tmp_path / "base"
    train(from_preset("tiny", scheme="lns", n_layers=3, d_model=32, n_heads=2, d_ff=64),
          TrainConfig(data="builtin", tokenizer="bytes", steps=2, seq_len=32, batch_size=2, eval_tokens=256), base,
          quiet=True)
    args = ["finetune", str(base), "--data", "builtin-sft", "--steps", "6", "--batch-size", "2", "--seq-len", "256",
            "--lr", "3e-3", "--ckpt-every", "3", "--eval-every", "6", "-q", "--dtype", "bf16", "--out"]
    assert main([*args, str(tmp_path / "full")]) == 0
    ckpt = sorted((tmp_path / "full" / "checkpoint").glob("step-*"))[-1]
    weights = load_file(str(ckpt / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert {t.dtype for t in _optimizer_tensors(ckpt)} == {torch.bfloat16}
    before = load_file(str(sorted((base / "checkpoint").glob("step-*"))[-1] / "model.safetensors"))
    assert max(float((weights[k].float() - v.bfloat16().float()).abs().max()) for k, v in before.items()) > 1e-2
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    fp32 = finetune(base, TrainConfig(data="builtin-sft", pack=False, steps=6, batch_size=2, seq_len=256, lr=3e-3, ckpt_every=3,
                                      eval_every=6, variance_every=0), tmp_path / "fp32", quiet=True)
    assert abs(full["eval_loss"] - fp32["eval_loss"]) < 0.05  # the same fine-tuning, to bf16's precision
    assert json.loads((tmp_path / "full" / "config.json").read_text())["train"]["weights"] == "bf16"

    assert main([*args, str(tmp_path / "half")]) == 0
    ckpts = sorted((tmp_path / "half" / "checkpoint").glob("step-*"))
    shutil.rmtree(ckpts[-1])  # as if killed after step 3
    assert main(["finetune", "--resume", str(tmp_path / "half"), "-q"]) == 0
    again = load_file(str(sorted((tmp_path / "half" / "checkpoint").glob("step-*"))[-1] / "model.safetensors"))
    for k, v in weights.items():
        assert torch.equal(v, again[k]), k


def test_bf16_weights_refuse_what_they_cannot_run_with(capsys):
    for extra, bad in ((["--dtype", "fp32"], "dtype 'fp32'"), (["--compile"], "compile True")):
        assert main(["train", "--preset", "tiny", "--weights", "bf16", *extra, "--out", "/nonexistent/x"]) == 2
        err = capsys.readouterr().err.strip()
        assert "weights bf16 does not run with" in err and bad in err and "\n" not in err
