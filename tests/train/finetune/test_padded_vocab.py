"""Issue 33, case 5: an HF model whose embedding is padded past its tokenizer's vocabulary (Qwen2 ships 151936 rows
for 151665 tokens) fine-tunes, keeps its padded embedding, and resumes exactly."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from depthlab.cli import main
from depthlab.targets import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tiny_models import save_hf  # noqa: E402


def test_a_padded_vocabulary_hf_model_fine_tunes_and_resumes_exactly(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    hf = AutoModelForCausalLM.from_config(cfg)
    save_hf(hf, tmp_path / "hf")  # the byte tokenizer: 257 tokens under an embedding of 512 rows
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"instruction": f"say {i}", "output": f"word {i}"}) + "\n" for i in range(20)))
    common = ["--data", str(sft), "--seq-len", "320", "--batch-size", "2", "--eval-every", "0", "--variance-every", "0",
              "--log-every", "1", "--steps", "4", "--device", "cpu", "-q"]
    assert main(["finetune", str(tmp_path / "hf"), *common, "--out", str(tmp_path / "a")]) == 0
    assert main(["finetune", str(tmp_path / "hf"), *common, "--ckpt-every", "2", "--out", str(tmp_path / "b")]) == 0
    shutil.rmtree(sorted((tmp_path / "b" / "checkpoint").iterdir())[-1])  # as if killed after step 2
    (tmp_path / "b" / "summary.json").unlink()
    assert main(["finetune", "--resume", str(tmp_path / "b"), "-q"]) == 0
    losses = [[json.loads(ln)["loss"] for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
              for d in ("a", "b")]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    model, _, _ = load_run(tmp_path / "b")
    assert model.embed.weight.shape[0] == 512 and model.cfg.vocab_size == 512
    # the rows past the tokenizer no input token reaches: untouched by fine-tuning (no weight decay on embeddings)
    torch.testing.assert_close(model.embed.weight[300:].float(), hf.get_input_embeddings().weight[300:].float())
