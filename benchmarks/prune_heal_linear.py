"""No heal vs ``--heal linear`` vs ``--heal lora`` on the same pruned SmolLM2-135M: held-out loss, built-in MC
accuracy, the generative check, wall time and peak memory.

    python benchmarks/prune_heal_linear.py                                  # ~15 min on 2 shared cores
    python benchmarks/prune_heal_linear.py --remove 8 --lora-steps 20 --result benchmarks/results

1. ``depthlab prune smollm2 --remove R --method angular-block`` (no heal) chooses the blocks;
2. ``--blocks`` (those) ``--heal linear`` (ReplaceMe: a least-squares map per removed span, folded, no training);
3. ``--blocks`` (those) ``--heal lora --heal-steps S``.
Each prune runs in a child (peak RSS from ``os.wait4``, wall time), with ``--generate builtin-arith``; then each export
and the original are scored by ``depthlab evaluate --tasks builtin-mc``. The heal's own seconds come from prune.json
(``heal.seconds``: for linear the calibration forward passes and the solve; for LoRA the training). Result:
``prune_heal_linear_smollm2_cpu.json`` (``--result``; default outside the checkout) with lscpu and the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamed_8b as s8  # noqa: E402  (machine info, the depthlab child argv)
from bench_out import result_path  # noqa: E402
from prune_heal import lscpu, run_sampled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def prune(name: str, out: Path, common: list[str], extra: list[str], src: Path) -> dict:
    """One ``depthlab prune smollm2`` child: its wall time, peak RSS and what prune.json says."""
    argv = s8.depthlab("prune", "smollm2", *common, *extra, "--out", str(out / name))
    child = run_sampled(argv, out / f"{name}.log", src)
    child.pop("rss_timeline_s_bytes", None)
    if child["exit"] != 0:
        raise SystemExit(f"{name} failed:\n" + "\n".join(child["log_tail"]))
    rep = json.loads((out / name / "prune.json").read_text())
    heal = rep.get("heal") or {}
    return {"child": child, "removed_blocks": rep["removed_blocks"], "loss": rep["loss"], "generate": rep.get("generate"),
            "heal": {k: heal.get(k) for k in ("mode", "steps", "seconds", "relative_error", "identity_error",
                                              "calibration_tokens", "form", "trained_params") if k in heal},
            "seconds": rep.get("seconds"), "summary": rep.get("summary")}


def mc(target: str, out: Path, name: str, limit: int, src: Path) -> dict:
    """``depthlab evaluate TARGET --tasks builtin-mc`` in a child: acc, acc_norm (and their standard errors)."""
    argv = s8.depthlab("evaluate", target, "--tasks", "builtin-mc", "--limit", str(limit), "--no-progress",
                       "--out", str(out / f"eval-{name}"))
    child = run_sampled(argv, out / f"eval-{name}.log", src)
    if child["exit"] != 0:
        raise SystemExit(f"evaluate {name} failed:\n" + "\n".join(child["log_tail"]))
    rep = json.loads((out / f"eval-{name}" / "eval.json").read_text())
    return {"wall_s": child["wall_s"], "tasks": rep.get("tasks", rep)}


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "smollm2-heal-linear")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    src = Path(args.src)
    common = ["--tokens", str(args.tokens), "--weights", "fp32", "--generate", "builtin-arith",
              "--generate-limit", str(args.generate_limit), "--no-progress"]
    runs = {"none": prune("none", out, common, ["--remove", str(args.remove), "--method", "angular-block"], src)}
    blocks = ",".join(map(str, runs["none"]["removed_blocks"]))
    runs["linear"] = prune("linear", out, common, ["--blocks", blocks, "--heal", "linear"], src)
    runs["lora"] = prune("lora", out, common, ["--blocks", blocks, "--heal", "lora", "--heal-steps",
                                               str(args.lora_steps), "--heal-batch-size", str(args.heal_batch_size)], src)
    evals = {"original": mc("smollm2", out, "original", args.mc_limit, src)}
    for name in runs:
        evals[name] = mc(str(out / name), out, name, args.mc_limit, src)
    base, pruned = runs["none"]["loss"]["original"], runs["none"]["loss"]["pruned"]
    gap = {n: (pruned - runs[n]["loss"]["healed"]) / (pruned - base) for n in ("linear", "lora")}
    return {"remove": args.remove, "blocks": runs["none"]["removed_blocks"], "runs": runs, "mc": evals,
            "gap_recovered": gap, "linear_over_lora": {
                "gap_recovered_ratio": gap["linear"] / gap["lora"] if gap["lora"] else None,
                "heal_seconds_ratio": runs["linear"]["heal"]["seconds"] / runs["lora"]["heal"]["seconds"],
                "wall_ratio": runs["linear"]["child"]["wall_s"] / runs["lora"]["child"]["wall_s"]}}


def one_heal(args: argparse.Namespace) -> dict:
    """One more heal child on ``--blocks``, without the generative check: ``--heal linear`` with
    ``--heal-calib-tokens`` N (``--linear-only N``), or ``--heal lora`` (``--lora-only``, ``--lora-steps``): the two
    heals' seconds measured back to back under the same load."""
    if args.linear_only:
        name, heal = f"linear-{args.linear_only}", ["--heal", "linear", "--heal-calib-tokens", str(args.linear_only)]
    else:
        name, heal = f"lora-{args.lora_steps}", ["--heal", "lora", "--heal-steps", str(args.lora_steps),
                                                 "--heal-batch-size", str(args.heal_batch_size)]
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / f"smollm2-heal-{name}")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    common = ["--tokens", str(args.tokens), "--weights", "fp32", "--no-progress"]
    run = prune(name, out, common, ["--blocks", args.blocks, *heal], Path(args.src))
    loss = run["loss"]
    return {"blocks": run["removed_blocks"], "calibration_tokens": args.linear_only, "run": run,
            "gap_recovered": (loss["pruned"] - loss["healed"]) / (loss["pruned"] - loss["original"])}


def main() -> None:
    from depthlab.base.fileio import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--remove", type=int, default=8, help="blocks removed (of 30)")
    ap.add_argument("--tokens", type=int, default=4096, help="held-out tokens of the loss")
    ap.add_argument("--lora-steps", type=int, default=20, help="--heal-steps of the LoRA heal")
    ap.add_argument("--heal-batch-size", type=int, default=8)
    ap.add_argument("--generate-limit", type=int, default=20, help="builtin-arith items of the generative check")
    ap.add_argument("--mc-limit", type=int, default=200, help="builtin-mc items")
    ap.add_argument("--src", default=str(ROOT / "src"), help="the depthlab source the children run")
    ap.add_argument("--shared-note", default="the 2-core machine was shared with other agents' jobs during the run")
    ap.add_argument("--linear-only", type=int, metavar="N", help="only one --heal linear run with N calibration tokens "
                                                                   "on --blocks (result: ..._calib<N>_...json)")
    ap.add_argument("--lora-only", action="store_true", help="only one --heal lora run (--lora-steps) on --blocks")
    ap.add_argument("--blocks", default="12,13,14,15,16,17,18,19", help="--linear-only/--lora-only: the blocks removed")
    ap.add_argument("--out")
    ap.add_argument("--result")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    one = args.linear_only or args.lora_only
    result = one_heal(args) if one else run(args)
    record = {"command": "python " + shlex.join(["benchmarks/prune_heal_linear.py", *sys.argv[1:]]), **s8.machine(),
              "lscpu": lscpu(), "shared": args.shared_note, **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    name = (f"prune_heal_linear_calib{args.linear_only}_smollm2_cpu.json" if args.linear_only else
            f"prune_heal_lora{args.lora_steps}_smollm2_cpu.json" if args.lora_only else "prune_heal_linear_smollm2_cpu.json")
    path = result_path(name, args.result)
    write_json_atomic(path, record)
    if one:
        print(json.dumps({"gap_recovered": result["gap_recovered"], "loss": result["run"]["loss"],
                          "heal_seconds": result["run"]["heal"]["seconds"]}, indent=1))
    else:
        print(json.dumps({"gap_recovered": result["gap_recovered"], "linear_over_lora": result["linear_over_lora"],
                          "loss": {n: r["loss"] for n, r in result["runs"].items()}}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
