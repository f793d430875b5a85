"""Where a benchmark writes its result JSON: outside the checkout's tracked files unless asked.

    from bench_out import result_path
    path = result_path("tracking_overhead_cpu_tiny.json", args.out)   # --out DIR (or a .json file)

Without ``--out`` a result goes to ``$DEPTHLAB_CACHE/bench-results/`` (default ``~/.cache/depthlab/bench-results/``),
so running a benchmark never changes a committed file; ``--out benchmarks/results`` updates the committed results
(what a measurement the README reports is, on purpose).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

#: The committed results the README and benchmarks/README.md cite.
COMMITTED = Path(__file__).resolve().parent / "results"


def default_dir() -> Path:
    """``$DEPTHLAB_CACHE/bench-results`` (``~/.cache/depthlab/bench-results``): not a tracked folder."""
    return Path(os.environ.get("DEPTHLAB_CACHE") or Path.home() / ".cache" / "depthlab") / "bench-results"


def result_path(name: str, out: str | Path | None = None) -> Path:
    """The file a result named ``name`` is written to: ``out`` when it names a ``.json`` file, ``out/name`` when it
    names a folder, else :func:`default_dir`/``name``; its folder is created."""
    if out is not None and str(out).endswith(".json"):
        path = Path(out)
    else:
        path = Path(out if out is not None else default_dir()) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


OUT_HELP = "result folder or .json file (default outside the checkout; --out benchmarks/results updates the committed one)"


def common_args(p: argparse.ArgumentParser, repeats: int | None = None) -> argparse.ArgumentParser:
    """The flags every timing benchmark shares: ``--repeats`` (when given a default), ``--threads``, ``--out``."""
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=None, help=OUT_HELP)
    return p


def apply_threads(args: argparse.Namespace) -> None:
    """``torch.set_num_threads(args.threads)`` when ``--threads`` was given."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def save_report(report: dict, out: str | Path | None) -> None:
    """Write ``report`` to the file ``out`` (atomically; nothing without ``--out``) and say where."""
    if out:
        from depthlab.base.fileio import write_json_atomic

        write_json_atomic(Path(out), report)
        print(f"wrote {out}")
