"""``python -m depthlab`` (also what ``torchrun -m depthlab`` runs)."""

from depthlab.cli import run

run()
