"""Argument helpers shared by several subcommands (not a subcommand: the leading _ hides it)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: list[str] | None) -> dict:
    """``--set KEY=VALUE`` pairs -> config overrides (values parsed as JSON when they are)."""
    from depthlab.base.errors import ConfigError

    out = {}
    for pair in pairs or []:
        key, sep, val = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip().replace("-", "_")] = _value(val)
    return out


def model_flags(p: argparse.ArgumentParser, scheme_help: str, preset_help: str | None = None) -> None:
    """``--preset``, ``--scheme``, ``--set``: the model a command builds (a config file's ``model:`` section too)."""
    m = p.add_argument_group("model")
    m.add_argument("--preset", help=preset_help or "model preset (default tiny): an LM preset (depthlab.PRESETS) or a "
                   "ViT preset (vit-tiny, vit-s; then --data digits | IMAGE_DIR | hf:NAME)")
    m.add_argument("--scheme", help=scheme_help)
    m.add_argument("--set", action="append", metavar="KEY=VALUE", dest="model_set",
                   help="override a model config field or a scheme option, e.g. --set n_layers=8 (repeatable)")
    p.set_defaults(accepts_model_section=True, model_section=None, config_family=None)


def check_preset(args: argparse.Namespace) -> None:
    """``--preset`` checked by name before the heavy imports (torch, 4-6 s on a loaded machine): an unknown one is
    refused as fast as a bad flag (:data:`depthlab.models.configure.ALL_PRESETS`: a registry import, no torch)."""
    from depthlab.base.errors import ConfigError, choices
    from depthlab.models.configure import ALL_PRESETS

    if args.preset and args.preset not in ALL_PRESETS:
        raise ConfigError(f"unknown preset {args.preset!r}; {choices(ALL_PRESETS)}")


def model_from_args(args: argparse.Namespace, base: Any = None) -> Any:
    """The model config the arguments describe: ``--preset`` (else the config file's ``model:`` section, whose
    ``name`` may be a preset; else ``base``; else ``tiny``), then the section's fields and scheme options, then
    ``--scheme`` and ``--set``. A run's saved ``model`` section rebuilds exactly that model."""
    from depthlab.models.configure import ALL_PRESETS, configure, from_preset
    from depthlab.models.kinds import kind_named

    section = dict(args.model_section or {})
    if args.preset:
        cfg = from_preset(args.preset)
        section.pop("name", None)
    elif base is not None:
        cfg = base
    elif section.get("name") in ALL_PRESETS:
        cfg = from_preset(section["name"])
    elif section:
        cfg = kind_named(args.config_family).config_type()
    else:
        cfg = from_preset("tiny")
    if args.scheme:
        section.pop("scheme_options", None)  # the file's options belong to the file's scheme
        section["scheme"] = args.scheme  # before --set, so that --set can name the scheme's options
    overrides = {**section, **parse_overrides(args.model_set)}
    return configure(cfg, **overrides) if overrides else cfg


def scheme_help() -> str:
    """The ``--scheme`` help: the registry's names and its baseline (generated, never hand-kept)."""
    from depthlab.models.schemes import BASELINE_SCHEME, SCHEMES

    return (f"normalization scheme (default {BASELINE_SCHEME}), or a variant NAME:KEY=VALUE: {', '.join(SCHEMES)}; "
            "see 'schemes' below")


def schemes_epilog() -> str:
    """One line per registered scheme (its ``summary`` and options), for a command's help text."""
    from depthlab.models.schemes import SCHEMES

    width = max(map(len, SCHEMES))
    lines = ["schemes (options with --set NAME=VALUE or --scheme NAME:KEY=VALUE):"]
    for s in SCHEMES.values():
        opts = ", ".join(f"{o.name}={o.default}" for o in s.options)
        lines.append(f"  {s.name:<{width}}  {s.summary}" + (f"  [{opts}]" if opts else ""))
    return "\n".join(lines)


def precision_flags(p: argparse.ArgumentParser, auto_weights: str) -> None:
    """``--weights`` and ``--dtype`` of a command that measures a loaded model (diagnose, evaluate, prune): the one
    choice set and the one meaning of every command (``depthlab.base.precision``); ``auto_weights`` says what the
    command's automatic weights are."""
    from depthlab.base.precision import DTYPE_HELP, PRECISIONS, WEIGHTS_HELP

    p.add_argument("--weights", default=None, choices=PRECISIONS, help=WEIGHTS_HELP.format(auto=auto_weights))
    p.add_argument("--dtype", default=None, choices=PRECISIONS, help=DTYPE_HELP)


def precision_of(args: argparse.Namespace) -> tuple[str, str]:
    """``(weights, compute)`` as given (each "auto" when unset). The spelling of earlier releases, ``--dtype X`` with
    no ``--weights``, keeps its result (weights X, compute automatic) for one release, with a one-line note on
    stderr saying how to write it now."""
    import sys

    if args.dtype not in (None, "auto") and args.weights is None:
        print(f"depthlab {args.command}: note: --dtype {args.dtype} without --weights is read as --weights "
              f"{args.dtype}, as before; --dtype is now the compute precision on every command: write --weights "
              f"{args.dtype} (the old reading goes in the next release)", file=sys.stderr)
        return args.dtype, "auto"
    return args.weights or "auto", args.dtype or "auto"


def device_precision(args: argparse.Namespace, auto_weights: str | None = None) -> tuple[Any, Any, Any]:
    """``(device, weights dtype, compute dtype)`` that ``--device``, ``--weights`` and ``--dtype`` mean
    (``depthlab.base.devices``, ``depthlab.base.precision``); ``auto_weights``: the command's automatic weights."""
    from depthlab.base.devices import resolve_device
    from depthlab.base.precision import resolve_precision

    weights, compute = precision_of(args)
    device = resolve_device(args.device)
    return (device, *resolve_precision(device, weights, compute, auto_weights))


def refuse_early(target: Any, capability: str, opts: Any = None) -> None:
    """What the command's checks will refuse for ``target`` from its config.json alone (:mod:`depthlab.hf.preflight`),
    said before torch is imported: a model depthlab cannot read is refused in well under two seconds."""
    from depthlab.hf.preflight import check

    check(target, capability, stream=getattr(opts, "stream", None), tower=getattr(opts, "tower", "language"))
