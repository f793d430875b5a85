"""Prune + LoRA heal within memory: peak RSS and time of ``depthlab prune ... --heal lora`` on this machine.

    python benchmarks/prune_heal.py --toy                      # the 8B-shaped run's steps on tiny shapes (~30 s)
    python benchmarks/prune_heal.py                            # the Llama-3-8B-shaped checkpoint (~16 GB, streamed)
    python benchmarks/prune_heal.py --smollm2                  # SmolLM2-135M, in memory
    python benchmarks/prune_heal.py --heal linear --calib-tokens 1024   # the 8B shape, --heal linear streamed
    python benchmarks/prune_heal.py --smollm2 --src /work/main/src --result ...   # the same with another checkout

8B (and toy) mode: the checkpoint of ``benchmarks/streamed_8b.py`` (written there once, reused), then, in a child
process, ``depthlab prune DIR --remove 8 --method angular-block --stream --weights bf16 --tokens 256 --seq-len 256
--batch-size 1 --heal lora --heal-steps N --heal-batch-size B``: the blocks are chosen by the streamed engine, the
pruned checkpoint written shard by shard, then only its kept blocks are loaded (bf16) and healed with LoRA
adapters (fp32, AdamW), the merged weights written back and checked layer by layer.

SmolLM2 mode: ``depthlab prune smollm2 --remove 6 --method angular-block --heal lora --heal-steps S`` in memory.

Each child's peak RSS comes from ``os.wait4`` (the kernel's high-water mark of that process), and a sampler reads
the RSS of the child's whole process tree every second (its maximum and a coarse timeline, to see which stage
peaks). The machine is shared: its load average before and after is recorded. Results: ``prune_heal_<mode>_cpu.json``
(in ``~/.cache/depthlab/bench-results`` unless ``--result FILE_OR_DIR``; ``--result benchmarks/results`` updates the
committed one) with the CPU (``lscpu``), versions and the exact command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamed_8b as s8  # noqa: E402  (the 8B-shaped checkpoint writer, machine info)
from bench_out import result_path  # noqa: E402  (sibling module)

ROOT = Path(__file__).resolve().parent.parent
GB = 10**9


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def run_sampled(argv: list[str], log: Path, src: Path) -> dict:
    """``argv`` in a child (output to ``log``): wall time, exit status, peak RSS (wait4) and the sampled tree RSS."""
    env = {**os.environ, "PYTHONPATH": str(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    samples: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                samples.append((round(time.perf_counter() - t0, 1), _tree_rss(proc.pid)))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        thread.join()
    step = max(1, len(samples) // 60)
    return {"argv": shlex.join(argv), "exit": os.waitstatus_to_exitcode(status), "wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "peak_tree_rss_sampled_bytes": max((r for _, r in samples), default=0),
            "rss_timeline_s_bytes": samples[::step], "log_tail": log.read_text().splitlines()[-14:]}


def run_big(mode: str, args: argparse.Namespace) -> dict:
    shapes = s8.SHAPES[mode]
    name = "llama3-8b-shaped" if mode == "8b" else "llama-toy-shaped"
    cache = Path(args.cache_dir or Path.home() / ".cache" / "depthlab" / "bench" / name)
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / f"{name}-heal")
    s8.preflight(cache, out, shapes, mode)
    ckpt = s8.write_checkpoint(cache, shapes)
    for sub in ("pruned",):
        subprocess.run(["rm", "-rf", str(out / sub)], check=True)
    T = str(args.tokens)
    argv = s8.depthlab("prune", str(cache), "--remove", str(shapes["remove"]), "--method", "angular-block", "--stream",
                       "--weights", "bf16", "--tokens", T, "--seq-len", T, "--batch-size", "1", *heal_flags(args),
                       "--out", str(out / "pruned"))
    child = run_sampled(argv, out / "prune_heal.log", Path(args.src))
    report = json.loads((out / "pruned" / "prune.json").read_text()) if child["exit"] == 0 else {}
    bf16_bytes = ckpt["bytes"]
    return {"shapes": shapes, "checkpoint": {"dir": str(cache), **ckpt}, "tokens": args.tokens,
            "prune_heal": child, **_summary(report),
            "goals": {"peak_rss_le_22GB": child["peak_rss_bytes"] <= 22 * GB, "checkpoint_bf16_bytes": bf16_bytes,
                      "peak_rss_over_checkpoint_bytes": round(child["peak_rss_bytes"] / bf16_bytes, 3)}}


def heal_flags(args: argparse.Namespace) -> list[str]:
    """The heal of the 8B (toy) prune: LoRA steps, or the least-squares map fitted on ``--calib-tokens`` tokens."""
    if args.heal == "linear":
        return ["--heal", "linear", "--heal-calib-tokens", str(args.calib_tokens)]
    return ["--heal", "lora", "--heal-steps", str(args.heal_steps), "--heal-batch-size", str(args.heal_batch_size)]


def run_smollm2(args: argparse.Namespace) -> dict:
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "smollm2-heal")
    subprocess.run(["rm", "-rf", str(out / "pruned")], check=True)
    out.mkdir(parents=True, exist_ok=True)
    argv = s8.depthlab("prune", "smollm2", "--remove", "6", "--method", "angular-block", "--tokens", str(args.tokens),
                       "--heal", "lora", "--heal-steps", str(args.heal_steps), "--heal-batch-size",
                       str(args.heal_batch_size), *args.extra, "--out", str(out / "pruned"))
    child = run_sampled(argv, out / "prune_heal.log", Path(args.src))
    report = json.loads((out / "pruned" / "prune.json").read_text()) if child["exit"] == 0 else {}
    return {"src": str(args.src), "prune_heal": child, **_summary(report)}


def _summary(report: dict) -> dict:
    if not report:
        return {}
    heal = report.get("heal") or {}
    return {"removed_blocks": report["removed_blocks"], "loss": report["loss"], "export": report["export"],
            "heal": {k: v for k, v in heal.items()}, "engine": report.get("engine"), "seconds": report.get("seconds"),
            "summary": report.get("summary"), "model": report.get("model")}


def lscpu() -> dict:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    keep = ("Model name", "CPU family", "Model", "CPU(s)", "Thread(s) per core", "L3 cache", "Hypervisor vendor")
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep:
            out[key.strip()] = value.strip()
    flags = next((ln for ln in text.splitlines() if ln.startswith("Flags")), "")
    out["bf16_flags"] = sorted(f for f in flags.split() if "bf16" in f or f.startswith("amx"))
    return out


def main() -> None:
    from depthlab.base.fileio import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny shapes, the same steps")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M in memory")
    ap.add_argument("--tokens", type=int, default=256, help="held-out tokens (8B: also the sequence length)")
    ap.add_argument("--heal-steps", type=int, default=20)
    ap.add_argument("--heal-batch-size", type=int, default=1)
    ap.add_argument("--heal", choices=("lora", "linear"), default="lora", help="8B/toy: the heal (linear: no training)")
    ap.add_argument("--calib-tokens", type=int, default=1024, help="--heal linear's calibration tokens (8B/toy)")
    ap.add_argument("--src", default=str(ROOT / "src"), help="the depthlab source the child runs (another checkout: "
                                                              "the before/after comparison)")
    ap.add_argument("--extra", nargs="*", default=[], help="more prune flags (smollm2 mode)")
    ap.add_argument("--shared-note", default="the 2-core machine was shared with other jobs during the run",
                    help="what ran beside it")
    ap.add_argument("--cache-dir")
    ap.add_argument("--out")
    ap.add_argument("--result")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    if args.smollm2:
        mode, result = "smollm2", run_smollm2(args)
    else:
        mode = "toy" if args.toy else "8b"
        result = run_big(mode, args)
    record = {"command": "python " + shlex.join(["benchmarks/prune_heal.py", *sys.argv[1:]]), **s8.machine(),
              "lscpu": lscpu(), "shared": args.shared_note, **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    suffix = "_linear" if args.heal == "linear" and mode != "smollm2" else ""
    path = result_path(f"prune_heal_{mode}{suffix}_cpu.json", args.result)
    write_json_atomic(path, record)
    brief = {k: record.get(k) for k in ("loss", "goals", "seconds")}
    print(json.dumps({**brief, "peak_rss_bytes": record["prune_heal"]["peak_rss_bytes"],
                      "wall_s": record["prune_heal"]["wall_s"], "exit": record["prune_heal"]["exit"]}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
