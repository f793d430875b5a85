"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

from collections.abc import Iterable


class DepthlabError(ValueError):
    """Bad input: a value the user gave that cannot work. Subclasses ValueError on purpose."""


class ConfigError(DepthlabError):
    """An invalid model or run configuration."""


def choices(valid: Iterable[str]) -> str:
    """``"choose one of: a, b, c"`` for error messages."""
    return "choose one of: " + ", ".join(str(v) for v in valid)


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none
    (how a wrapped library error becomes one line of a DepthlabError or of the CLI's stderr)."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
