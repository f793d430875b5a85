"""Streamed pruning chooses what the in-memory pruning chooses and writes, shard by shard, a checkpoint that plain
transformers loads with the in-memory pruned model's logits and cached generate."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny_models import hf_dir, save_hf, tiny_hf

from depthlab.analysis.diagnostics import load_target
from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.hf.tiny import byte_tokenizer
from depthlab.prune import PruneOptions, prune_target
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _same_checkpoints(a, b, vocab: int = 300) -> None:
    """Two HF checkpoints: same config shape, same logits, same greedy generation with the KV cache."""
    from transformers import AutoModelForCausalLM

    ma, mb = (AutoModelForCausalLM.from_pretrained(str(p)).eval() for p in (a, b))
    assert ma.config.num_hidden_layers == mb.config.num_hidden_layers
    assert getattr(ma.config, "layer_types", None) == getattr(mb.config, "layer_types", None)
    ids = torch.randint(0, vocab, (2, 20), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        torch.testing.assert_close(mb(input_ids=ids).logits, ma(input_ids=ids).logits, rtol=0, atol=1e-5)
        assert torch.equal(ma.generate(ids[:1, :5], use_cache=True, **kw), mb.generate(ids[:1, :5], use_cache=True, **kw))


def _both(path, tmp_path, **kw):
    opts = PruneOptions(**{**OPTS, **kw})
    mem = prune_target(load_target(str(path)), opts, tmp_path / "mem")
    streamed = prune_target(open_streamed(str(path)), opts, tmp_path / "streamed")
    return mem, streamed


@pytest.mark.parametrize("kind, kw", [("llama", {"method": "angular-block", "remove": 2}),
                                      ("qwen2-tied", {"method": "removal", "remove": 2}),
                                      ("qwen2-mixed", {"method": "influence", "budget": 0.05}),
                                      ("llama-lns", {"method": "angular-block", "remove": 1})])
def test_streamed_prune_equals_in_memory(tmp_path, kind, kw):
    path = hf_dir(tmp_path, kind, 5)
    mem, streamed = _both(path, tmp_path, **kw)
    assert streamed["removed_blocks"] == mem["removed_blocks"] and streamed["kept_blocks"] == mem["kept_blocks"]
    assert streamed["selection"]["joint_loss"] == pytest.approx(mem["selection"]["joint_loss"], abs=1e-5)
    for stage in ("original", "pruned"):
        assert streamed["loss"][stage] == pytest.approx(mem["loss"][stage], abs=1e-5)
    assert streamed["cost"] == mem["cost"]
    if "greedy_path" in mem["selection"]:
        for a, b in zip(mem["selection"]["greedy_path"], streamed["selection"]["greedy_path"]):
            assert a["block"] == b["block"] and a["candidates"] == pytest.approx(b["candidates"], abs=1e-5)
    exp = streamed["export"]
    assert exp["loaded_with"].startswith("transformers") and exp["generate_cache_matches_no_cache"]
    assert exp["max_abs_logit_diff"] < 1e-5 and exp["max_abs_logit_diff_vs_skipping_in_original"] < 1e-5
    assert exp["written"]["lns_folded"] == (kind == "llama-lns")
    saved = json.loads((tmp_path / "streamed" / "config.json").read_text())
    assert "layernorm_scaling" not in saved and saved["depthlab"]["removed_blocks"] == mem["removed_blocks"]
    _same_checkpoints(tmp_path / "mem", tmp_path / "streamed")
    assert not (tmp_path / ".streamed.stream-state").exists() and not list(tmp_path.glob(".streamed.tmp-*"))


def test_a_sharded_checkpoint_is_cut_shard_by_shard(tmp_path):
    path = save_hf(tiny_hf("llama", 6), tmp_path / "sharded", max_shard_size="60KB")
    n_in = len(list(path.glob("*.safetensors")))
    assert n_in >= 3 and (path / "model.safetensors.index.json").is_file()
    mem, streamed = _both(path, tmp_path, blocks=[2, 5])
    out = tmp_path / "streamed"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == sorted(p.name for p in out.glob("*.safetensors")) and 1 < len(files) <= n_in
    assert not any(".layers.4." in k or ".layers.5." in k for k in index["weight_map"])  # renumbered 0..3
    assert streamed["export"]["written"]["bytes"] == index["metadata"]["total_size"]
    _same_checkpoints(tmp_path / "mem", out)


def test_streamed_prune_refuses_before_writing(tmp_path, monkeypatch, capsys):
    import depthlab.prune.shards as shards

    path = hf_dir(tmp_path, "llama", 3)
    argv = ["prune", str(path), "--remove", "1", "--stream", "--tokens", "64", "--seq-len", "32", "--no-progress"]
    assert main([*argv, "--heal-steps", "2", "--out", str(tmp_path / "a")]) == 2
    assert "--heal full trains every weight" in capsys.readouterr().err  # a streamed model heals with LoRA
    assert main(["prune", "preset:tiny", "--remove", "1", "--stream", "--out", str(tmp_path / "b")]) == 2
    assert "cannot stream 'preset:tiny'" in capsys.readouterr().err
    monkeypatch.setattr(shards.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(DepthlabError, match="not enough disk for the pruned checkpoint"):
        prune_target(open_streamed(str(path)), PruneOptions(**OPTS, remove=1), tmp_path / "c")
    assert not list((tmp_path / "c").glob("*.safetensors"))


def test_prune_cli_streams_and_says_so(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = hf_dir(tmp_path, "llama", 4)
    out = tmp_path / "pruned"
    assert main(["prune", str(path), "--remove", "1", "--method", "angular-block", "--stream", "--out", str(out),
                 "--tokens", "64", "--seq-len", "32", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("prune on cpu: engine: streamed, one layer at a time (streaming on; the model needs")
    assert "generate with KV cache ok" in printed
    rep = json.loads((out / "prune.json").read_text())
    assert rep["engine"]["name"] == "streamed" and rep["latency"] is None and rep["n_layers"]["pruned"] == 3
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 3
    assert AutoTokenizer.from_pretrained(out).encode("In the beginning") == byte_tokenizer().encode("In the beginning")


_KILLED = """
import os, signal, sys, torch
from pathlib import Path
sys.path.insert(0, {src!r})
torch.set_num_threads(1)
from depthlab.prune import PruneOptions, prune_target
from depthlab.targets.stream.sweep import SweepSettings

def on_layer(name, group, layer):
    if name == "greedy-2" and layer == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no cleanup of any kind

opts = PruneOptions(method="removal", remove=2, stream=True, data="builtin", tokens=96, seq_len=32, batch_size=2,
                    progress=False)
prune_target({path!r}, opts, Path({out!r}), settings=SweepSettings(progress=False, on_layer=on_layer))
"""


def test_a_streamed_prune_killed_mid_sweep_resumes_with_the_same_choice(tmp_path):
    """``prune --stream`` killed with kill -9 in its second greedy step: the same command continues (the survey and
    the first step from their saved results, the second after its last saved layer) and chooses, writes and reports
    what an uninterrupted run does; its resume state goes once the checkpoint is published."""
    from depthlab.targets.stream.resume import state_dir

    path, out = hf_dir(tmp_path, "llama", 5), tmp_path / "pruned"
    src = str(Path(__file__).resolve().parents[2] / "src")
    code = textwrap.dedent(_KILLED.format(src=src, path=str(path), out=str(out)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (state_dir(out) / "greedy-2").is_dir() and not out.exists()
    assert main(["prune", str(path), "--method", "removal", "--remove", "2", "--stream", "--out", str(out),
                 "--tokens", "96", "--seq-len", "32", "--batch-size", "2", "--no-progress"]) == 0
    rep = json.loads((out / "prune.json").read_text())
    resumed = {r["pass"]: r["layer"] for r in rep["engine"]["resumed"]}
    assert resumed == {"survey": 6, "greedy-1": 6, "greedy-2": 2}  # finished passes: L + 1; greedy-2: its layer 2
    assert not state_dir(out).exists()
    whole = prune_target(str(path), PruneOptions(**{**OPTS, "latency_tokens": 16}, method="removal", remove=2,
                                                 stream=True), tmp_path / "whole")
    assert rep["removed_blocks"] == whole["removed_blocks"] and rep["loss"] == whole["loss"]
    assert rep["selection"]["greedy_path"] == whole["selection"]["greedy_path"]


@pytest.mark.slow
def test_streamed_prune_of_smollm2_equals_in_memory(smollm2_dir, tmp_path):
    """SmolLM2-135M: the streamed angular-block choice is the in-memory survey's, and the checkpoint written shard
    by shard loads in transformers with the logits and cached generation of the model pruned in memory."""
    from transformers import AutoModelForCausalLM

    from depthlab.analysis.diagnostics.capture import capture_of
    from depthlab.prune import drop_layers
    from depthlab.prune.pipeline import held_out_batches
    from depthlab.prune.select import angular_block, survey_model

    opts = PruneOptions(**{**OPTS, "tokens": 32, "batch_size": 1}, method="angular-block", remove=6)
    streamed = prune_target(open_streamed(str(smollm2_dir)), opts, tmp_path / "streamed")
    target = load_target(str(smollm2_dir))
    survey = survey_model(capture_of(target), held_out_batches(target, opts))
    assert streamed["removed_blocks"] == angular_block(survey.angular, 6)
    assert streamed["loss"]["original"] == pytest.approx(survey.loss, abs=1e-5)
    pruned = drop_layers(target.model, streamed["removed_blocks"])
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "streamed")).eval()
    ids = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, pruned(input_ids=ids).logits, rtol=0, atol=1e-5)
        assert torch.equal(loaded.generate(ids[:, :8], use_cache=True, **kw), pruned.generate(ids[:, :8], use_cache=True,
                                                                                              **kw))
