"""Command-line flags derived from the library's option dataclasses, and ``--config FILE``.

    section = Section("train", TrainConfig)                       # every field becomes a flag
    section.add_to(parser)                                        # --lr, --steps, --pack/--no-pack, ...
    add_config_flag(parser)                                       # --config run.yaml (or a run's config.json)
    args = parser.parse_args(argv); apply_config_file(args, parser)   # file < command line
    TrainConfig(**section.given(args))                            # only what the file or the flags set

Each field's flag is ``--field-name`` (a section may prefix or rename), its type comes from the field's
annotation (``int``, ``float``, ``str``, ``bool`` as ``--x/--no-x``, ``list[int]`` as ``1,2,3``, optionals of
those), its help from the comment beside the field in the dataclass's source, its group from the
``# ---- group`` comment above it. Every derived flag defaults to None ("not given"), so a dataclass keeps
its own defaults and a config file fills only what the command line leaves unset.

A config file (YAML or JSON) sets any flag of the command by its dest (``lr: 3e-4``, ``out: runs/x``) or
by section (``train: {lr: 3e-4}``, ``model: {n_layers: 8}``); unknown keys are refused, naming the valid
ones. A run's saved ``config.json`` is itself a valid ``--config``: its provenance keys (versions, command,
fingerprints) are recognised and skipped. This module imports no torch: ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, choices, first_line

#: Keys of a run's config.json that record where it came from, not how to run it (skipped by --config).
PROVENANCE_KEYS = ("versions", "command", "command_resume", "world_size", "family", "data_fingerprint", "tokenizer",
                   "resume_changes", "init_from", "finetune", "pruned", "defaulted", "optimizer_split")


# ---------------------------------------------------------------------------------------------- help texts
@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """Field name -> (its ``# comment``, the ``# ---- group`` heading above it) from ``cls``'s source."""
    try:
        lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    out, group = {}, ""
    for line in lines:
        stripped = line.strip()
        heading = re.match(r"#\s*-{2,}\s*(.+)", stripped)
        if heading:
            group = heading.group(1).strip()
            continue
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*:[^=#]*(?:=[^#]*)?#\s*(.*)", stripped)
        if m and not stripped.startswith(("def ", "@", "return ")):
            out[m.group(1)] = (m.group(2).strip(), group)
    return out


# ---------------------------------------------------------------------------------------------- types
def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:  # "x", "1.5", "," or "": no list of integers
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _str_list(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def _kinds(annotation: Any) -> tuple[str, ...]:
    """The plain type names in an annotation string: ``"int | None"`` -> ("int", "None")."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return tuple(part.strip() for part in text.split("|"))


def flag_type(annotation: Any) -> tuple[str, Callable[[str], Any] | None]:
    """("bool" | "value" | "skip", parser of a command-line string) for a field's annotation."""
    kinds = [k for k in _kinds(annotation) if k != "None"]
    if kinds == ["bool"]:
        return "bool", None
    if kinds == ["int"]:
        return "value", int
    if kinds in (["float"], ["int", "float"], ["float", "int"]):
        return "value", float
    if kinds == ["str"]:
        return "value", str
    if kinds in (["list[int]"], ["tuple[int, ...]"]):
        return "value", _int_list
    if kinds in (["list[str]"], ["tuple[str, ...]"]):
        return "value", _str_list
    return "skip", None


# ---------------------------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class Section:
    """One option dataclass on one command: its fields as flags, read back as ``{field: value}``."""

    name: str  # the key of a config file's section, and the dest prefix: "train" -> args."train.lr"
    cls: type
    prefix: str = ""  # flag prefix, e.g. "diag-" for --diag-tokens
    include: tuple[str, ...] | None = None  # only these fields (None: all that have a flag type)
    exclude: tuple[str, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)  # field -> flag name (no dashes), e.g. {"mode": "heal"}
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # field -> the values it takes
    helps: dict[str, str] = field(default_factory=dict)  # field -> the whole help (no default added), over the comment
    title: str | None = None  # one help group for every field (None: the source's ``# ----`` groups)
    types: dict[str, str] = field(default_factory=dict)  # field -> the annotation its flag reads (the class parses it)

    def kind(self, f: dataclasses.Field) -> tuple[str, Callable[[str], Any] | None]:
        """:func:`flag_type` of the field (``types`` first: e.g. ``list[str]`` for a field the dataclass parses)."""
        return flag_type(self.types.get(f.name, f.type))

    def fields(self) -> list[dataclasses.Field]:
        out = []
        for f in dataclasses.fields(self.cls):
            if f.name in self.exclude or (self.include is not None and f.name not in self.include):
                continue
            if self.kind(f)[0] != "skip":
                out.append(f)
        return out

    def flag(self, name: str) -> str:
        return "--" + self.rename.get(name, self.prefix + name).replace("_", "-")

    def dest(self, name: str) -> str:
        return f"{self.name}.{name}"

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add one flag per field (help groups from the source unless ``title`` says one)."""
        docs, groups = field_docs(self.cls), {}
        defaults = {f.name: f.default for f in dataclasses.fields(self.cls)}
        for f in self.fields():
            comment, heading = docs.get(f.name, ("", ""))
            title = self.title or heading or self.name
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            kind, conv = self.kind(f)
            default = defaults[f.name]
            shown = "" if default is dataclasses.MISSING or default is None or kind == "bool" or f.name in self.helps \
                else f" (default {default})"
            text = (self.helps.get(f.name) or comment or f.name.replace("_", " ")) + shown
            kwargs: dict[str, Any] = dict(dest=self.dest(f.name), default=None, help=text.replace("%", "%%"))
            if kind == "bool":
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs.update(type=conv, metavar="LIST" if conv in (_int_list, _str_list)
                              else self.flag(f.name).upper().split("-")[-1])
                if f.name in self.choices:
                    kwargs.update(choices=self.choices[f.name], metavar=None)
            groups[title].add_argument(self.flag(f.name), **kwargs)

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """``{field: value}`` for the fields the command line or the config file set."""
        out = {}
        for f in self.fields():
            value = getattr(args, self.dest(f.name), None)
            if value is not None:
                out[f.name] = value
        return out


# ---------------------------------------------------------------------------------------------- --config
def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML, JSON or TOML file setting any of these options (by flag name without dashes, or by "
                             "section: train:, model:, ...); flags on the command line override it; a run's "
                             "config.json is a valid --config")
    parser.set_defaults(_parser=parser)


#: --config formats by file suffix; any other suffix is read as YAML.
CONFIG_FORMATS = {".json": "JSON", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML"}


def read_config_file(path: str) -> dict[str, Any]:
    """The mapping in a YAML / JSON / TOML file; DepthlabError (one line) when it is missing or not a mapping."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise DepthlabError(f"--config {path!r} is a directory; give a YAML or JSON file")
    if not p.is_file():
        raise DepthlabError(f"--config {path!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DepthlabError(f"--config {path!r} cannot be read: {first_line(err)}") from None
    kind = CONFIG_FORMATS.get(p.suffix.lower(), "YAML")
    try:
        if kind == "JSON":
            data = json.loads(text)
        elif kind == "TOML":  # read as TOML (a .toml read as YAML was a string, refused as "got str")
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # noqa: BLE001 - json / toml / yaml errors: one line
        raise DepthlabError(f"--config {path!r} is not valid {kind}: {first_line(err)[:200]}") from None
    if not isinstance(data, dict):
        raise DepthlabError(f"--config {path!r} must hold a mapping of option names to values, got "
                            f"{type(data).__name__}")
    return data


#: Strings a config file may give a true/false option (YAML's own spellings, quoted).
BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _typed(action: argparse.Action, key: str, value: Any) -> Any:
    """``value`` of a config file as the flag's type, or DepthlabError text naming what the key takes."""
    conv = action.type
    if isinstance(action, argparse.BooleanOptionalAction) or (action.nargs == 0 and isinstance(action.const, bool)):
        word = BOOL_WORDS.get(value.strip().lower()) if isinstance(value, str) else None
        if isinstance(value, bool) or word is not None:
            return value if isinstance(value, bool) else word
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if isinstance(action, argparse._AppendAction):  # --set KEY=VALUE, repeatable: one string or a list of them
        if isinstance(value, dict):  # or a mapping: {n_layers: 8} -> n_layers=8, {seq_len: [256, 1024]} -> seq_len=256,1024
            value = [f"{k}={','.join(str(v) for v in vs) if isinstance(vs, list) else vs}" for k, vs in value.items()]
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings, got {value!r}")
        return value
    if conv is _int_list and isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if conv in (_int_list, _str_list) and isinstance(value, (list, tuple)):
        kind = int if conv is _int_list else str
        if not value or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{key} must be a list of {'integers' if kind is int else 'strings'} (or a "
                             f"comma-separated string), got {value!r}")
        return list(value)
    if isinstance(value, str):
        if conv is int:  # "1e26", "3.0": integral numbers written as floats
            try:
                return int(value)
            except ValueError:
                number = float(value)
                if not number.is_integer():
                    raise ValueError(f"{key} must be an integer, got {value!r}") from None
                return int(number)
        return conv(value) if conv is not None else value
    if conv is int and isinstance(value, float) and value.is_integer():
        return int(value)  # JSON's 1e26
    expected = {int: (int,), float: (int, float), str: (), None: (str,)}.get(conv, ())
    if isinstance(value, bool) or not isinstance(value, expected):
        what = {int: "an integer", float: "a number", _int_list: "a list of integers", _str_list: "a list of strings"}
        raise ValueError(f"{key} must be {what.get(conv, 'a string')}, got {value!r} ({type(value).__name__})")
    return float(value) if conv is float else value


def _coerce(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """A config value as the flag would have parsed it (strings through the flag's type; the type of every other
    value checked; choices checked): one line naming the file, the key and what it takes."""
    try:
        value = _typed(action, key, value)
    except (ValueError, TypeError, OverflowError, argparse.ArgumentTypeError) as err:
        text = first_line(err)
        raise DepthlabError(f"--config {path!r}: " + (text if text.startswith(key) else f"{key}={value!r}: {text}")) \
            from None
    if action.choices is not None and value not in action.choices:
        raise DepthlabError(f"--config {path!r}: {key}={value!r}; {choices(action.choices)}")
    return value


def _flatten(data: dict[str, Any], sections: Iterable[str]) -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` for known sections; other keys as they are."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in sections and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill every option the command line left unset from ``args.config`` (no-op without one). Commands
    that build a model (``model_flags``) also take a ``model:`` section (``args.model_section``) and the
    ``family`` a run's config.json records (``args.config_family``)."""
    path = getattr(args, "config", None)
    parser = getattr(args, "_parser", None)
    if not path or parser is None:
        return
    data = read_config_file(path)
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config", "_parser", "version")}
    sections = {d.split(".", 1)[0] for d in actions if "." in d}
    takes_model = getattr(args, "accepts_model_section", False)
    if takes_model and "model" in data:
        if not isinstance(data["model"], dict):
            raise DepthlabError(f"--config {path!r}: 'model' must be a mapping of model fields / scheme options")
        args.model_section, args.config_family = data.pop("model"), data.get("family")
    by_field = _unique_fields(actions)
    flags = {s.lstrip("-").replace("-", "_") for a in actions.values() for s in a.option_strings if s.startswith("--")}
    valid = sorted({f for f in flags if not f.startswith("no_")} | sections | ({"model"} if takes_model else set()))
    for key, value in _flatten(data, sections).items():
        dest = key if key in actions else by_field.get(key.replace("-", "_"))
        if dest is None:
            if key in PROVENANCE_KEYS or key.split(".", 1)[0] in PROVENANCE_KEYS:
                continue
            raise DepthlabError(f"--config {path!r}: unknown key {key!r}; valid keys: {', '.join(valid)}")
        if value is not None and getattr(args, dest, None) is None:  # null in a file: the option's default
            setattr(args, dest, _coerce(actions[dest], key, value, path))


def _unique_fields(actions: dict[str, argparse.Action]) -> dict[str, str]:
    """Flag or field name -> dest, for names that mean one option only (``lr`` -> ``train.lr``). A flag's own name
    wins over a field of the same name in another section (theory: ``depth`` is ``--depth``, not ``--empirical-depth``,
    whose field is ``depth`` too)."""
    def unique(pairs: list[tuple[str, str]]) -> dict[str, str]:
        names: dict[str, set[str]] = {}
        for name, dest in pairs:
            names.setdefault(name, set()).add(dest)
        return {name: next(iter(dests)) for name, dests in names.items() if len(dests) == 1}

    flags = [(s.lstrip("-").replace("-", "_"), dest) for dest, a in actions.items() for s in a.option_strings]
    fields = [(dest.split(".", 1)[-1], dest) for dest in actions]
    by_flag = unique(flags)
    return {**unique(fields), **by_flag}


__all__ = ["Section", "add_config_flag", "apply_config_file", "read_config_file", "field_docs", "flag_type",
           "PROVENANCE_KEYS"]
