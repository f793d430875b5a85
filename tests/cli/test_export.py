"""depthlab export: a training run becomes a vanilla HF checkpoint with the same logits."""

import subprocess
import sys

import pytest
import torch

import depthlab as d
from depthlab.train import TrainConfig, load_run, train


def _run(tmp_path, scheme):
    out = tmp_path / scheme
    cfg = d.from_preset("tiny", scheme=scheme, n_layers=3, d_model=32, n_heads=2, d_ff=64)
    train(cfg, TrainConfig(data="builtin", tokenizer="bpe:300", steps=2, seq_len=16, batch_size=2, eval_tokens=64,
                           device="cpu", cache_dir=str(tmp_path / "cache")), out, quiet=True)
    return out


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "depthlab", *args], capture_output=True, text=True)


def test_export_lns_run_loads_in_plain_transformers_with_same_logits_and_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = _run(tmp_path, "lns")
    proc = _cli("export", str(run), "--hf", str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    model, tok, _ = load_run(run)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "And God said, Let there be light"
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_export_refuses_post_ln_and_a_non_empty_target(tmp_path):
    run = _run(tmp_path, "post")
    proc = _cli("export", str(run), "--hf", str(tmp_path / "hf"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "scheme 'post' cannot be written" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("precious")
    proc = _cli("export", str(run), "--hf", str(tmp_path / "full"))
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("args, words", [
    (["export", "/nonexistent/run", "--hf", "x"], ["/nonexistent/run"]),
    (["frobnicate"], ["invalid choice", "frobnicate"]),
])
def test_cli_errors_are_one_line_exit_2(args, words):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    for w in words:
        assert w in proc.stderr


def test_export_carries_the_tokenizers_special_ids_and_generate_stops_at_its_eos(tmp_path):
    """Not LlamaConfig's bos=1 / eos=2: with the bpe tokenizer id 2 is an ordinary token."""
    import json

    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    run = _run(tmp_path, "pre")
    assert _cli("export", str(run), "--hf", str(tmp_path / "hf")).returncode == 0
    _, tok, _ = load_run(run)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((tmp_path / "hf" / name).read_text())
        assert cfg["eos_token_id"] == tok.eos_id and cfg["pad_token_id"] == tok.pad_id, name
        assert cfg.get("bos_token_id") != 1 or tok.eos_id == 1
    assert tok.eos_id != 2  # so the old default eos=2 named an ordinary token

    class Script(LogitsProcessor):  # the model "says" token 2 three times, then the tokenizer's EOS
        def __call__(self, input_ids, scores):
            n = input_ids.shape[1] - prompt.shape[1]
            forced = 2 if n < 3 else tok.eos_id
            out = torch.full_like(scores, -1e9)
            out[:, forced] = 0.0
            return out

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=False).eval()
    prompt = torch.tensor([tok.encode("And God said")])
    gen = hf.generate(prompt, max_new_tokens=10, do_sample=False, logits_processor=LogitsProcessorList([Script()]))
    new = gen[0, prompt.shape[1]:].tolist()
    assert new == [2, 2, 2, tok.eos_id]  # ran past the ordinary token 2, stopped at EOS
