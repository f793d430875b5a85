"""Depth tracking inside a Hugging Face ``Trainer`` run: a small Llama with LayerNorm Scaling trained on
depthlab's built-in corpus, its per-block series logged through the Trainer's own reporters.

    python examples/monitor_hf_trainer.py                                  # CPU: about a minute on 2 cores
    python examples/monitor_hf_trainer.py --report-to tensorboard --steps 300 --out runs/hf-monitor
    tensorboard --logdir runs/hf-monitor                                   # train/depth/angular/block_01, ...

Every ``--every`` optimizer steps (and at the start and after the last step) the callback runs one probe
on a fixed held-out batch and hands ``depth/<quantity>/block_<l>`` scalars to ``trainer.log``: they land in
``trainer.state.log_history`` and in every reporter ``--report-to`` names. The model is saved with its
tokenizer at the end, so ``depthlab diagnose OUT/model`` measures the same checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

from depthlab.data import CausalLMWindows, build_tokenizer, eval_token_batches, iter_documents, load_sequences
from depthlab.hf.export import save_hf_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=352)
    p.add_argument("--tokenizer", default="bpe:4096", help="depthlab tokenizer spec (bpe:N: saved with the model)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per training window and per probe row")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--every", type=int, default=10, help="optimizer steps between depth probes")
    p.add_argument("--probe-rows", type=int, default=8, help="held-out sequences in the probe batch")
    p.add_argument("--train-rows", type=int, default=None, help="use only the first N training windows")
    p.add_argument("--report-to", default="none", help="Trainer reporters: none, tensorboard, wandb, trackio, ...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/hf_monitor")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Trainer:
    a = parse_args(argv)
    out = Path(a.out)
    tok = build_tokenizer(a.tokenizer, iter_documents("builtin", "train"))
    rows = load_sequences("builtin", tok, a.seq_len - 1, split="train", seed=a.seed).rows[: a.train_rows]
    train = CausalLMWindows(rows)
    # the probe batch: the first held-out batch `depthlab diagnose --tokens B*T --seq-len T --batch-size B` reads
    held_out = eval_token_batches("builtin", tok, a.probe_rows * (a.seq_len + 1), a.seq_len + 1, a.probe_rows)
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                         max_position_embeddings=a.seq_len + 1, tie_word_embeddings=False,
                         bos_token_id=tok.eos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    args = TrainingArguments(output_dir=str(out), max_steps=a.steps, per_device_train_batch_size=a.batch,
                             learning_rate=a.lr, warmup_steps=max(1, a.steps // 10), seed=a.seed,
                             report_to=[] if a.report_to == "none" else a.report_to.split(","),
                             logging_steps=max(1, a.every), save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0, use_cpu=not torch.cuda.is_available())
    torch.manual_seed(a.seed)
    probe_every = a.every

    # readme:start hf-trainer
    from depthlab.analysis.monitor import DepthMonitorCallback
    from depthlab.hf import apply_layernorm_scaling

    probe_ids = next(iter(held_out))               # a fixed held-out batch of token ids, (B, T + 1)
    model = AutoModelForCausalLM.from_config(config)
    apply_layernorm_scaling(model)                 # LNS (optional: the monitor reads any decoder)
    trainer = Trainer(model=model, args=args, train_dataset=train)
    DepthMonitorCallback(probe_ids, every=probe_every).attach(trainer)
    trainer.train()                                # log_history and report_to get depth/angular/block_01, ...
    # readme:end

    save_hf_checkpoint(model, out / "model", tok)
    return trainer


if __name__ == "__main__":
    t = main()
    last = [h for h in t.state.log_history if "depth_deepest_third/angular" in h][-1]
    print(f"step {last['step']}: deepest-third angular distance {last['depth_deepest_third/angular']:.4f}, "
          f"removal Δloss {last.get('depth_deepest_third/removal', float('nan')):.4f}")
