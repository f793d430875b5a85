"""Where a result came from: package versions and the command line that produced it.

    versions()          {"python": "3.11.9", "depthlab": "...", "torch": "...", ...}
    command_line(argv)  "depthlab train --preset tiny --out runs/x" (shell-quoted)

Every run directory, diagnostics report, compare and theory result records these two.
"""

from __future__ import annotations

import platform
import shlex
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

#: Distributions whose installed versions are recorded (those not installed are left out).
PACKAGES = ("depthlab", "torch", "transformers", "tokenizers", "safetensors", "numpy")


def versions() -> dict[str, str]:
    """Python's version and the installed version of each of :data:`PACKAGES`."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _is_depthlab_program(program: str) -> bool:
    """True for the ``depthlab`` console script and for ``python -m depthlab`` (.../depthlab/__main__.py)."""
    path = Path(program)
    return path.name == "depthlab" or (path.name == "__main__.py" and path.parent.name == "depthlab")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The shell line that reproduces this invocation, each argument shell-quoted.

    ``argv`` given: the arguments of the ``depthlab`` command (without the program name), so
    ``["train", "--out", "a b"]`` -> ``depthlab train --out 'a b'``. ``None``: this process's
    ``sys.argv``, written as ``depthlab ...`` when the process is the depthlab CLI, else as is
    (e.g. ``python my_script.py --flag`` for a library call from a script).
    """
    if argv is not None:
        return "depthlab " + shlex.join(argv)
    if sys.argv and _is_depthlab_program(sys.argv[0]):
        return "depthlab " + shlex.join(sys.argv[1:])
    return shlex.join(sys.argv)
