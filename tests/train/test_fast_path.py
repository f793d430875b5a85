"""The fast path, proven where it runs: ``--compile``, ``--dtype bf16``, the fused Adam(W), ``diagnose --weights bf16``.

Every test runs on the CPU; the same tests run on CUDA under ``pytest -m gpu`` (skipped without a GPU),
with two more there: SDPA takes a flash or cuDNN kernel for the causal case, and a checkpoint written on
the GPU resumes on the CPU.

What compiles with what (one cold inductor compile of even this 2-block model costs ~50 s of CPU, most
of it g++ on the generated kernels): on the CPU ``lns`` compiles with inductor (the backend that fuses
and constant-folds, where a 1/sqrt(l) could get lost) and the resume tests reuse its cached kernels;
``pre`` compiles with ``aot_eager`` (the same dynamo capture and autograd graph, eager kernels). On CUDA
both use inductor.

Tolerances (stated once, used below):
- ``COMPILE_TOL``: |loss_compiled - loss_eager| per step over 20 steps. Inductor fuses and reorders fp32
  arithmetic, so the two differ by rounding (measured <= 2e-5 on the CPU); a dropped LNS factor or a
  stale weight moves the loss by > 1e-2 within a few steps (the test checks that pre and lns differ by
  far more than the tolerance, so the comparison can tell the schemes apart).
- ``BF16_TOL``: |loss_bf16 - loss_fp32| per step: bf16 keeps 8 mantissa bits (relative rounding 2^-9),
  autocast runs the matmuls in it; over 20 steps the per-step losses (about 5 nats, means over 128
  tokens) stay within 5e-3 nats (measured 9e-4), while pre and lns differ by 2e-2.
- ``ANGULAR_TOL`` and the removal ranking for ``diagnose --weights bf16`` (weights cast to bf16, not
  autocast): angular distances in [0, 1] agree within 0.01 (measured 1e-4); the blocks ordered by removal
  Δloss agree wherever their fp32 Δloss differ by more than ``REMOVAL_TIE`` nats (bf16 moves a Δloss by
  up to 3e-4 here).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from depthlab import from_preset
from depthlab.base.store.checkpoint import list_checkpoints, read_checkpoint
from depthlab.cli import main
from depthlab.train import TrainConfig, loop, train
from depthlab.train.optim import FUSED_DEVICES

COMPILE_TOL = {"cpu": 1e-4, "cuda": 1e-3}  # cuda: TF32/cuBLAS reductions differ more between kernels
EXACT_TOL = {"cpu": 0.0, "cuda": 1e-5}  # a resume within one mode: bit-exact on the CPU
BF16_TOL = 5e-3
ANGULAR_TOL = 0.01
REMOVAL_TIE = 2e-3

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def small_model(scheme: str):
    """The tiny preset shrunk: 2 blocks of width 32 (one inductor compile costs ~30-80 s of CPU)."""
    return from_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, scheme=scheme)


def small_train(device: str, **kw) -> TrainConfig:
    base = dict(data="builtin", tokenizer="bytes", steps=20, batch_size=4, seq_len=32, eval_tokens=512,
                eval_every=10, variance_every=10, log_every=1, ckpt_every=10, keep_last=2, lr=3e-3, device=device,
                dtype="fp32")
    return TrainConfig(**{**base, **kw})


class Runs:
    """Training runs shared by this module's tests, each trained once: ``runs.get(scheme, device, **train)``
    -> (run dir, {step: loss}, summary)."""

    def __init__(self, root: Path) -> None:
        self.root, self.done = root, {}

    def get(self, scheme: str, device: str, **kw):
        key = (scheme, device, tuple(sorted(kw.items())))
        if key not in self.done:
            out = self.root / f"run{len(self.done)}"
            self.done[key] = (out, *self._train(scheme, device, out, False, kw))
        return self.done[key]

    @staticmethod
    def _train(scheme: str, device: str, out: Path, resume: bool, kw: dict):
        losses = {}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(loop, "compile_for_training", lambda m: torch.compile(m, backend=backend(scheme, device)))
            summary = train(small_model(scheme), small_train(device, **kw), out, resume=resume, quiet=True,
                            progress=lambda r: losses.__setitem__(r["step"], r["loss"]))
        return losses, summary

    def resumed(self, source: Path, at: int, scheme: str, device: str, **kw):
        """A copy of run ``source`` cut back to its step-``at`` checkpoint, resumed with ``kw`` (compile,
        dtype, device may differ): (run dir, {step: loss} of the resumed steps, summary)."""
        out = self.root / f"resumed{len(list(self.root.iterdir()))}"
        shutil.copytree(source, out)
        for ckpt in list_checkpoints(out):
            if int(ckpt.name.split("-")[1]) > at:
                shutil.rmtree(ckpt)
        return (out, *self._train(scheme, device, out, True, kw))


def backend(scheme: str, device: str) -> str:
    """The torch.compile backend of this module's compiled runs (see the module docstring)."""
    return "aot_eager" if device == "cpu" and scheme == "pre" else "inductor"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("fast_path"))


def max_gap(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(a[s] - b[s]) for s in a)


def checkpoint_tensors(run: Path, step: int) -> dict:
    ckpt = next(c for c in list_checkpoints(run) if c.name == f"step-{step:08d}")
    return read_checkpoint(ckpt)


# ------------------------------------------------------------------------------ --compile
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", ["pre", "lns"])
def test_compiled_loss_curve_matches_eager(runs, scheme, device):
    _, eager, s_eager = runs.get(scheme, device)
    _, compiled, s_comp = runs.get(scheme, device, compile=True)
    assert sorted(compiled) == list(range(1, 21))
    assert max_gap(compiled, eager) < COMPILE_TOL[device]
    assert abs(s_comp["eval_loss"] - s_eager["eval_loss"]) < COMPILE_TOL[device]
    # the tolerance tells the schemes apart: LNS's 1/sqrt(l) moves the curve by far more than it
    _, other, _ = runs.get("lns" if scheme == "pre" else "pre", device)
    assert max_gap(other, eager) > 10 * COMPILE_TOL[device]


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_checkpoint_resumes_in_eager_and_back(runs, device):
    c_dir, compiled, s_comp = runs.get("lns", device, compile=True)
    e_dir, eager, s_eager = runs.get("lns", device)
    # the same state-dict keys whatever the mode: the model's own names, no torch.compile prefix
    c_state, e_state = checkpoint_tensors(c_dir, 10), checkpoint_tensors(e_dir, 10)
    assert set(c_state["model"]) == set(e_state["model"]) == set(small_model_keys())
    assert not any("_orig_mod" in k for k in c_state["model"])
    assert c_state["optimizer"]["param_groups"][0]["params"] == e_state["optimizer"]["param_groups"][0]["params"]
    # compiled -> eager, eager -> compiled: steps 11..20, on the compiled-vs-eager tolerance of the straight runs
    ce_dir, ce, s_ce = runs.resumed(c_dir, 10, "lns", device, compile=False)
    ec_dir, ec, s_ec = runs.resumed(e_dir, 10, "lns", device, compile=True)
    later = {s: v for s, v in compiled.items() if s > 10}
    assert sorted(ce) == sorted(ec) == list(range(11, 21))
    assert max_gap(ce, later) < COMPILE_TOL[device]
    assert max_gap(ec, {s: v for s, v in eager.items() if s > 10}) < COMPILE_TOL[device]
    assert s_ce["tokens"] == s_ec["tokens"] == s_comp["tokens"] == 20 * 4 * 32
    assert set(checkpoint_tensors(ce_dir, 20)["model"]) == set(checkpoint_tensors(ec_dir, 20)["model"])
    # within one mode the continuation is exact: compiled -> compiled repeats the straight compiled run (on CUDA
    # to the rounding of its non-deterministic kernels, e.g. the embedding backward's atomic adds)
    _, cc, s_cc = runs.resumed(c_dir, 10, "lns", device, compile=True)
    assert max_gap(cc, later) <= EXACT_TOL[device] and abs(s_cc["eval_loss"] - s_comp["eval_loss"]) <= EXACT_TOL[device]


def small_model_keys():
    from depthlab import build_model

    return build_model(small_model("lns").replace(vocab_size=258)).state_dict().keys()


# ------------------------------------------------------------------------------ --dtype bf16
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_keeps_fp32_master_weights_and_tracks_fp32(runs, device):
    f_dir, fp32, s32 = runs.get("lns", device)
    b_dir, bf16, s16 = runs.get("lns", device, dtype="bf16")
    assert max_gap(bf16, fp32) < BF16_TOL
    assert max_gap(bf16, fp32) > 0  # autocast did run: bf16 matmuls round differently
    assert abs(s16["eval_loss"] - s32["eval_loss"]) < BF16_TOL
    _, pre, _ = runs.get("pre", device)
    assert max_gap(pre, fp32) > 2 * BF16_TOL  # the tolerance still tells the schemes apart
    state = checkpoint_tensors(b_dir, 20)
    assert {t.dtype for t in state["model"].values()} == {torch.float32}
    moments = [v for s in state["optimizer"]["state"].values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    config = json.loads((b_dir / "config.json").read_text())
    assert config["train"]["dtype"] == "bf16"


# ------------------------------------------------------------------------------ fused Adam(W)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer,decay", [("adam", 0.0), ("adamw", 0.1), ("adam", 0.01)])
def test_fused_adam_matches_foreach(device, optimizer, decay):
    """The trainer's optimizer (fused where torch has the kernel) against torch's foreach implementation:
    the same weights after 10 steps of the same gradients, to fp32 rounding."""
    from depthlab.train.optim import build_optimizer

    dev = torch.device(device)
    assert dev.type in FUSED_DEVICES
    cfg = small_train(device, optimizer=optimizer, weight_decay=decay)
    gen = torch.Generator().manual_seed(1)
    shapes = [(64, 32), (32,), (258, 32), (7, 3, 5)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    fused_params = torch.nn.ParameterList(torch.nn.Parameter(t.clone().to(dev)) for t in start)
    ref_params = [torch.nn.Parameter(t.clone().to(dev)) for t in start]
    fused = build_optimizer(fused_params, cfg, dev)
    assert fused.defaults.get("fused") is True
    cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    ref = cls(ref_params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, weight_decay=decay, foreach=True)
    for _ in range(10):
        grads = [torch.randn(s, generator=gen).to(dev) for s in shapes]
        for ps, opt in ((fused_params, fused), (ref_params, ref)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
    for a, b, s in zip(fused_params, ref_params, start):
        assert not torch.equal(a.detach().cpu(), s)  # the weights did move (by ~10 * lr)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ diagnose --weights bf16
@pytest.fixture(scope="module")
def deep_run(tmp_path_factory):
    """A 6-block LNS model trained 30 steps: blocks that differ in what they do, so removal has an order."""
    out = tmp_path_factory.mktemp("diag") / "run"
    cfg = from_preset("tiny", n_layers=6, d_model=48, n_heads=4, d_ff=96, scheme="lns")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as conftest's per-test fixture does, which has not run yet for a module fixture
    try:
        train(cfg, small_train("cpu", steps=30, eval_every=0, variance_every=0, ckpt_every=0), out, quiet=True)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_diagnose_bf16_agrees_with_fp32(deep_run, tmp_path, device, capsys):
    reports = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / dtype
        assert main(["diagnose", str(deep_run), "--device", device, "--weights", dtype, "--tokens", "1024",
                     "--seq-len", "64", "--no-jacobian", "--out", str(out)]) == 0
        reports[dtype] = json.loads((out / "report.json").read_text())
    f, b = reports["fp32"], reports["bf16"]
    assert (f["model"]["dtype"], b["model"]["dtype"]) == ("float32", "bfloat16")
    ang_f, ang_b = (torch.tensor(_rows(r["angular"]["matrix"])) for r in (f, b))
    assert ang_f.shape == ang_b.shape and (ang_f - ang_b).abs().max() < ANGULAR_TOL
    assert (ang_f - ang_b).abs().max() > 0  # the bf16 pass did run in bf16
    df, db = f["removal"]["delta_loss"], b["removal"]["delta_loss"]
    for i in range(len(df)):
        for j in range(len(df)):
            if df[i] - df[j] > REMOVAL_TIE:  # block i clearly costs more than block j in fp32 ...
                assert db[i] > db[j], (i, j, df, db)  # ... and so it does in bf16
    assert max(df) - min(df) > 2 * REMOVAL_TIE  # the ranking is not all ties


def _rows(matrix):
    """The angular matrix as a rectangle (rows of unequal length padded with zeros)."""
    width = max(len(r) for r in matrix)
    return [[0.0 if v is None else v for v in r] + [0.0] * (width - len(r)) for r in matrix]


# ------------------------------------------------------------------------------ GPU only
@pytest.mark.gpu
def test_sdpa_takes_flash_or_cudnn_for_the_causal_case():
    """Inside sdpa_kernel(FLASH, CUDNN) SDPA raises when neither kernel accepts the call: a forward and
    backward of a model in bf16 autocast that completes shows the causal attention took one of them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from depthlab import build_model

    model = build_model(from_preset("tiny", scheme="lns"), device="cuda")
    ids = torch.randint(model.cfg.vocab_size, (2, 256), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids, labels=ids)
        out.loss.backward()
    assert torch.isfinite(out.loss)


@pytest.mark.gpu
def test_checkpoint_written_on_gpu_resumes_on_cpu(runs):
    g_dir, gpu, _ = runs.get("lns", "cuda")
    _, cpu_after, summary = runs.resumed(g_dir, 10, "lns", "cpu")
    assert sorted(cpu_after) == list(range(11, 21))
    assert max_gap(cpu_after, {s: v for s, v in gpu.items() if s > 10}) < COMPILE_TOL["cuda"]
    assert summary["tokens"] == 20 * 4 * 32


# ------------------------------------------------------------------------------ the defaults (auto compile)
def test_compile_auto_rule_and_plan_line(monkeypatch):
    """--compile unset: compiled on a CPU (with a C++ compiler) from CPU_COMPILE_TOKENS training tokens, eager
    below; on CUDA from CUDA_COMPILE_FLOPS training FLOPs (6 x params x tokens), eager below; a given --compile /
    --no-compile always wins; never with bf16 weights; the one-line plan says which and why."""
    from depthlab.train import step as S

    monkeypatch.setattr(S.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(S, "has_triton", lambda: True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    long = small_train("cpu", steps=S.CPU_COMPILE_TOKENS // (4 * 32))  # exactly the threshold
    short = small_train("cpu", steps=long.steps - 1)
    assert S.choose_compile(long, cpu) and not S.choose_compile(short, cpu)
    assert not S.choose_compile(long.replace(compile=False), cpu) and S.choose_compile(short.replace(compile=True), cpu)
    # CUDA: llama-130m's 134M parameters are compiled from ~25M tokens, a 10x larger model from ~2.5M
    n = 134_000_000
    at = int(S.CUDA_COMPILE_FLOPS / (6 * n)) // (4 * 32) + 1  # steps that just reach the threshold
    assert S.choose_compile(small_train("cuda", steps=at), cuda, n)
    assert not S.choose_compile(small_train("cuda", steps=at - 1), cuda, n)
    assert S.choose_compile(small_train("cuda", steps=at // 10 + 1), cuda, 10 * n)
    assert not S.choose_compile(small_train("cuda", steps=10**6, compile=False), cuda, n)
    assert not S.choose_compile(small_train("cuda", steps=10**6, weights="bf16"), cuda, n)
    assert 20e6 < S.CUDA_COMPILE_FLOPS / (6 * n) < 30e6  # the H200 measurement's break-even (step.py)
    monkeypatch.setattr(S.shutil, "which", lambda name: None)  # no C++ compiler: inductor cannot run on a CPU
    assert not S.choose_compile(long, cpu) and S.choose_compile(small_train("cuda", steps=at), cuda, n)
    monkeypatch.setattr(S, "has_triton", lambda: False)  # no Triton: inductor cannot run on CUDA
    assert not S.choose_compile(small_train("cuda", steps=at), cuda, n)
    plan = S.execution_plan(long.replace(compile=True), cpu, compile_auto=True)
    assert plan.startswith("cpu, fp32, compiled (auto: 4.0M tokens") and plan.endswith("fused adam")
    plan = S.execution_plan(small_train("cuda", steps=at, compile=True, dtype="auto"), cuda, True, n)
    assert plan.startswith("cuda, bf16 autocast (fp32 weights), compiled (auto: 2.0e+16 training FLOPs")
    assert "1.59x eager" in plan and plan.endswith("fused adam")
    bf16 = S.execution_plan(short.replace(compile=False, dtype="bf16"), cpu)
    assert bf16 == "cpu, bf16 autocast (fp32 weights), eager, fused adam"


# ------------------------------------------------------------------------------ no host sync per step
def test_deferred_losses_give_the_same_run(tmp_path):
    """The loop reads the losses only at steps that owe something (here every 7th step, and the checkpoints): the
    same losses and the same final weights as reading them after every step."""
    kw = dict(steps=12, eval_every=0, variance_every=0, ckpt_every=6, optimizer="adamw", weight_decay=0.1)
    every, few = {}, {}
    for log_every, losses in ((1, every), (7, few)):
        out = tmp_path / f"log{log_every}"
        train(small_model("lns"), small_train("cpu", log_every=log_every, **kw), out, quiet=True,
              progress=lambda r, losses=losses: losses.__setitem__(r["step"], r["loss"]))
    assert sorted(every) == sorted(few) == list(range(1, 13)) and every == few
    a, b = (checkpoint_tensors(tmp_path / f"log{n}", 12) for n in (1, 7))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_a_non_finite_loss_stops_the_updates_before_the_loop_reads_it(tmp_path, monkeypatch):
    """Step 4's loss is NaN, and the loop reads losses only at step 6 (a checkpoint): TrainingDiverged names step 4,
    and the model holds the weights of step 3's checkpoint (neither step 4 nor step 5 updated anything)."""
    import depthlab.models.decoder as models  # the LM family builds through depthlab.models.decoder.build_model

    real_build, built, calls = models.build_model, [], {"n": 0}

    def poisoned_build(cfg, device=None):
        model = real_build(cfg, device)
        built.append(model)

        def hook(module, _inputs, out):  # the 4th training forward (step 4) returns NaN logits
            if module.training:
                calls["n"] += 1
                if calls["n"] == 4:
                    return out * float("nan")
            return out

        model.lm_head.register_forward_hook(hook)
        return model

    monkeypatch.setattr(models, "build_model", poisoned_build)
    cfg = small_train("cpu", steps=8, log_every=100, eval_every=0, variance_every=0, ckpt_every=3)
    with pytest.raises(loop.TrainingDiverged, match="at step 4") as err:
        train(small_model("pre"), cfg, tmp_path / "run", quiet=True)
    assert err.value.step == 4 and err.value.checkpoint.name == "step-00000003"
    assert calls["n"] == 6  # steps 5 and 6 ran (nothing read their losses yet) ...
    saved = checkpoint_tensors(tmp_path / "run", 3)["model"]
    for key, value in built[-1].state_dict().items():  # ... and updated nothing
        assert torch.equal(value, saved[key]), key


@pytest.mark.gpu
def test_a_training_step_never_waits_for_the_gpu():
    """torch's sync debug mode raises on any host-device synchronisation: three steps of the trainer (fused AdamW,
    bf16 autocast, gradient clipping) queue without one; reading the losses afterwards is the one sync."""
    from depthlab import build_model
    from depthlab.train import distributed as D
    from depthlab.train.optim import build_optimizer
    from depthlab.train.step import Forward, autocast_for, read_results, train_step

    device = torch.device("cuda", torch.cuda.current_device())
    model = build_model(small_model("lns"), device=device)
    cfg = small_train("cuda", optimizer="adamw", dtype="bf16", grad_clip=1.0, batch_size=4, micro_batch_size=2
                      ).resolve(model.cfg)
    forward = Forward(D.LMLoss(model), device, autocast_for(cfg, device))
    optimizer = build_optimizer(model, cfg, device)

    class Batches:
        def rank_batch(self, step, batch_size, rank, world):
            gen = torch.Generator().manual_seed(step)
            ids = torch.randint(model.cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=gen)
            return ids[:, :-1], ids[:, 1:]

    train_step(1, forward, model, optimizer, Batches(), cfg, D.DistEnv())  # the first step allocates the state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [train_step(step, forward, model, optimizer, Batches(), cfg, D.DistEnv()) for step in (2, 3, 4)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(r.deferred for r in results)
    assert all(math.isfinite(loss) and norm is not None for loss, norm in read_results(results))
