"""depthlab finetune: the trainer reused on SFT data from given weights (tiny models, bytes tokenizer)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from depthlab import from_preset
from depthlab.cli import main
from depthlab.data import IGNORE_INDEX
from depthlab.models.decoder import build_model
from depthlab.train import TrainConfig, load_run, train
from depthlab.train import distributed as D
from depthlab.train.evaluator import Evaluator
from depthlab.train.finetune import finetune, load_source
from depthlab.train.step import Forward, train_step

TINY = dict(n_layers=3, d_model=32, n_heads=2, d_ff=64)
SFT = dict(data="builtin-sft", seq_len=256, batch_size=2, eval_every=0, variance_every=0, ckpt_every=0)


@pytest.fixture(scope="module")
def lns_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "lns"
    train(from_preset("tiny", scheme="lns", **TINY),
          TrainConfig(data="builtin", tokenizer="bytes", steps=2, seq_len=32, batch_size=2, eval_tokens=256), out,
          quiet=True)
    return out


def test_finetuning_an_lns_run_keeps_its_scheme_and_starts_from_its_weights(lns_run, tmp_path, monkeypatch):
    import depthlab.train.loop as loop

    pre, _, _ = load_run(lns_run)
    seen = {}

    def first_step(step, forward, model, *args, **kwargs):
        if step == 1:  # before any update
            ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                seen["logits"], seen["ref"] = model(ids).logits, pre(ids).logits
            seen["scales"] = [(b.attn_norm.scale, b.ffn_norm.scale) for b in model.blocks]
        return train_step(step, forward, model, *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", first_step)
    finetune(lns_run, TrainConfig(steps=1, **SFT), tmp_path / "sft", quiet=True)
    assert torch.equal(seen["logits"], seen["ref"])
    for l, (a, f) in enumerate(seen["scales"], 1):
        assert a == f == pytest.approx(1 / math.sqrt(l))
    model, _, config = load_run(tmp_path / "sft")
    assert model.cfg.scheme == "lns" and config["finetune"]["source"]["scheme"] == "lns"
    assert config["finetune"]["template"]["name"] == "alpaca" and "### Response:" in config["finetune"]["template"][
        "prompt_no_input"]
    assert config["finetune"]["data"] == "builtin-sft" and config["tokenizer"]["spec"] == "bytes"


def test_the_sft_loss_counts_only_response_tokens():
    torch.manual_seed(0)
    model = build_model(from_preset("tiny", scheme="pre", vocab_size=16, **TINY))
    env = D.DistEnv()
    cpu = torch.device("cpu")
    forward = Forward(D.wrap(model, env, cpu), cpu, lambda: torch.autocast("cpu", enabled=False))
    x = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(1))
    y = torch.full_like(x, IGNORE_INDEX)
    y[0, 5:], y[1, 2:4] = x[0, 5:], x[1, 2:4]  # 3 + 2 response tokens, the rest a masked prompt / padding
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits.float(), -1)
    keep = y != IGNORE_INDEX
    want = -logp[keep].gather(-1, y[keep][:, None]).mean().item()
    ev = Evaluator(forward, [(x, y)], x, env).evaluate()
    assert ev.tokens == 5 and ev.loss == pytest.approx(want, rel=1e-5)

    class Rows:
        def rank_batch(self, step, batch_size, rank, world):
            return x, y

    cfg = TrainConfig(steps=1, lr=1e-9, batch_size=2, seq_len=8).resolve(model.cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-9)
    res = train_step(1, forward, model, opt, Rows(), cfg, env)
    assert res.tokens == 5 and res.loss == pytest.approx(want, rel=1e-5)


def test_finetune_resume_continues_exactly(lns_run, tmp_path):
    cfg = TrainConfig(steps=4, **{**SFT, "ckpt_every": 2})
    full = finetune(lns_run, cfg, tmp_path / "full", quiet=True)

    class Stop(Exception):
        pass

    def stop_at_2(rec):
        if rec["step"] == 2:  # after step 2's checkpoint: an interrupted session
            raise Stop

    with pytest.raises(Stop):
        finetune(lns_run, cfg, tmp_path / "half", quiet=True, progress=stop_at_2)
    resumed = finetune(lns_run, cfg, tmp_path / "half", resume=True, quiet=True)
    assert resumed["train_loss"] == full["train_loss"] and resumed["eval_loss"] == full["eval_loss"]
    a, _, _ = load_run(tmp_path / "full")
    b, _, _ = load_run(tmp_path / "half")
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k


def test_cli_finetune_then_evaluate(lns_run, tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["finetune", str(lns_run), "--data", "builtin-sft", "--steps", "2", "--batch-size", "2",
                 "--seq-len", "256", "--out", str(out), "-q"]) == 0
    assert "held-out response loss" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert main(["finetune", "--resume", str(out), "-q"]) == 0  # finished: resumes to the same step


def test_bad_sources_and_data_are_one_line_exit_2_and_write_nothing(lns_run, tmp_path, capsys):
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "notes.txt").write_text("hi")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "label": 1}\n{"question": "r", "label": 0}\n')
    for argv, what in ((["finetune", str(neither), "--data", "builtin-sft"], "neither a depthlab run"),
                       (["finetune", str(lns_run), "--data", str(bad)], "not an SFT record")):
        out = tmp_path / "out"
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and what in err
        assert not out.exists()
    with pytest.raises(Exception, match="neither"):
        load_source(neither)


def test_an_lns_marked_hf_model_is_fine_tuned_as_lns_with_its_own_tokenizer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    import depthlab.train.loop as loop
    from depthlab.data.tokenizers import _train_bpe
    from depthlab.hf import apply_layernorm_scaling
    from depthlab.hf.tokenizers import hf_tokenizer

    texts = [f"word{i} and more words {i * 7}" for i in range(200)]
    from depthlab.data.sft import TEMPLATES

    tok = hf_tokenizer(_train_bpe(400, texts + [TEMPLATES["alpaca"].prompt_no_input] * 20, "bpe:400"))
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, max_position_embeddings=256)).eval()
    apply_layernorm_scaling(hf)
    hf.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"instruction": f"say {t}", "output": t}) + "\n" for t in texts[:20]))
    seen = {}

    def first_step(step, forward, model, *args, **kwargs):
        if step == 1:
            ids = torch.randint(0, len(tok), (1, 12), generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                seen["diff"] = (model(ids).logits - hf(ids).logits).abs().max().item()
            seen["scheme"] = model.cfg.scheme
        return train_step(step, forward, model, *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", first_step)
    finetune(tmp_path / "hf", TrainConfig(data=str(sft), steps=1, seq_len=128, batch_size=2, eval_every=0,
                                          variance_every=0, ckpt_every=0), tmp_path / "sft", quiet=True)
    assert seen["scheme"] == "lns" and seen["diff"] < 1e-4
    config = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert config["finetune"]["source"]["kind"] == "hf" and config["tokenizer"]["spec"].startswith("hf:")


def test_a_tied_embedding_hf_model_fine_tunes_checkpoints_resumes_and_starts_a_train_run(tmp_path):
    """SmolLM2 ties its embedding and head: the checkpoint stores the shared tensor once, a resume continues
    exactly, the reloaded model is still tied, and ``train --init-from`` starts from the same weights."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from depthlab.data.sft import TEMPLATES
    from depthlab.data.tokenizers import _train_bpe
    from depthlab.hf.tokenizers import hf_tokenizer

    texts = [f"word{i} and more words {i * 7}" for i in range(200)]
    tok = hf_tokenizer(_train_bpe(400, texts + [TEMPLATES["alpaca"].prompt_no_input] * 20, "bpe:400"))
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=256, tie_word_embeddings=True))
    hf.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"instruction": f"say {t}", "output": t}) + "\n" for t in texts[:20]))
    common = ["--data", str(sft), "--seq-len", "64", "--batch-size", "2", "--eval-every", "0", "--variance-every", "0",
              "--log-every", "1", "--device", "cpu", "-q"]
    assert main(["finetune", str(tmp_path / "hf"), *common, "--steps", "4", "--out", str(tmp_path / "a")]) == 0
    assert main(["finetune", str(tmp_path / "hf"), *common, "--steps", "4", "--ckpt-every", "2", "--out",
                 str(tmp_path / "b")]) == 0
    ckpts = sorted((tmp_path / "b" / "checkpoint").iterdir())
    shutil.rmtree(ckpts[-1])  # as if killed after step 2: resume from there
    (tmp_path / "b" / "summary.json").unlink()
    assert main(["finetune", "--resume", str(tmp_path / "b"), "-q"]) == 0
    losses = [[json.loads(ln)["loss"] for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
              for d in ("a", "b")]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    model, _, _ = load_run(tmp_path / "b")
    assert model.lm_head.weight is model.embed.weight
    assert main(["train", "--init-from", str(tmp_path / "hf"), "--data", "builtin", "--steps", "1", "--seq-len", "32",
                 "--batch-size", "2", "--eval-tokens", "256", "--device", "cpu", "--no-plots", "-q",
                 "--out", str(tmp_path / "c")]) == 0
