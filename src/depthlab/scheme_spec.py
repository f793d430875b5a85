"""Scheme variants as one string: ``name[:key=value[:key=value]]``, parsed and checked by the registry.

    spec = parse_scheme_spec("lns:position=after-branch")
    spec.name, spec.options    # "lns", {"position": "after-branch"}
    spec.label                 # "lns:position=after-branch"   (tables and figures)
    spec.dirname               # "lns-position-after-branch"   (run directories)

Options are the scheme's own (by name or alias, e.g. ``lns_position``); values are parsed by the option
(numbers from text). The label lists only options that differ from their defaults, in the registry's
order, so ``lns:position=after-norm`` and ``lns`` are the same variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from depthlab.errors import ConfigError, DepthlabError, choices
from depthlab.schemes import SCHEMES, get_scheme


@dataclass(frozen=True)
class SchemeSpec:
    name: str  # a registry key
    options: dict[str, Any] = field(default_factory=dict)  # canonical: non-default options under their own names

    @property
    def label(self) -> str:
        return self.name + "".join(f":{k}={_text(v)}" for k, v in self.options.items())

    @property
    def dirname(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.label.replace(":", "-").replace("=", "-")).strip("-")


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_scheme_spec(text: str) -> SchemeSpec:
    """``name[:key=value...]`` -> :class:`SchemeSpec`; DepthlabError in one line naming what is wrong
    (an unknown scheme, an unknown option with the scheme's options, a bad value with its choices)."""
    name, *pairs = [p.strip() for p in str(text).strip().split(":")]
    if name not in SCHEMES:
        raise DepthlabError(f"unknown scheme {name!r} in {text!r}; {choices(SCHEMES)}")
    scheme = get_scheme(name)
    own = ", ".join(o.name for o in scheme.options) or "none"
    given: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        opt = next((o for o in scheme.options if key in (o.name, o.alias)), None)
        if not sep or not key or opt is None:
            what = f"option {key!r}" if sep and key else f"part {pair!r} (want key=value)"
            raise DepthlabError(f"unknown {what} in scheme variant {text!r}; scheme {name!r} has options: {own}")
        if opt.name in given:
            raise DepthlabError(f"option {opt.name!r} given twice in scheme variant {text!r}")
        try:
            given[opt.name] = opt.parse(f"{name} option {opt.name}", value.strip())
        except ConfigError as err:
            raise DepthlabError(f"scheme variant {text!r}: {err}") from None
    return SchemeSpec(name, scheme.canonical(given))
