"""Freed tensors go back to the system, so a training loop's peak memory is what it holds, not what glibc kept.

    return_freed_memory()     # once, before a training loop on a CPU (a no-op off glibc)

glibc's ``malloc`` serves a large block from ``mmap`` (returned to the system on ``free``) only above a threshold
that it *raises* each time such a block is freed, up to 32 MiB. A training step allocates thousands of
activations of 1-30 MiB and frees them in the backward, so after the first step they all come from the heap,
whose freed pages glibc keeps; each step then fragments the heap further. Measured on SmolLM2-135M's LoRA heal
(8 x 256 tokens a step, activation checkpointing on): peak RSS 3.80 GB after three steps with the default
behaviour, 1.51 GB with the threshold fixed at 1 MiB, at the same step time (``benchmarks/prune_heal.py``). Fixing
the threshold (``mallopt(M_MMAP_THRESHOLD, ...)``) stops the raising; it affects the whole process, for the
better in every loop we measured, and is what ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
THRESHOLD = 1 << 20  # blocks of 1 MiB and more are mmapped, and returned to the system when freed


def return_freed_memory(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (see the module docstring); returns whether it was set
    (False off Linux/glibc, where there is nothing to do)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # no libc to load, or a libc without mallopt
        return False
    log.debug("glibc mmap threshold fixed at %d bytes: %s", threshold, ok)
    return ok
