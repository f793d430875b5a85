"""prune's export appears whole or not at all (kill -9 mid-export leaves no loadable half-checkpoint and the rerun
works), and LoRA healing works on a depthlab run as on an HF model."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import PRUNE_OPTS

from depthlab.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _argv(source: Path, out: Path) -> list[str]:
    return ["prune", str(source), "--blocks", "2", "--data", "builtin", "--tokens", "128", "--seq-len", "32",
            "--batch-size", "2", "--latency-tokens", "2", "--device", "cpu", "--no-progress", "--out", str(out)]


def test_kill_9_during_the_export_leaves_no_loadable_checkpoint_and_the_rerun_works(hf_dir, tmp_path, capsys):
    source, out = hf_dir("llama", 4), tmp_path / "pruned"
    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *_argv(source, out)], env={**os.environ,
                            "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob(".pruned.tmp-*/model.safetensors")):  # the weights are written: mid-export
        assert proc.poll() is None, f"prune ended before the kill: {proc.stderr.read().decode()[-500:]}"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()  # nothing loadable under --out: the half-written export is a hidden sibling
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pruned")] == [f".pruned.tmp-{proc.pid}"]

    assert main(_argv(source, out)) == 0  # the rerun is not refused and clears the dead writer's sibling
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".pruned")) == []
    assert {"config.json", "model.safetensors", "prune.json", "report.html"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "prune.json").read_text())
    assert report["removed_blocks"] == [2] and report["export"]["dir"] == str(out)
    assert report["export"]["max_abs_logit_diff"] < 1e-4


def test_lora_healing_of_a_depthlab_run_trains_merges_and_exports(tmp_path):
    from depthlab import from_preset
    from depthlab.prune import PruneOptions, prune_target
    from depthlab.prune.options import HealOptions
    from depthlab.targets import load_target
    from depthlab.train import TrainConfig, train

    model = from_preset("tiny", n_layers=3, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    train(model, TrainConfig(data="builtin", tokenizer="bytes", steps=2, seq_len=32, batch_size=2, eval_tokens=64,
                             device="cpu", track_depth=False), tmp_path / "run", quiet=True)
    target = load_target(str(tmp_path / "run"))
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    heal = HealOptions(steps=3, mode="lora", lr=1e-2, batch_size=2, seq_len=32, lora_rank=2, progress=False)
    report = prune_target(target, PruneOptions(**{**PRUNE_OPTS, "blocks": [2], "heal": heal}), tmp_path / "out")
    assert report["heal"]["mode"] == "lora" and len(report["heal"]["train_loss"]) == 3
    healed = load_target(report["run_dir"]).model  # a plain depthlab model again: adapters merged
    assert not any("lora" in k for k in healed.state_dict())
    changed = healed.state_dict()["blocks.1.attn.q_proj.weight"] - before["blocks.2.attn.q_proj.weight"]
    assert changed.abs().max() > 0  # the surviving block 3 (now 2nd) was healed through its merged adapter
    assert torch.equal(healed.state_dict()["embed.weight"], before["embed.weight"])  # LoRA leaves the rest
