"""The pieces the training loop is built from: LossOutput, Forward, train_step, Evaluator, open_run."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from depthlab import from_preset
from depthlab.base.errors import DepthlabError
from depthlab.base.metrics import element_variance
from depthlab.models.decoder import build_model
from depthlab.train import TrainConfig
from depthlab.train import distributed as D
from depthlab.train.evaluator import EvalResult, Evaluator
from depthlab.train.rundir import open_run
from depthlab.train.step import Forward, train_step


def _forward(n_layers: int = 2) -> tuple[torch.nn.Module, Forward]:
    torch.manual_seed(0)
    model = build_model(from_preset("tiny", n_layers=n_layers, d_model=32, n_heads=2, d_ff=64, vocab_size=50))
    module = D.wrap(model, D.DistEnv(), torch.device("cpu"))
    return model, Forward(module, torch.device("cpu"), contextlib.nullcontext)


def test_loss_module_returns_a_named_result():
    _, forward = _forward(n_layers=3)
    x = torch.randint(50, (2, 8))
    out = forward(x, x, hidden=True)
    assert isinstance(out, D.LossOutput) and out.loss.ndim == 0
    assert len(out.hidden_states) == 4  # embedding output, then blocks 1..3
    assert forward(x).hidden_states == () and float(forward(x).loss) == 0.0


def test_evaluator_is_deterministic_and_probes_every_block():
    _, forward = _forward(n_layers=3)
    batches = [torch.randint(50, (2, 9)) for _ in range(3)]
    ev = Evaluator(forward, batches, torch.cat(batches)[:4, :-1], D.DistEnv())
    first, again = ev.evaluate(), ev.evaluate()
    assert isinstance(first, EvalResult) and first == again
    assert first.tokens == 3 * 2 * 8 and first.ppl == pytest.approx(math.exp(first.loss))
    assert first.record(7) == {"step": 7, "eval_loss": first.loss, "eval_ppl": first.ppl, "eval_tokens": 48}
    probe = ev.probe()
    hidden = forward(ev.probe_batch, None, True).hidden_states
    assert probe["layer_variance"] == [element_variance(h) for h in hidden[1:]]
    assert forward.module.training  # evaluate / probe leave the module in train mode


class _Seqs:
    def __init__(self, x):
        self.x = x

    def rank_batch(self, step, batch_size, rank, world):
        return self.x, self.x.clone()


def test_train_step_updates_and_refuses_non_finite_loss():
    model, forward = _forward()
    cfg = TrainConfig(steps=4, lr=1e-2, batch_size=2, micro_batch_size=1, seq_len=8).resolve(model.cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    res = train_step(1, forward, model, opt, _Seqs(torch.randint(50, (2, 8))), cfg, D.DistEnv())
    assert res.step == 1 and res.tokens == 16 and math.isfinite(res.loss) and res.grad_norm is None
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    after = [p.detach().clone() for p in model.parameters()]
    res = train_step(2, forward, model, opt, _Seqs(torch.randint(50, (2, 8))), cfg, D.DistEnv())
    assert not math.isfinite(res.loss)
    assert all(torch.equal(a, b) or (a.isnan().all() and b.isnan().all()) for a, b in zip(after, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_open_run_writes_nothing(tmp_path):
    out = tmp_path / "run"
    run = open_run(from_preset("tiny", n_layers=2), TrainConfig(tokenizer="bytes", steps=2), out, False, D.DistEnv())
    assert run.model_cfg.vocab_size == run.tokenizer.vocab_size and run.cfg.tokenizer == "bytes"
    assert not out.exists()
    with pytest.raises(DepthlabError, match="no config.json"):
        open_run(from_preset("tiny"), TrainConfig(), out, True, D.DistEnv())


def test_is_main_process_reads_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert D.is_main_process()
    monkeypatch.setenv("RANK", "1")
    assert not D.is_main_process()
