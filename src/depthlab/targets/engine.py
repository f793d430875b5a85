"""Which engine reads a model, decided here for every command and library call: in memory, or one decoder layer
at a time (the streamed engine, :mod:`depthlab.targets.stream`).

    plan = plan_engine("path/to/hf-dir", device, torch.bfloat16, stream=None)
    plan.streamed, plan.line      # True, "streamed, one layer at a time (the model needs 15.0 GiB in bfloat16, ...)"

``stream``: True streams (refused in one line for a target that cannot stream), False keeps the model in
memory, None streams when the whole model would not fit :data:`MEMORY_FRACTION` of the device's free memory.
:func:`depthlab.targets.load_target` opens a target with the engine its plan chose, and ``diagnose`` / ``prune``
run the engine of the target they are given. The plan's ``line`` says which engine and why, for the one line a
command prints before it works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError

#: Fraction of the free memory a model in memory (or a sweep's lanes, one layer and its activations) may take.
MEMORY_FRACTION = 0.7

ENGINES = ("in-memory", "streamed")


def available_memory(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (CPU: MemAvailable), or None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class EnginePlan:
    """Which engine reads a target, and why."""

    streamed: bool
    line: str  # which engine and why, for the one-line plan
    model_bytes: int | None = None  # the whole model in the asked dtype
    free_bytes: int | None = None  # free memory of the device
    found: Any = field(default=None, compare=False, repr=False)  # the streamable checkpoint located (stream.open.Located)

    @property
    def engine(self) -> str:
        """``report["engine"]["name"]``: "streamed" or "in-memory"."""
        return ENGINES[self.streamed]


def plan_engine(name: str, device: torch.device, dtype: torch.dtype, stream: bool | None,
                tower: str = "language") -> EnginePlan:
    """Stream when ``stream`` says so, or (None) when the model would not fit the device's free memory.
    Raises when streaming is asked for a target that cannot stream (``tower``: an image-text wrapper's)."""
    from depthlab.targets.stream.open import locate, stored_bytes

    if stream is False:
        return EnginePlan(False, "in memory (streaming off)")
    found = locate(name, tower)
    if isinstance(found, str):
        if stream:
            from depthlab.hf.preflight import stream_line

            raise DepthlabError(stream_line(name, found))
        return EnginePlan(False, "in memory (only HF safetensors directories and depthlab LM runs stream)")
    need, free = stored_bytes(found, dtype), available_memory(device)
    size = f"the model needs {gib(need)} in {str(dtype).replace('torch.', '')}" + (
        f", {gib(free)} of {device.type} memory is free" if free is not None else "")
    if stream is None:
        stream = free is not None and need > MEMORY_FRACTION * free
        why = size
    else:
        why = f"streaming on; {size}"
    if not stream:
        return EnginePlan(False, f"in memory ({why})", need, free, found)
    return EnginePlan(True, f"streamed, one layer at a time ({why})", need, free, found)


def engine_of(target: Any) -> str:
    """"streamed" for a target read one layer at a time, "in-memory" for one whose model is loaded."""
    from depthlab.targets.stream.open import StreamTarget

    return ENGINES[isinstance(target, StreamTarget)]


def engine_record(target: Any) -> dict[str, Any]:
    """``report["engine"]``'s common part: the engine that ran and the plan's line (why)."""
    plan = getattr(target, "plan", None)
    name = engine_of(target)
    default = "streamed, one layer at a time" if name == "streamed" else "in memory"
    return {"name": name, "line": plan.line if plan is not None else default}
