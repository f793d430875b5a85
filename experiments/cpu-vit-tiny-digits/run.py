"""vit-tiny on scikit-learn's digits: pre, layerscale, lns (after-norm), lns (after-branch); 2 seeds each.

    cd /work/wt-vit && PYTHONPATH=src python3 experiments/cpu-vit-tiny-digits/run.py

Writes results.json next to this file (rewritten after every run, so a cut-off run keeps what finished).
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from depthlab.vit import vit_from_preset
from depthlab.data.images import load_images
from depthlab.vit.train import fit

STEPS, LR, BATCH, SEEDS = 600, 2e-3, 64, (0, 1)
VARIANTS = [("pre", {}), ("layerscale", {}), ("lns", {}), ("lns", {"position": "after-branch"})]
OUT = Path(__file__).with_name("results.json")


def label(scheme, opts):
    return scheme + "".join(f":{k}={v}" for k, v in opts.items())


def main() -> None:
    torch.set_num_threads(1)
    data = load_images("digits", seed=0)  # one fixed split (1438 / 359); seeds vary init and batch order
    runs = []
    for scheme, opts in VARIANTS:
        for seed in SEEDS:
            r = fit(vit_from_preset("vit-tiny", scheme=scheme, **opts), data, steps=STEPS, lr=LR, batch_size=BATCH,
                    seed=seed)
            r.pop("model")
            r["variant"] = label(scheme, opts)
            runs.append(r)
            print(f"{r['variant']:<28} seed {seed}  acc {r['accuracy']:.4f}  loss {r['loss']:.4f}  "
                  f"last-block var {r['layer_variance'][-1]:.3f}  {r['seconds']:.0f}s", flush=True)
            summary = {}
            for v in dict.fromkeys(x["variant"] for x in runs):
                rs = [x for x in runs if x["variant"] == v]
                summary[v] = {
                    "accuracy_mean": statistics.mean(x["accuracy"] for x in rs),
                    "loss_mean": statistics.mean(x["loss"] for x in rs),
                    "last_block_variance_mean": statistics.mean(x["layer_variance"][-1] for x in rs),
                    "layer_variance_mean": [statistics.mean(c) for c in zip(*(x["layer_variance"] for x in rs))],
                    "seeds": [x["seed"] for x in rs],
                }
            OUT.write_text(json.dumps({"preset": "vit-tiny", "data": "digits (sklearn, 80/20 split seed 0)",
                                       "steps": STEPS, "lr": LR, "batch_size": BATCH, "torch": torch.__version__,
                                       "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                           time.gmtime()),
                                       "summary": summary, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
