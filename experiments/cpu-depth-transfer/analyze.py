"""Read the depth x learning-rate grid of run.py: the optimum learning rate against depth, and the loss against depth.

    PYTHONPATH=src python3 experiments/cpu-depth-transfer/analyze.py --runs /tmp/depth-transfer --out experiments/cpu-depth-transfer

Writes results.json (every run, and the fits), loss_vs_lr.png (held-out loss against learning rate, one panel per
scheme, one line per depth, a star at each optimum) and depth_transfer.png (left: the optimum against depth, per
seed as dots; right: the loss at each depth's best rate against depth, with the fit), and prints the tables of
the README.

- **Optimum learning rate** of a (scheme, depth): the vertex of a parabola through the mean loss at the grid's
  best rate and its two neighbours, in log2(lr) (the grid's best rate itself when it lies at the edge of the
  grid, flagged). Per seed too: their spread is the estimate's noise. Its drift with depth is the slope of
  log2(lr*) against log2(depth) (least squares, with its standard error): 0 means the rate transfers.
- **Transfer penalty**: the loss at the rate that is best at the shallowest depth, minus the loss at each depth's
  own best rate (both on the grid): what tuning at the base depth and transferring costs.
- **Loss against depth** at each depth's best rate: L(D) = E + A * D^-alpha (scipy's curve_fit with E in
  [0, min L], A >= 0, alpha in [0, 5], and the standard errors of its covariance; a loss that does not fall
  with depth pins it to a bound), and the pure power law log L = log A - alpha log D (any sign). "Inverse depth scaling"
  (Liu et al. 2026, arXiv:2602.05970) finds alpha ~ 1 for the depth-dependent part of LLM losses.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from depthlab.analysis.plots._base import save, subplots
from depthlab.base.fileio import json_safe, write_json_atomic

HERE = Path(__file__).resolve().parent


def load(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((runs / "runs").glob("*/result.json"))]


def label(scheme: str) -> str:
    return scheme.split(":")[0]


def table(rows: list[dict]) -> dict[str, dict[int, dict[float, dict[int, float]]]]:
    """scheme -> depth -> lr -> seed -> held-out loss (inf: diverged)."""
    out: dict = {}
    for r in rows:
        loss = math.inf if r["diverged"] or not math.isfinite(r["eval_loss"]) else r["eval_loss"]
        out.setdefault(label(r["scheme"]), {}).setdefault(r["depth"], {}).setdefault(r["lr"], {})[r["seed"]] = loss
    return out


def optimum(by_lr: dict[float, float]) -> tuple[float, float, bool]:
    """(optimum lr, loss there, at the grid's edge) from {lr: loss}: a parabola in log2(lr) through the best
    grid point and its neighbours."""
    lrs = sorted(lr for lr in by_lr if math.isfinite(by_lr[lr]))
    i = min(range(len(lrs)), key=lambda j: by_lr[lrs[j]])
    if i == 0 or i == len(lrs) - 1:
        return lrs[i], by_lr[lrs[i]], True
    x = np.log2(lrs[i - 1:i + 2])
    y = np.array([by_lr[lr] for lr in lrs[i - 1:i + 2]])
    a, b, c = np.polyfit(x, y, 2)
    v = float(np.clip(-b / (2 * a), x[0], x[-1])) if a > 0 else float(x[1])
    return 2.0 ** v, float(np.polyval([a, b, c], v)), False


def slope(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares slope of y on x and its standard error."""
    X, Y = np.asarray(x, float), np.asarray(y, float)
    if len(X) < 3:
        return float("nan"), float("nan")
    A = np.vstack([X, np.ones_like(X)]).T
    coef, res, *_ = np.linalg.lstsq(A, Y, rcond=None)
    resid = Y - A @ coef
    s2 = float(resid @ resid) / (len(X) - 2)
    return float(coef[0]), math.sqrt(s2 / float(((X - X.mean()) ** 2).sum()))


def fit_depth(depths: list[int], losses: list[float]) -> dict:
    """L = E + A D^-alpha (curve_fit) and the pure power law (log-log slope)."""
    from scipy.optimize import curve_fit

    D, L = np.asarray(depths, float), np.asarray(losses, float)
    out: dict = {}
    pure, err = slope(list(np.log(D)), list(np.log(L)))
    out["power_law"] = {"alpha": -pure, "alpha_se": err}
    if len(D) < 4:
        return out
    try:
        p, cov = curve_fit(lambda d, E, A, a: E + A * d ** -a, D, L, p0=(L.min() * 0.9, L.max() - L.min() + 0.1, 1.0),
                           bounds=([0.0, 0.0, 0.0], [L.min(), np.inf, 5.0]), maxfev=20000)
        se = np.sqrt(np.diag(cov)) if np.all(np.isfinite(cov)) else [float("nan")] * 3
        out["offset_power_law"] = {"E": p[0], "A": p[1], "alpha": p[2], "E_se": se[0], "A_se": se[1], "alpha_se": se[2]}
    except (RuntimeError, ValueError) as err:
        out["offset_power_law"] = {"error": str(err)}
    return out


def analyse(t: dict) -> dict:
    """Per scheme: optimum per depth (mean and per seed), its drift, the transfer penalty, the depth fits."""
    out: dict = {}
    for scheme, by_depth in t.items():
        depths = sorted(by_depth)
        mean = {D: {lr: float(np.mean(list(v.values()))) for lr, v in by_depth[D].items()} for D in depths}
        opt = {D: optimum(mean[D]) for D in depths}
        all_seeds = sorted({s for D in depths for v in by_depth[D].values() for s in v})
        seeds = [{D: optimum({lr: v[s] for lr, v in by_depth[D].items() if s in v})[0] for D in depths
                  if sum(s in v for v in by_depth[D].values()) >= 3} for s in all_seeds]
        base = min(mean[depths[0]], key=mean[depths[0]].get)  # the grid rate that is best at the shallowest depth
        penalty = {D: mean[D].get(base, math.inf) - min(mean[D].values()) for D in depths}
        drift = slope([math.log2(D) for D in depths], [math.log2(opt[D][0]) for D in depths])
        out[scheme] = {
            "depths": depths, "optimum_lr": {D: opt[D][0] for D in depths}, "optimum_loss": {D: opt[D][1] for D in depths},
            "optimum_at_edge": {D: opt[D][2] for D in depths}, "optimum_lr_per_seed": seeds,
            "grid_best_loss": {D: min(mean[D].values()) for D in depths}, "base_lr": base,
            "transfer_penalty": penalty, "lr_drift_per_doubling": {"slope": drift[0], "se": drift[1]},
            "depth_fit": fit_depth(depths, [min(mean[D].values()) for D in depths]),
        }
    return out


def figures(t: dict, res: dict, out: Path) -> None:
    schemes = list(t)
    fig, axes = subplots(1, len(schemes), figsize=(4.2 * len(schemes), 3.6), squeeze=False, sharey=True)
    cmap = {D: c for D, c in zip(sorted({D for s in t.values() for D in s}), ("#440154", "#3b528b", "#21918c",
                                                                              "#5ec962", "#fde725", "#aaaaaa"))}
    for ax, scheme in zip(axes[0], schemes):
        for D, by_lr in sorted(t[scheme].items()):
            lrs = sorted(by_lr)
            m = [np.mean(list(by_lr[lr].values())) for lr in lrs]
            ax.plot(lrs, m, marker="o", ms=3, color=cmap[D], label=f"L = {D}")
            ax.plot([res[scheme]["optimum_lr"][D]], [res[scheme]["optimum_loss"][D]], marker="*", ms=10, color=cmap[D])
        ax.set_xscale("log", base=2)
        ax.set_title(scheme)
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out loss (mean over seeds)")
    lo = min(min(np.mean(list(v.values())) for v in by_lr.values()) for s in t.values() for by_lr in s.values())
    axes[0][0].set_ylim(lo - 0.05, lo + 1.2)
    axes[0][-1].legend(fontsize=7)
    save(fig, out / "loss_vs_lr.png")
    fig, (a1, a2) = subplots(1, 2, figsize=(9.6, 3.8))
    for scheme in schemes:
        r = res[scheme]
        a1.plot(r["depths"], [r["optimum_lr"][D] for D in r["depths"]], marker="o", label=scheme)
        for per_seed in r["optimum_lr_per_seed"]:
            a1.plot(list(per_seed), list(per_seed.values()), ls="none", marker=".", color=a1.lines[-1].get_color())
        a2.plot(r["depths"], [r["grid_best_loss"][D] for D in r["depths"]], marker="o", label=scheme)
        fit = r["depth_fit"]["offset_power_law"]
        if "alpha" in fit:
            d = np.geomspace(min(r["depths"]), max(r["depths"]), 50)
            a2.plot(d, fit["E"] + fit["A"] * d ** -fit["alpha"], ls="--", lw=1, color=a2.lines[-1].get_color())
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("depth L (blocks)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a1.set_yscale("log", base=2)
    a1.set_ylabel("optimum peak learning rate")
    a1.set_title("Optimum learning rate against depth (dots: per seed)", fontsize=9)
    a2.set_ylabel("held-out loss at each depth's best rate")
    a2.set_title("Loss against depth (dashed: E + A L^-alpha)", fontsize=9)
    save(fig, out / "depth_transfer.png")


def report(res: dict) -> str:
    lines = ["| scheme | " + " | ".join(f"L={D} lr* (loss)" for D in next(iter(res.values()))["depths"]) +
             " | lr* drift per doubling of L | transfer penalty at L=32 |", "|---|" + "---:|" * 7]
    for scheme, r in res.items():
        cells = [f"{r['optimum_lr'][D]:.2g}{'†' if r['optimum_at_edge'][D] else ''} ({r['grid_best_loss'][D]:.3f})"
                 for D in r["depths"]]
        dr = r["lr_drift_per_doubling"]
        pen = r["transfer_penalty"][r["depths"][-1]]
        lines.append(f"| {scheme} | " + " | ".join(cells) + f" | {dr['slope']:+.2f} ± {dr['se']:.2f} | {pen:+.3f} |")
    lines += ["", "| scheme | alpha (E + A L^-alpha) | E | alpha (pure power law) |", "|---|---:|---:|---:|"]
    for scheme, r in res.items():
        f, p = r["depth_fit"]["offset_power_law"], r["depth_fit"]["power_law"]
        off = f"{f['alpha']:.2f} ± {f['alpha_se']:.2f} | {f['E']:.3f} ± {f['E_se']:.3f}" if "alpha" in f else "– | –"
        lines.append(f"| {scheme} | {off} | {p['alpha']:.3f} ± {p['alpha_se']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True)
    p.add_argument("--out", default=str(HERE))
    args = p.parse_args()
    rows = load(Path(args.runs))
    t = table(rows)
    res = analyse(t)
    out = Path(args.out)
    figures(t, res, out)
    write_json_atomic(out / "results.json", json_safe({"runs": rows, "analysis": res}), indent=1)
    print(report(res))


if __name__ == "__main__":
    main()
