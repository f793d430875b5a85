"""Where a training step's time goes: torch.profiler's trace of a few steps, read into shares by kind of work.

    from step_profile import profile_steps
    shares = profile_steps(step, steps=2, device=torch.device("cuda"))   # step: a closure running one step

On CUDA the trace's GPU events (kernels, copies, sets) are what counts: each kernel's time, the share of each kind
(``CATEGORIES``: matmul, attention, cross-entropy, embedding, optimizer, copy, other = element-wise work such as
norms, RoPE, SwiGLU and residual adds, fused or not), the top kernels by time, and the **launch gaps**: the share of
the profiled window in which the GPU ran nothing (the host was late: launches, Python, a sync). On a CPU (the
runbook's dry run) the same from the CPU operators' self times, and the gaps are the moments no operator ran.
Names are matched by substrings, first match wins (an inductor kernel is named after the operators it fuses, e.g.
``triton_red_fused__log_softmax_...``); a kernel no rule names is "other".
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

#: (kind, name fragments), matched in this order against the lower-cased kernel or operator name.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("attention", ("flash", "fmha", "sdpa", "scaled_dot_product", "attention")),
    ("embedding", ("embedding",)),
    ("cross_entropy", ("log_softmax", "logsumexp", "nll_loss", "cross_entropy", "softmax", "scatter_add", "gather")),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach", "optimizer")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "triton_tem_", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::matmul", "aten::linear", "sm90_", "sm80_", "sm100_")),
    ("copy", ("memcpy", "memset", "aten::copy_", "aten::to", "aten::_to_copy")),
]
DEVICE_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def categorise(name: str) -> str:
    low = name.lower()
    return next((kind for kind, parts in CATEGORIES if any(p in low for p in parts)), "other")


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (start, end)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _cpu_self_times(events: list[dict]) -> tuple[list[tuple[str, float]], list[tuple[float, float]]]:
    """(name, self time) of each CPU operator (its time less its children's, nesting per thread) and the intervals
    of the top-level ones."""
    by_thread: dict[object, list[dict]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    selves, tops = [], []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, dur, children's time]
        for e in evs:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                selves.append((done[1], done[2] - done[3]))
            if stack:
                stack[-1][3] += e["dur"]
            else:
                tops.append((start, end))
            stack.append([end, e["name"], e["dur"], 0.0])
        selves += [(s[1], s[2] - s[3]) for s in stack]
    return selves, tops


def breakdown(trace: dict, device_type: str, steps: int, top: int = 15) -> dict:
    """The shares of a chrome trace (``torch.profiler``'s ``export_chrome_trace``) of ``steps`` training steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if device_type == "cuda":
        dev = [e for e in events if e.get("cat") in DEVICE_EVENTS]
        timed = [(e["name"], float(e["dur"])) for e in dev]
        spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in dev]
        what = "GPU kernels, copies and sets (their own time on the device)"
    else:
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        timed, spans = _cpu_self_times(ops)
        what = "CPU operators (self time)"
    total = sum(t for _, t in timed)
    if not spans or total <= 0:
        return {"error": f"the trace holds no {what}", "steps": steps}
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    busy = _union(spans)
    per_kind: dict[str, float] = defaultdict(float)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, t in timed:
        per_kind[categorise(name)] += t
        per_name[name][0] += t
        per_name[name][1] += 1
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "what": what, "steps": steps, "events": len(timed), "events_per_step": round(len(timed) / steps, 1),
        "time_s_per_step": total / 1e6 / steps, "window_s_per_step": window / 1e6 / steps,
        "busy_share_of_window": busy / window if window else None,
        "launch_gap_share": 1.0 - busy / window if window else None,
        "shares": {k: v / total for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:160], "kind": categorise(n), "share": s / total, "ms_per_step": s / 1e3 / steps,
                 "calls_per_step": c / steps} for n, (s, c) in ranked],
    }


def profile_steps(step: Callable[[], None], steps: int, device: torch.device, top: int = 15) -> dict:
    """Run ``step`` ``steps`` times under torch.profiler (CUDA: GPU activity only; CPU: operators) and return
    :func:`breakdown` of the trace. The caller warms ``step`` up first (compiles, allocator)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return breakdown(trace, device.type, steps, top)
