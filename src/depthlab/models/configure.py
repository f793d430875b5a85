"""Configs that the registry has checked: a preset plus overrides, or a config plus overrides.

    cfg = from_preset("llama-130m", scheme="lns", lns_position="after-branch")   # a ModelConfig
    cfg = from_preset("vit-tiny", scheme="lns:position=after-branch")           # a ViTConfig; a scheme variant
    cfg = configure(cfg, n_layers=24, position="before-norm")

An override is either a field of the config or an option of the (new) scheme, by its name or its
alias; ``scheme`` may be a variant string ``name:key=value``, parsed once by the registry
(:func:`depthlab.models.schemes.parse_scheme_spec`). This is the layer above both ``depthlab.models.config`` (shapes)
and ``depthlab.models.schemes`` (what a scheme name means), so neither of those imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from depthlab.base.errors import ConfigError, choices
from depthlab.models.config import ModelConfig, SchemedConfig, ViTConfig
from depthlab.models.presets import PRESETS, VIT_PRESETS
from depthlab.models.schemes import SCHEMES, SchemeSpec, get_scheme, parse_scheme_spec

__all__ = ["from_preset", "configure", "checked", "scheme_option", "ALL_PRESETS"]

#: Every preset of every family (decoders, then ViTs).
ALL_PRESETS: tuple[str, ...] = (*PRESETS, *VIT_PRESETS)


def checked(cfg: SchemedConfig) -> SchemedConfig:
    """``cfg`` with its scheme and options validated by the registry and stored canonically."""
    scheme = get_scheme(cfg.scheme)
    canonical = scheme.canonical(cfg.scheme_options)
    cfg = cfg if canonical == cfg.scheme_options else dataclasses.replace(cfg, scheme_options=canonical)
    scheme.validate(cfg)
    return cfg


def configure(base: SchemedConfig, **overrides: Any) -> SchemedConfig:
    """``base`` (a ModelConfig, a ViTConfig, ...) with fields and scheme options replaced, checked.
    ``scheme`` may be a name, a variant string (``lns:position=after-branch``) or a :class:`SchemeSpec`,
    whose options join the others."""
    spec = overrides.pop("scheme", None)
    if spec is not None:
        spec = spec if isinstance(spec, SchemeSpec) else parse_scheme_spec(spec)
        overrides = {"scheme": spec.name, **spec.options, **overrides}
    fields = {f.name for f in dataclasses.fields(type(base))}
    field_overrides = {k: v for k, v in overrides.items() if k in fields}
    option_overrides = {k: v for k, v in overrides.items() if k not in fields}
    cfg = base.replace(**field_overrides)
    scheme = get_scheme(cfg.scheme)
    own = {k: v for k, v in option_overrides.items() if any(k in (o.name, o.alias) for o in scheme.options)}
    for key, value in option_overrides.items():
        if key not in own and not _is_foreign_default(key, value):
            takers = [n for n, s in SCHEMES.items() if any(key in (o.name, o.alias) for o in s.options)]
            where = f"an option of schemes {', '.join(takers)}" if takers else "an option of any scheme"
            raise ConfigError(f"unknown setting {key!r} (= {value!r}) for scheme {cfg.scheme!r}: not a "
                              f"{type(base).__name__} field ({', '.join(sorted(fields))}), and {where}")
    return checked(dataclasses.replace(cfg, scheme_options={**cfg.scheme_options, **own}))


def _is_foreign_default(key: str, value: Any) -> bool:
    """Another scheme's option set to its default: a no-op for this scheme, accepted (``lns_position=
    "after-norm"`` on ``pre``), so one set of settings can serve every scheme of a comparison."""
    for other in SCHEMES.values():
        for opt in other.options:
            if key in (opt.name, opt.alias):
                try:
                    return opt.parse(key, value) == opt.default
                except ConfigError:
                    return False
    return False


def from_preset(name: str, **overrides: Any) -> SchemedConfig:
    """The preset ``name`` with fields or scheme options replaced by ``overrides`` (e.g. ``n_layers=2``): a
    ``ModelConfig`` for a decoder preset (:data:`~depthlab.models.presets.PRESETS`), a ``ViTConfig`` for a ViT one."""
    if name in PRESETS:
        base: SchemedConfig = ModelConfig(name=name, **PRESETS[name])
    elif name in VIT_PRESETS:
        base = ViTConfig(name=name, **VIT_PRESETS[name])
    else:
        raise ConfigError(f"unknown preset {name!r}; {choices(ALL_PRESETS)}")
    scheme = overrides.get("scheme")
    if isinstance(scheme, str):
        parse_scheme_spec(scheme)  # an unknown scheme is named before any option of it
    return configure(base, **overrides)


def scheme_option(cfg: ModelConfig, name: str) -> Any:
    """The value of option ``name`` of ``cfg``'s scheme (its default when not set)."""
    scheme = get_scheme(cfg.scheme)
    return scheme.resolve(cfg.scheme_options)[scheme.option(name).name]
