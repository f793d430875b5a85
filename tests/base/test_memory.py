"""Freed memory goes back to the system (glibc's mmap threshold fixed), so a heal's peak is what it holds."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHILD = """
import sys, torch
from depthlab.base.memory import freed_memory_returned
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) * 1024
def returned():
    torch.ones(3 << 18)  # one 3 MiB block freed: glibc's default raises its mmap threshold past it
    blocks = [torch.ones(3 << 18) for _ in range(100)]  # 300 MiB
    before = rss()
    del blocks[::2]  # 150 MiB freed, in holes between live blocks (a training step's pattern)
    return before - rss()
with freed_memory_returned(sys.argv[1] == "fix") as on:
    assert on == (sys.argv[1] == "fix")
    inside = returned()
print(inside, returned())  # after leaving: blocks under 32 MiB come from the heap again
"""


def _returned(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    inside, after = out.stdout.split()[-2:]
    return int(inside), int(after)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_activations_go_back_to_the_system():
    inside, after = _returned("fix")
    assert inside >= 120 * 2**20  # ~150 MiB back at once
    assert after < 30 * 2**20  # left: 3 MiB blocks are the heap's again (the speed of glibc's default)
    assert max(_returned("default")) < 30 * 2**20  # the behaviour it fixes: glibc keeps the holes
