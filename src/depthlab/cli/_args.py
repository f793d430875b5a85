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


def scheme_help() -> str:
    """The ``--scheme`` help: the registry's names and its baseline (generated, never hand-kept)."""
    from depthlab.schemes import BASELINE_SCHEME, SCHEMES

    return f"normalization scheme (default {BASELINE_SCHEME}): {', '.join(SCHEMES)}; see 'schemes' below"


def schemes_epilog() -> str:
    """One line per registered scheme (its ``summary`` and options), for a command's help text."""
    from depthlab.schemes import SCHEMES

    width = max(map(len, SCHEMES))
    lines = ["schemes (options with --set NAME=VALUE):"]
    for s in SCHEMES.values():
        opts = ", ".join(f"{o.name}={o.default}" for o in s.options)
        lines.append(f"  {s.name:<{width}}  {s.summary}" + (f"  [{opts}]" if opts else ""))
    return "\n".join(lines)
