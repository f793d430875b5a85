"""Argument helpers shared by several subcommands (not a subcommand: the leading _ hides it)."""

from __future__ import annotations

import json


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: list[str] | None) -> dict:
    """``--set KEY=VALUE`` pairs -> ModelConfig overrides (values parsed as JSON when they are)."""
    from depthlab.errors import ConfigError

    out = {}
    for pair in pairs or []:
        key, sep, val = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip().replace("-", "_")] = _value(val)
    return out
