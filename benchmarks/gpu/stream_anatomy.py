"""Where a streamed command's time goes: one depthlab command run in this process with the layer sweep timed.

    python3 benchmarks/gpu/stream_anatomy.py --json A.json -- diagnose DIR --stream --tokens 16384 --out R

The streamed engine (``depthlab.targets.stream``) is wrapped from outside, nothing in it changed: each layer of each
sweep is timed whole and split into **reading** (``LayerSource.materialise``: the tensors read from the
memory-mapped safetensors files, converted, copied to the device), **computing** (the rest of the layer: every lane
through it, and the taps) and **saving** (``PassState.save_layer``: the resume state, the live lanes written to disk
after each layer; its bytes counted), plus the embedding, the head (the lanes' logits and losses) and the rest of
the command (start-up, data, report). On CUDA each timed region ends with a synchronise, so the asynchronous
kernels count where they were launched. The JSON is rewritten after every layer, so a command stopped by a
deadline still leaves its per-layer times. Also: wall time, exit code, peak GPU memory
(``torch.cuda.max_memory_allocated``) and the process's peak resident memory (``ru_maxrss``).
"""

from __future__ import annotations

import functools
import json
import resource
import shlex
import sys
import time
from pathlib import Path

import torch

REGIONS = ("read", "compute", "save", "head", "embed")


class Anatomy:
    """The timings, written to ``path`` as they grow."""

    def __init__(self, path: Path, argv: list[str]) -> None:
        self.path, self.t0 = path, time.perf_counter()
        self.record: dict = {"command": "depthlab " + shlex.join(argv), "rc": None, "finished": False,
                             "totals_s": dict.fromkeys(REGIONS, 0.0), "saved_bytes": 0, "passes": [], "layers": []}
        self.cuda = torch.cuda.is_available()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def add(self, region: str, seconds: float) -> None:
        self.record["totals_s"][region] += seconds

    def write(self) -> None:
        r = self.record
        r["wall_s"] = round(time.perf_counter() - self.t0, 2)
        r["other_s"] = round(r["wall_s"] - sum(r["totals_s"].values()), 2)
        r["peak_gpu_bytes"] = torch.cuda.max_memory_allocated() if self.cuda else None
        r["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(r, indent=1) + "\n")
        tmp.replace(self.path)


def _timed(anat: Anatomy, region: str, fn):
    """``fn`` timed into ``region``, less the reading done inside it (the head and embedding read their weights)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        anat.sync()
        t, read0 = time.perf_counter(), anat.record["totals_s"]["read"]
        try:
            return fn(*args, **kwargs)
        finally:
            anat.sync()
            inner = anat.record["totals_s"]["read"] - read0 if region != "read" else 0.0
            anat.add(region, time.perf_counter() - t - inner)
    return wrapper


def instrument(anat: Anatomy) -> None:
    """Wrap the engine's reading, layer, head, embedding and saving (class attributes: every sweep of the command)."""
    from depthlab.targets.stream import resume, source, sweep

    source.LayerSource.materialise = _timed(anat, "read", source.LayerSource.materialise)
    sweep.Sweeper._embed = _timed(anat, "embed", sweep.Sweeper._embed)
    sweep.Sweeper._head = _timed(anat, "head", sweep.Sweeper._head)
    layer_fn, save_fn, sweep_fn = sweep.Sweeper._layer, resume.PassState.save_layer, sweep.Sweeper.sweep

    @functools.wraps(layer_fn)
    def layer(self, j, batches, bufs, layout, *args, **kwargs):
        anat.sync()
        t, read0 = time.perf_counter(), anat.record["totals_s"]["read"]
        try:
            return layer_fn(self, j, batches, bufs, layout, *args, **kwargs)
        finally:
            anat.sync()
            total, read = time.perf_counter() - t, anat.record["totals_s"]["read"] - read0
            anat.add("compute", total - read)
            anat.record["layers"].append({"pass": anat.record["passes"][-1]["name"] if anat.record["passes"] else None,
                                          "layer": j, "read_s": round(read, 4), "compute_s": round(total - read, 4),
                                          "lanes": sum(b - a for a, b, _ in layout.runs(j)),
                                          "save_s": 0.0, "saved_bytes": 0})
            anat.write()

    @functools.wraps(save_fn)
    def save_layer(self, group, j, lanes, state, consumer_state=None):
        t = time.perf_counter()
        try:
            return save_fn(self, group, j, lanes, state, consumer_state)
        finally:
            seconds = time.perf_counter() - t
            nbytes = 0 if self.dir is None else sum(x.numel() * x.element_size() for x in [*lanes, *(state or [])]
                                                    if isinstance(x, torch.Tensor))
            anat.add("save", seconds)
            anat.record["saved_bytes"] += nbytes
            if anat.record["layers"] and anat.record["layers"][-1]["layer"] == j:
                anat.record["layers"][-1].update(save_s=round(seconds, 4), saved_bytes=nbytes)

    @functools.wraps(sweep_fn)
    def sweep_wrapped(self, name, *args, **kwargs):
        anat.record["passes"].append({"name": name})
        t = time.perf_counter()
        try:
            return sweep_fn(self, name, *args, **kwargs)
        finally:
            anat.record["passes"][-1]["seconds"] = round(time.perf_counter() - t, 2)
            anat.write()

    sweep.Sweeper._layer, resume.PassState.save_layer, sweep.Sweeper.sweep = layer, save_layer, sweep_wrapped


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--json" or argv[2] != "--":
        print("usage: stream_anatomy.py --json PATH -- DEPTHLAB ARGS", file=sys.stderr)
        return 2
    from depthlab.cli import main as depthlab_main

    anat = Anatomy(Path(argv[1]), argv[3:])
    instrument(anat)
    anat.write()
    rc = depthlab_main(argv[3:])
    anat.record.update(rc=rc, finished=True)
    anat.write()
    return rc


if __name__ == "__main__":
    sys.exit(main())
