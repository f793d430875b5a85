"""Freed tensors go back to the system while a training loop runs, so its peak memory is what it holds, not what
glibc kept.

    with freed_memory_returned():     # a CPU training loop's peak: what it holds (a no-op off glibc)
        ...

glibc's ``malloc`` serves a large block from ``mmap`` (returned to the system on ``free``) only above a threshold
that it *raises* each time such a block is freed, up to 32 MiB. A training step allocates thousands of
activations of 1-30 MiB and frees them in the backward, so after the first step they all come from the heap,
whose freed pages glibc keeps, and each step fragments the heap further. Fixing the threshold at 1 MiB
(``mallopt(M_MMAP_THRESHOLD, ...)``, what ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment does) returns
them; the price is a page fault for every page of every such block, every time. Measured on SmolLM2-135M's LoRA heal
(8 x 256 tokens a step, activation checkpointing on; ``benchmarks/heal_allocator.py``): peak RSS 3.98 GB and
9.5 s a step with glibc's default, 1.60 GB and 14.7 s with the threshold fixed. On leaving, the threshold is set to
32 MiB, the ceiling glibc's own raising ends at in such a loop (glibc cannot be put back to raising it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
THRESHOLD = 1 << 20  # while returning: blocks of 1 MiB and more are mmapped, and returned to the system when freed
AFTER = 32 << 20  # afterwards: glibc's dynamic ceiling (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)


def _mallopt(param: int, value: int) -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(param, int(value)))
    except (OSError, AttributeError):  # no libc to load, or a libc without mallopt
        return False


def return_freed_memory(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (see the module docstring) for the rest of the process;
    returns whether it was set (False off Linux/glibc, where there is nothing to do)."""
    ok = _mallopt(M_MMAP_THRESHOLD, threshold)
    log.debug("glibc mmap threshold fixed at %d bytes: %s", threshold, ok)
    return ok


@contextmanager
def freed_memory_returned(enabled: bool = True, threshold: int = THRESHOLD) -> Iterator[bool]:
    """Inside: freed blocks of ``threshold`` bytes and more go back to the system (:func:`return_freed_memory`);
    on leaving, the threshold is :data:`AFTER`. Yields whether it took effect (False when not ``enabled``)."""
    on = enabled and return_freed_memory(threshold)
    try:
        yield on
    finally:
        if on:
            _mallopt(M_MMAP_THRESHOLD, AFTER)
