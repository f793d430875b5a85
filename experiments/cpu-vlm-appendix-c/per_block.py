"""The paper's Appendix C study (Figure 10): each block of an image-text-to-text model's vision tower and of its
language tower removed one at a time, each pruned model scored on an image-text multiple-choice task; the drop in
accuracy from the unpruned model, per block, one panel per tower.

A block is removed by making it the identity on its residual stream (a forward hook returning the block's input),
on the model loaded once: the same function as ``depthlab prune --tower vision|language --blocks K``'s export
reloaded in plain transformers (``tests/hf/test_wrappers.py`` checks the export's logits against exactly this hook
on every wrapper), without writing 2 x (number of blocks) model copies. Scoring is depthlab's (``evaluate``'s
lm-eval-style loglikelihood of each lettered option, ``score_image_loglik``); besides accuracy the mean
log-probability of the correct letter's continuation is recorded, a less noisy measure on few items.

    python experiments/cpu-vlm-appendix-c/per_block.py --limit 60            # the small model build_vlm.py made
    python experiments/cpu-vlm-appendix-c/per_block.py --model path/to/Qwen2.5-VL-7B-Instruct \\
        --tasks 'mmmu/*/validation-*.parquet' --chat-template --device cuda --dtype bfloat16 --out results-qwen
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def bypass(block: torch.nn.Module) -> Any:
    """A forward hook making ``block`` the identity (its output replaced by its input); returns the handle."""
    def hook(module: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]
        return x if isinstance(out, torch.Tensor) else (x, *out[1:])
    return block.register_forward_hook(hook, with_kwargs=True)


def score(model: Any, processor: Any, task: Any, chat_template: bool) -> dict[str, float]:
    """Accuracy (lm-eval's ``acc``) and the mean log-likelihood of the gold option of ``task``."""
    from depthlab.analysis.evaluate.image_scoring import item_logliks

    lls = [item_logliks(model, processor, item, chat_template) for item in task.items]
    gold = [ll[item.gold] for ll, item in zip(lls, task.items)]
    acc = [float(max(range(len(ll)), key=ll.__getitem__) == item.gold) for ll, item in zip(lls, task.items)]
    return {"acc": sum(acc) / len(acc), "gold_loglik": sum(gold) / len(gold), "n": len(acc)}


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return (f"{info.get('Model name', '?').strip()} (family {info.get('CPU family', '?').strip()}, model "
                f"{info.get('Model', '?').strip()}), {torch.get_num_threads()} torch threads")
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "?"


def study(args: argparse.Namespace) -> dict[str, Any]:
    """Every block of every tower removed in turn; the report (written after each block, so a stopped run keeps
    what it measured)."""
    from depthlab.analysis.evaluate import load_tasks
    from depthlab.analysis.evaluate.image_model import load_image_text
    from depthlab.targets.layers import find_layers

    dtype = getattr(torch, args.dtype)
    target, processor = load_image_text(args.model, device=args.device, dtype=dtype)
    model = target.model
    task = load_tasks([args.tasks], args.limit)[0]
    t0 = time.time()
    report: dict[str, Any] = {"model": str(args.model), "task": args.tasks, "limit": args.limit,
                              "machine": machine(), "torch": torch.__version__, "command": " ".join(sys.argv),
                              "base": score(model, processor, task, args.chat_template), "towers": {}}
    print(f"unpruned: {report['base']} ({time.time() - t0:.0f} s)", flush=True)
    for tower in args.towers.split(","):
        rows = report["towers"][tower] = []
        for k, block in enumerate(find_layers(model, tower), start=1):
            handle = bypass(block)
            try:
                got = score(model, processor, task, args.chat_template)
            finally:
                handle.remove()
            rows.append({"block": k, **got, "drop": report["base"]["acc"] - got["acc"],
                         "gold_loglik_drop": report["base"]["gold_loglik"] - got["gold_loglik"]})
            print(f"{tower} block {k}: acc {got['acc']:.3f}, gold loglik {got['gold_loglik']:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
            report["seconds"] = round(time.time() - t0, 1)
            write(report, args.out)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "per_block.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out / "per_block.json")


def figure(report: dict[str, Any], out: Path) -> Path:
    """Figure 10's two panels: the accuracy drop per removed block, vision tower left, language tower right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    towers = list(report["towers"])
    fig, axes = plt.subplots(2, len(towers), figsize=(5.5 * len(towers), 5.6), squeeze=False, sharex="col")
    for j, tower in enumerate(towers):
        rows = report["towers"][tower]
        blocks = [r["block"] for r in rows]
        for i, (key, scale, label) in enumerate((("drop", 100, "accuracy drop (points)"),
                                                 ("gold_loglik_drop", 1, "drop of the correct option's\nlog-likelihood (nats)"))):
            ax = axes[i][j]
            ax.bar(blocks, [scale * r[key] for r in rows], color="#4c72b0" if tower == "vision" else "#dd8452")
            ax.axhline(0, color="black", lw=0.6)
            ax.set_ylabel(label)
            ax.set_xticks(blocks if len(blocks) <= 16 else blocks[::2])
        axes[0][j].set_title(f"{tower} tower ({len(rows)} blocks)")
        axes[1][j].set_xlabel(f"{tower} block removed")
    base = report["base"]
    fig.suptitle(f"{Path(report['model']).name}: {report['task']} ({base['n']} items), unpruned acc "
                 f"{100 * base['acc']:.1f} %", fontsize=10)
    fig.tight_layout()
    path = out / "figure10.png"
    fig.savefig(path, dpi=120)
    return path


def main() -> int:
    from depthlab.data.tokenizers import default_cache_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(default_cache_dir() / "experiments" / "vlm-shapes"))
    p.add_argument("--tasks", default="builtin-shapes", help="builtin-shapes, or MMMU-format parquet / jsonl files")
    p.add_argument("--limit", type=int, default=None, help="items of the task (default: all)")
    p.add_argument("--towers", default="vision,language")
    p.add_argument("--chat-template", action="store_true", help="prompts as one user turn of the chat template")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--plot-only", action="store_true", help="redraw the figure from OUT/per_block.json")
    args = p.parse_args()
    report = json.loads((args.out / "per_block.json").read_text()) if args.plot_only else study(args)
    print(f"figure: {figure(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
