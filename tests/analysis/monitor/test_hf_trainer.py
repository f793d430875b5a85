"""End to end: a real ``transformers.Trainer`` run of a tiny Llama with LNS, depth tracked by
``DepthMonitorCallback`` through the Trainer's reporters (log_history, TensorBoard, W&B offline), and the
series equal ``diagnose`` of the saved checkpoint on the same batch. The run is the README's code
(examples/monitor_hf_trainer.py)."""

import contextlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from monitor_readers import need, tb_scalars, wandb_history

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
from depthlab.analysis.diagnostics.heldout import TextBatches
from depthlab.analysis.diagnostics.probes import depth_probe
from depthlab.analysis.monitor import block_tag

ROOT = Path(__file__).resolve().parents[3]
SEQ, ROWS, STEPS, EVERY, L = 32, 4, 5, 2, 4
TINY = ["--layers", str(L), "--hidden", "32", "--heads", "2", "--ffn", "64", "--tokenizer", "bpe:512",
        "--seq-len", str(SEQ), "--batch", "4", "--steps", str(STEPS), "--every", str(EVERY),
        "--probe-rows", str(ROWS), "--train-rows", "64"]


def example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")  # the test configures W&B; the library reads no environment
    mp.setenv("WANDB_DIR", str(out))
    mp.setenv("WANDB_PROJECT", "depthlab-test")
    reporters = ",".join(r for r in ("tensorboard", "wandb") if importlib.util.find_spec(r))
    console = io.StringIO()
    try:
        with contextlib.redirect_stdout(console):  # what the Trainer prints
            trainer = example("monitor_hf_trainer").main([*TINY, "--out", str(out), "--report-to", reporters or "none"])
        import wandb

        wandb.finish()
    finally:
        mp.undo()
    trainer.console = console.getvalue()
    return trainer, out


def test_the_console_shows_the_deepest_third_curves_not_every_block(hf_run):
    """The Trainer prints each log dict: a probe's is its 5 deepest-third curves, not 5 L per-block scalars
    (which log_history keeps)."""
    trainer, _ = hf_run
    printed = [l for l in trainer.console.splitlines() if "depth_deepest_third/angular" in l]
    assert len(printed) == 4  # steps 0, 2, 4, 5
    assert all("depth/angular/block_" not in l and l.count(":") <= 10 for l in printed)
    assert block_tag("layer_angular", 1, L) in probes(trainer)[STEPS]


def probes(trainer):
    return {h["step"]: h for h in trainer.state.log_history if block_tag("layer_angular", 1, L) in h}


def test_the_callback_logs_every_nth_step_the_start_and_the_last(hf_run):
    trainer, _ = hf_run
    got = probes(trainer)
    assert sorted(got) == [0, 2, 4, 5]
    for h in got.values():
        assert all(block_tag(q, b, L) in h for q in ("angular", "contribution", "variance", "norm_gain")
                   for b in range(1, L + 1))
        assert "depth_deepest_third/angular" in h
    assert [s for s, h in got.items() if block_tag("layer_removal", L, L) in h] == [0, 5]  # start, last (every 4th: 8)
    # the gradient norms, kept before the Trainer's zero_grad: after each step, none before the first
    assert [s for s, h in got.items() if block_tag("layer_grad_norm", 1, L) in h] == [2, 4, 5]
    assert all(got[5][block_tag("layer_grad_norm", b, L)] > 0 for b in range(1, L + 1))


def test_the_last_probe_equals_diagnose_of_the_saved_checkpoint_on_the_same_batch(hf_run):
    trainer, out = hf_run
    last = probes(trainer)[STEPS]
    target = load_target(str(out / "model"))
    assert target.model.config.layernorm_scaling  # the LNS model came back as LNS
    opts = DiagnoseOptions(data="builtin", tokens=ROWS * SEQ, seq_len=SEQ, batch_size=ROWS, jacobian=False,
                           progress=False)
    x, y = next(iter(TextBatches(target, opts)))
    report = diagnose(target, opts)
    assert report["data"]["tokens"] == ROWS * SEQ
    blocks = range(1, L + 1)
    tracked = [last[block_tag("layer_angular", b, L)] for b in blocks]
    assert tracked == pytest.approx(report["angular"]["adjacent"], abs=1e-5)
    assert [last[block_tag("layer_variance", b, L)] for b in blocks] == pytest.approx(
        report["variance"]["variance"][1:], rel=1e-5)
    assert [last[block_tag("layer_removal", b, L)] for b in blocks] == pytest.approx(
        report["removal"]["delta_loss"], abs=1e-5)
    assert [last[block_tag("layer_lens_loss", b, L)] for b in blocks] == pytest.approx(report["lens"]["loss"][1:], abs=1e-5)
    ref = depth_probe(target.model, x, y)  # diagnose has no contribution / norm gain: the tracking function
    for key in ("layer_contribution", "layer_norm_gain", "layer_lens_loss", "layer_lens_agreement"):
        assert [last[block_tag(key, b, L)] for b in blocks] == pytest.approx(ref[key], rel=1e-5)


@need("tensorboard")
def test_report_to_tensorboard_got_the_same_numbers(hf_run):
    trainer, out = hf_run
    scalars = tb_scalars(out / "runs")
    for step, h in probes(trainer).items():
        for tag in (block_tag("layer_angular", 3, L), block_tag("layer_removal", 2, L), "depth_deepest_third/variance"):
            if tag in h:  # HF's reporters prefix train/
                assert scalars[f"train/{tag}"][step] == np.float32(h[tag])


@need("wandb")
def test_report_to_wandb_offline_got_the_same_numbers(hf_run):
    trainer, out = hf_run
    rows = [r for r in wandb_history(out / "wandb") if f"train/{block_tag('layer_angular', 1, L)}" in r]
    by_step = {r["train/global_step"]: r for r in rows}
    for step, h in probes(trainer).items():
        for tag, value in h.items():
            if tag.startswith("depth"):
                assert by_step[step][f"train/{tag}"] == value


def test_a_callback_that_was_not_attached_says_how_to_attach_it(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from depthlab.analysis.monitor import DepthMonitorCallback
    from depthlab.base.errors import DepthlabError

    model = LlamaForCausalLM(LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2))
    rows = torch.randint(0, 20, (8, 9))
    data = [{"input_ids": r, "labels": r} for r in rows]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[DepthMonitorCallback(rows[:2], every=1)])
    with pytest.raises(DepthlabError, match=r"\.attach\(trainer\) before trainer.train\(\)"):
        trainer.train()
