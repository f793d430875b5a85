"""Print the README's tables from the runs of run.sh: python summarize.py [OUT] (default /tmp/sublayer-exp)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _prune(path: Path) -> list[str]:
    r = json.loads((path / "prune.json").read_text())
    gen, lat = r.get("generate") or {}, r.get("latency") or {}
    unit = r.get("unit", "block")
    rows = []
    for stage in ("original", "pruned", "healed"):
        if r["loss"].get(stage) is None:
            continue
        g = gen.get(stage)
        rows.append(f"| {path.name} | {unit} | {r['removed_blocks']} | {stage} | {r['loss'][stage]:.4f} | "
                    + (f"{100 * g['acc']:.1f} % ({round(g['acc'] * g['n'])}/{g['n']})" if g else "–") + " |")
    speed = lat.get("speedup") or lat.get("export_speedup")
    extra = f", depthlab skipping x{lat['depthlab_speedup']:.2f}" if "depthlab_speedup" in lat else ""
    rows.append(f"| {path.name} | | | generation speed-up (original / pruned time) | x{speed:.2f}{extra} | |")
    return rows


def _diagnose(path: Path) -> list[str]:
    r = json.loads((path / "report.json").read_text())
    sub, lens = r["sublayers"], r["lens"]
    out = ["| block | attn Δloss | MLP Δloss | block Δloss | attn contribution | MLP contribution | lens loss after | "
           "lens top-1 = final |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for l in range(1, len(sub["attn"]["contribution"]) + 1):
        out.append(f"| {l} | {sub['attn']['delta_loss'][l - 1]:.4f} | {sub['mlp']['delta_loss'][l - 1]:.4f} | "
                   f"{r['removal']['delta_loss'][l - 1]:.4f} | {sub['attn']['contribution'][l - 1]:.3f} | "
                   f"{sub['mlp']['contribution'][l - 1]:.3f} | {lens['loss'][l]:.3f} | {100 * lens['agreement'][l]:.1f} % |")
    out.append(f"\nfull model loss {r['removal']['base_loss']:.4f}; lens of the embeddings: loss {lens['loss'][0]:.3f}")
    return out


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sublayer-exp")
    print("| run | unit | removed (blocks) | model | held-out loss | builtin-arith exact match |")
    print("|---|---|---|---|---:|---:|")
    for name in ("smollm2-block4", "smollm2-attn8"):
        if (out / name / "prune.json").is_file():
            print("\n".join(_prune(out / name)))
    for d in sorted(out.glob("tiny-pre-lns/**/report.json")) + sorted(out.glob("smollm2-diagnose/report.json")):
        print(f"\n### {d.parent.relative_to(out)}\n")
        print("\n".join(_diagnose(d.parent)))


if __name__ == "__main__":
    main()
