"""Seed 0 and seed 1 of the 2026 schemes on `tiny`, side by side: each scheme's held-out loss and deepest-third
measures per seed, their mean, and the difference to Pre-LN of the same seed (paired).

    python3 experiments/cpu-tiny-schemes-2026/two_seeds.py > experiments/cpu-tiny-schemes-2026/two_seeds.md

Seed 0 is `summary.json` (one compare of the seven schemes); seed 1 is `seed1/*.json` (two compares run side by
side on one core each: pre, lns, attnres, attnres:block=8, siamese / gpas, hybridnorm; the same settings).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEASURES = (("eval_loss", "held-out loss", 3), ("last_layer_variance", "last-block output variance", 2),
            ("deep_angular", "angular dist. deepest third", 3), ("deep_removal_drop", "removal Δloss deepest third", 4))


def runs() -> dict[tuple[str, int], dict]:
    """(scheme label, seed) -> the run's row, from every summary this experiment holds."""
    found: dict[tuple[str, int], dict] = {}
    for path in [HERE / "summary.json", *sorted((HERE / "seed1").glob("*.json"))]:
        for row in json.loads(path.read_text())["runs"]:
            found[row["scheme"], row["seed"]] = row
    return found


def main() -> None:
    rows = runs()
    schemes = list(dict.fromkeys(s for s, _ in rows))
    print("| scheme | " + " | ".join(f"{name} (seed 0 / seed 1)" for _, name, _ in MEASURES)
          + " | Δ loss vs pre (seed 0 / seed 1) |")
    print("|---|" + "---:|" * (len(MEASURES) + 1))
    for scheme in schemes:
        cells = []
        for key, _, digits in MEASURES:
            vals = [rows[scheme, seed][key] for seed in (0, 1) if (scheme, seed) in rows]
            cells.append(" / ".join(f"{v:.{digits}f}" for v in vals)
                         + (f" (mean {statistics.mean(vals):.{digits}f})" if len(vals) == 2 else ""))
        deltas = [rows[scheme, s]["eval_loss"] - rows["pre", s]["eval_loss"] for s in (0, 1)
                  if (scheme, s) in rows and ("pre", s) in rows]
        print(f"| {scheme} | " + " | ".join(cells) + " | " + " / ".join(f"{d:+.3f}" for d in deltas) + " |")


if __name__ == "__main__":
    main()
