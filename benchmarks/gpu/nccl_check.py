"""``torchrun --nproc_per_node 1`` with DDP and with FSDP2 on the GPU (NCCL): the loss of one process, a checkpoint
written and resumed. The sharded path on the backend users run it on (the tests cover gloo on a CPU only).

    python3 benchmarks/gpu/nccl_check.py --device cuda --out /tmp/nccl      # on a GPU: NCCL
    python3 benchmarks/gpu/nccl_check.py --device cpu --out /tmp/nccl       # the dry run: the same on gloo

1. The reference: ``depthlab train`` in this process (a 2-block skipinit model, fp32, 4 steps, a checkpoint every 2;
   skipinit's 0-dim gains are what FSDP2 cannot shard: the replicated-parameter path runs too).
2. Side by side, ``torchrun --standalone --nproc_per_node 1 -m depthlab train ... --dist ddp`` and ``--dist fsdp``
   (NCCL on CUDA, gloo on a CPU: ``depthlab.train.distributed.setup``); each one's losses must equal the
   reference's (relative 1e-6) and its final weights too (1e-5).
3. Side by side, each of those runs copied without its last checkpoint and resumed (``--resume``) under the other
   mode (FSDP2's checkpoint under DDP and DDP's under FSDP2): the losses and final weights again.
Writes ``nccl.json``: each run's command, exit code, seconds and losses, the largest loss and weight differences,
``passed``, the backend and the device. The multi-GPU command is the same with ``--nproc_per_node N`` (not run here:
one GPU; docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--scheme", "skipinit", "--set", "n_layers=2", "--set", "d_model=64", "--set", "n_heads=2", "--set", "d_ff=128",
        "--tokenizer", "bytes", "--steps", "4", "--batch-size", "8", "--micro-batch-size", "4", "--seq-len", "64",
        "--eval-tokens", "1024", "--log-every", "1", "--ckpt-every", "2", "--variance-every", "2", "--dtype", "fp32",
        "--no-compile", "--no-plots", "-q"]
STEPS = 4


def corpus(path: Path) -> Path:
    path.write_text("\n".join(json.dumps({"text": f"Verse {i}: and it came to pass " * (1 + i % 7)}) for i in range(400)))
    return path


def losses(run: Path) -> list[float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "loss" in line]


def weights(run: Path, step: int = STEPS) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoint" / f"step-{step:08d}" / "model.safetensors"))


def compare(run: Path, ref_losses: list[float], ref_w: dict) -> dict:
    """Largest relative loss difference and largest weight difference of ``run`` against the reference."""
    try:
        got, w = losses(run), weights(run)
    except (OSError, ValueError, KeyError) as err:
        return {"error": f"{type(err).__name__}: {err}"[:300], "passed": False}
    dl = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref_losses)), default=float("inf"))
    dw = max((float((w[k].float() - ref_w[k].float()).abs().max()) for k in ref_w if k in w), default=float("inf"))
    same = len(got) == len(ref_losses) and set(w) == set(ref_w)
    return {"losses": got, "max_rel_loss_diff": dl, "max_abs_weight_diff": dw,
            "passed": same and dl <= 1e-6 and dw <= 1e-5}


def launch(args: list[str], env: dict, log: Path) -> tuple[subprocess.Popen, float, object]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "depthlab",
           "train", *args]
    f = log.open("w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT), time.perf_counter(), f


def wait_all(jobs: dict, timeout: float) -> dict:
    """Wait for each job (killed after ``timeout`` seconds in all); name -> {command, rc, seconds}."""
    deadline, out = time.perf_counter() + timeout, {}
    for name, (proc, t0, f) in jobs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
        f.close()
        out[name] = {"command": shlex.join(proc.args), "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--out", required=True, help="folder for the runs, their logs and nccl.json")
    p.add_argument("--timeout-s", type=float, default=150.0, help="each wave of torchrun launches (default 150)")
    args = p.parse_args(argv)
    import torch

    from depthlab.cli import main as depthlab_main

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "DEPTHLAB_CACHE": str(out / "cache")}
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    base = [*ARGS, "--data", str(corpus(out / "corpus.jsonl")), "--device", args.device]
    record: dict = {"device": args.device, "backend": "nccl" if args.device == "cuda" else "gloo",
                    "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                    if args.device == "cuda" and torch.cuda.is_available() else None, "runs": {}}
    t0 = time.perf_counter()
    wave1 = {mode: launch([*base, "--dist", mode, "--out", str(out / mode)], env, out / f"{mode}.log")
             for mode in ("ddp", "fsdp")}
    os.environ["DEPTHLAB_CACHE"] = env["DEPTHLAB_CACHE"]
    rc = depthlab_main(["train", *base, "--out", str(out / "single")])  # the reference, meanwhile, in this process
    record["runs"]["single"] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
    record["runs"].update(wait_all(wave1, args.timeout_s))
    ref_losses, ref_w = losses(out / "single"), weights(out / "single")
    record["runs"]["single"]["losses"] = ref_losses
    for mode in ("ddp", "fsdp"):
        record["runs"][mode].update(compare(out / mode, ref_losses, ref_w))
    wave2 = {}
    for src, mode in (("fsdp", "ddp"), ("ddp", "fsdp")):
        name = f"{src}-resumed-as-{mode}"
        if (out / src / "checkpoint" / f"step-{STEPS:08d}").is_dir():
            shutil.copytree(out / src, out / name)
            shutil.rmtree(out / name / "checkpoint" / f"step-{STEPS:08d}")
            wave2[name] = launch(["--resume", str(out / name), "--dist", mode, "-q"], env, out / f"{name}.log")
    record["runs"].update(wait_all(wave2, args.timeout_s))
    for name in wave2:
        record["runs"][name].update(compare(out / name, ref_losses, ref_w))
    record["passed"] = rc == 0 and len(record["runs"]) == 5 and all(
        r.get("passed") and r["rc"] == 0 for n, r in record["runs"].items() if n != "single")
    record["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "nccl.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"nccl check ({record['backend']}): {'passed' if record['passed'] else 'FAILED'} in {record['seconds']} s")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
