"""Train a small Hugging Face Llama from config with and without LayerNorm Scaling (LNS) through
the HF ``Trainer`` on depthlab's built-in corpus (KJV Bible, held-out books), print both held-out
losses, then save / reload / fold the LNS model to show the round trip.

    python examples/hf_trainer_lns.py                      # CPU default: a few minutes on 2 cores
    python examples/hf_trainer_lns.py --layers 24 --hidden 512 --heads 8 --ffn 1376 \\
        --seq-len 256 --batch 32 --steps 5000 --lr 1e-3 --bf16   # a GPU-sized run

Both runs start from the *same* initial weights and see the same batches: the only difference is
``depthlab.hf.apply_layernorm_scaling(model)``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

from depthlab.data import CausalLMWindows, build_tokenizer, iter_documents, load_sequences
from depthlab.hf import apply_layernorm_scaling, fold_layernorm_scaling, is_layernorm_scaled, load


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="decoder layers L (LNS matters more when deep)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=352, help="SwiGLU inner size")
    p.add_argument("--tokenizer", default="bpe:4096", help="depthlab tokenizer spec (bpe:N, bytes, hf:NAME)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="per-device train batch size")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up fraction of the steps")
    p.add_argument("--eval-seqs", type=int, default=32, help="held-out windows to score")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (GPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (Trainer torch_compile)")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient (activation) checkpointing")
    p.add_argument("--out", default="runs/hf_trainer_lns", help="output dir (Trainer files, saved models)")
    return p.parse_args()


def training_args(a: argparse.Namespace, out: Path) -> TrainingArguments:
    fields = TrainingArguments.__dataclass_fields__
    ckpt = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return TrainingArguments(
        output_dir=str(out), max_steps=a.steps, per_device_train_batch_size=a.batch,
        per_device_eval_batch_size=a.batch, learning_rate=a.lr, lr_scheduler_type="cosine",
        warmup_steps=max(1, int(a.warmup * a.steps)), weight_decay=0.0, max_grad_norm=0.0,  # paper: no clipping
        adam_beta1=0.9, adam_beta2=0.95, seed=a.seed, data_seed=a.seed, report_to=[], save_strategy="no",
        logging_steps=max(1, a.steps // 10), bf16=a.bf16, torch_compile=a.compile, **{ckpt: a.grad_ckpt},
        dataloader_num_workers=0, dataloader_pin_memory=torch.cuda.is_available(), disable_tqdm=True,
    )


def main() -> None:
    a = parse_args()
    out = Path(a.out)
    tok = build_tokenizer(a.tokenizer, iter_documents("builtin", "train"))
    train = CausalLMWindows(load_sequences("builtin", tok, a.seq_len - 1, split="train", seed=a.seed).rows)
    val_rows = load_sequences("builtin", tok, a.seq_len - 1, split="val", seed=a.seed).rows
    val = CausalLMWindows(val_rows[: a.eval_seqs])
    print(f"data: {len(train)} train / {len(val)} held-out windows of {a.seq_len} tokens ({tok.spec})")

    config = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.heads, max_position_embeddings=a.seq_len,
        rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False,
        bos_token_id=tok.eos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
    )
    torch.manual_seed(a.seed)
    init = AutoModelForCausalLM.from_config(config)
    print(f"model: Llama {a.layers} layers x {a.hidden}, {sum(p.numel() for p in init.parameters()) / 1e6:.2f}M params")

    results = {}
    for name in ("pre-ln", "lns"):
        model = copy.deepcopy(init)  # same initial weights for both runs
        if name == "lns":
            apply_layernorm_scaling(model)
        trainer = Trainer(model=model, args=training_args(a, out / name), train_dataset=train, eval_dataset=val)
        t0 = time.time()
        trainer.train()
        loss = trainer.evaluate()["eval_loss"]
        results[name] = {"eval_loss": loss, "perplexity": math.exp(loss), "train_seconds": time.time() - t0}
        print(f"{name:>7}: held-out loss {loss:.4f}  perplexity {math.exp(loss):.2f}  ({time.time() - t0:.0f}s)")
        if name == "lns":
            lns_model = model

    # save -> depthlab.hf.load restores LNS; fold -> a vanilla Llama with the same logits
    saved = out / "lns-model"
    lns_model.save_pretrained(saved)
    reloaded = load(saved)
    folded = fold_layernorm_scaling(lns_model)
    folded.save_pretrained(out / "lns-folded")
    ids = val.rows[:2].to(lns_model.device)
    with torch.no_grad():
        ref = lns_model.eval()(ids).logits.float()
        diff_reload = (reloaded.to(lns_model.device).eval()(ids).logits.float() - ref).abs().max().item()
        diff_fold = (folded.eval()(ids).logits.float() - ref).abs().max().item()
    print(f"save_pretrained + depthlab.hf.load: LNS on = {is_layernorm_scaled(reloaded)}, max |dlogit| = {diff_reload:.2e}")
    print(f"fold_layernorm_scaling (vanilla Llama in {out / 'lns-folded'}): max |dlogit| = {diff_fold:.2e}")
    print(f"LNS - Pre-LN held-out loss: {results['lns']['eval_loss'] - results['pre-ln']['eval_loss']:+.4f}")
    (out / "results.json").write_text(json.dumps({"args": vars(a), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
