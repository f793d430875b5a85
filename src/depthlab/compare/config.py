"""A comparison's settings: plain data, no torch (the command line derives its flags from these fields).

    cfg = CompareConfig(schemes=["pre", "lns:position=after-branch"], preset="tiny", train=TrainConfig(steps=300))
    cfg.schemes           # [SchemeSpec("pre"), SchemeSpec("lns", {"position": "after-branch"})]: parsed once, here
    cfg.validate()        # every scheme variant, preset, model and training setting checked before any run

A regime sweep (``sweep``) runs the whole comparison once per cell of a grid of training settings, each cell its own
compare under ``cells/`` (:mod:`depthlab.compare.sweep`)::

    cfg = CompareConfig(schemes=["pre", "lns"], sweep={"weight_decay": [0, 0.1], "seq_len": [256, 1024]})
    [c.label for c in cfg.cells()]   # ["weight_decay=0 seq_len=256", "weight_decay=0 seq_len=1024", ...]

A scheme variant is parsed once, when the settings are made (:func:`depthlab.models.schemes.parse_scheme_spec`);
everything downstream (run names and directories, model configs, tables) reads the parsed
:class:`~depthlab.models.schemes.SchemeSpec`. ``compare.json`` records each variant as its label
(``lns:position=after-branch``), the string it parses back from, as it always did.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.base.errors import DepthlabError, check_int, choices
from depthlab.train.config import MAX_SEED, TrainConfig

if TYPE_CHECKING:
    from depthlab.models.schemes import SchemeSpec


@dataclass
class Downstream:
    """Fine-tuning and evaluation settings shared by every run of a compare (None = the SFT defaults)."""

    finetune: str | None = None  # SFT data for every run: builtin-sft | FILE.json | FILE.jsonl; None: no fine-tuning
    tasks: str | None = None  # comma-separated tasks as for `depthlab evaluate` (FILE.jsonl, builtin-mc, hf:NAME)
    steps: int | None = None  # fine-tuning steps (default: 3 epochs)
    lr: float | None = None  # fine-tuning peak lr (default 1e-4)
    batch_size: int | None = None  # fine-tuning batch in examples (default 16)
    seq_len: int | None = None  # fine-tuning tokens per example (default 256)
    limit: int | None = None  # score the first N items of each task
    eval_batch_size: int = 16  # sequences per forward when scoring the tasks

    @property
    def active(self) -> bool:
        return bool(self.finetune or self.tasks)

    def validate(self, family: str = "lm") -> None:
        """Bad data or task specs (or a model family without text, e.g. ViT) fail here, before
        anything is trained."""
        if self.active and family != "lm":
            raise DepthlabError(f"--finetune / --eval need language models; this compare trains {family} models")
        if self.finetune:
            from depthlab.train.finetune import sft_records

            sft_records(self.finetune)
        if self.tasks:
            from depthlab.analysis.evaluate import load_tasks

            load_tasks(self.tasks, self.limit)
        elif self.finetune:
            raise DepthlabError("--finetune needs --eval TASKS to score the fine-tuned models on")
        for name in ("steps", "batch_size", "seq_len", "limit"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise DepthlabError(f"downstream {name} must be positive, got {v}")

    def train_config(self, device: str | None, seed: int) -> TrainConfig:
        return TrainConfig(data=self.finetune, steps=self.steps, lr=self.lr, batch_size=self.batch_size,
                           seq_len=self.seq_len, seed=seed, device=device, pack=False, eval_every=0, variance_every=0)


def diagnose_defaults(preset: str, train_data: str | None) -> dict[str, Any]:
    """What a compare diagnoses its runs on unless told otherwise: 16384 held-out tokens of the text they trained on
    (its validation split, as ``diagnose`` reads a depthlab run), so a compare on your data is diagnosed on your
    data, not the built-in corpus. ViT runs diagnose on their own held-out images whatever ``data`` says."""
    from depthlab.models.kinds import kind_of_preset

    lm = kind_of_preset(preset).name == "lm"
    return {"tokens": 16384, "progress": False, **({"data": train_data} if lm and train_data else {})}


#: What a sweep may vary: key -> (section, field, the value's type). ``depth`` is the model's ``n_layers``.
SWEEP_KEYS: dict[str, tuple[str, str, type]] = {
    "weight_decay": ("train", "weight_decay", float),
    "seq_len": ("train", "seq_len", int),
    "optimizer": ("train", "optimizer", str),
    "lr": ("train", "lr", float),
    "depth": ("model", "n_layers", int),
}


def _sweep_value(key: str, text: Any) -> Any:
    """One value of sweep axis ``key`` as its type (from text or a config file's number), or DepthlabError."""
    kind = SWEEP_KEYS[key][2]
    raw = text.strip() if isinstance(text, str) else text
    if raw == "" or raw is None:
        raise DepthlabError(f"--sweep {key}: an empty value; give comma-separated values, e.g. --sweep {key}=a,b")
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = kind(raw) if kind is not int else int(float(raw)) if float(raw).is_integer() else None
    except (TypeError, ValueError):
        value = None
    if value is None:
        what = {int: "an integer", float: "a number", str: "a name"}[kind]
        raise DepthlabError(f"--sweep {key}: {raw!r} is not {what}")
    return value


def parse_sweep(given: Any) -> dict[str, list[Any]]:
    """``{key: [values]}`` from ``["weight_decay=0,0.1", ...]`` (the repeatable flag) or a mapping
    ``{weight_decay: [0, 0.1]}`` (a config file, the library): keys of :data:`SWEEP_KEYS`, values typed, none empty,
    none repeated. DepthlabError (one line) names what is wrong."""
    if not given:
        return {}
    if isinstance(given, dict):
        pairs = [(k, v if isinstance(v, (list, tuple)) else str(v).split(",")) for k, v in given.items()]
    elif isinstance(given, (list, tuple)) and all(isinstance(g, str) for g in given):
        pairs = []
        for text in given:
            key, sep, values = text.partition("=")
            if not sep or not key.strip():
                raise DepthlabError(f"--sweep expects KEY=V1,V2,..., got {text!r}")
            pairs.append((key, values.split(",")))
    else:
        raise DepthlabError(f"--sweep takes KEY=V1,V2 strings or a mapping of keys to lists, got {given!r}")
    out: dict[str, list[Any]] = {}
    for key, values in pairs:
        key = str(key).strip().replace("-", "_")
        if key not in SWEEP_KEYS:
            raise DepthlabError(f"unknown sweep key {key!r}; {choices(SWEEP_KEYS)}")
        if key in out:
            raise DepthlabError(f"--sweep {key} given twice; list all its values in one --sweep {key}=a,b")
        typed = [_sweep_value(key, v) for v in values]
        if not typed:
            raise DepthlabError(f"--sweep {key}: no values; give comma-separated values, e.g. --sweep {key}=a,b")
        dupes = sorted({str(v) for v in typed if typed.count(v) > 1})
        if dupes:
            raise DepthlabError(f"--sweep {key}: value {', '.join(dupes)} listed twice; list each value once")
        out[key] = typed
    return out


def _shown(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Cell:
    """One cell of a sweep: a value per swept key."""

    values: tuple[tuple[str, Any], ...]  # (key, value) in the sweep's key order

    @property
    def label(self) -> str:
        """``weight_decay=0.1 seq_len=256`` (tables and figures)."""
        return " ".join(f"{k}={_shown(v)}" for k, v in self.values)

    @property
    def dirname(self) -> str:
        """``weight_decay-0.1_seq_len-256`` (its compare directory under cells/)."""
        return "_".join(f"{k}-{_shown(v)}" for k, v in self.values).replace("/", "-")


@dataclass
class CompareConfig:
    """Every (scheme variant, seed) run is trained with ``train``, diagnosed with ``diagnose`` and, when
    ``downstream`` is active, fine-tuned and evaluated; only the scheme differs between runs of a seed."""

    schemes: list[SchemeSpec]  # scheme variants, e.g. pre,lns,lns:position=after-branch (strings are parsed); pre: deltas
    preset: str = "tiny"  # model preset shared by every run (an LM or a ViT preset)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields to change (not scheme)
    seeds: list[int] = field(default_factory=lambda: [0])  # one run per scheme and seed
    jobs: int = 1  # runs trained side by side, the machine's cores split between them
    train: TrainConfig = field(default_factory=TrainConfig)  # shared training settings (seed set per run)
    diagnose: DiagnoseOptions | None = None  # None: 16384 tokens of the training data's held-out text (diagnose_defaults)
    downstream: Downstream = field(default_factory=Downstream)  # --finetune / --eval (compare.downstream)
    sweep: dict[str, list[Any]] = field(default_factory=dict)  # regime grid: key -> values (SWEEP_KEYS); {}: one cell

    def __post_init__(self) -> None:
        """Each scheme variant given as text is parsed, once: an unknown scheme or option fails here, in one line;
        so is the sweep."""
        from depthlab.models.schemes import SchemeSpec, parse_scheme_spec

        self.schemes = [s if isinstance(s, SchemeSpec) else parse_scheme_spec(s) for s in self.schemes]
        self.sweep = parse_sweep(self.sweep)
        if self.diagnose is None:
            self.diagnose = DiagnoseOptions(**diagnose_defaults(self.preset, self.train.data))

    @property
    def labels(self) -> list[str]:
        """The variants as tables, figures and compare.json name them (``lns:position=after-branch``)."""
        return [spec.label for spec in self.schemes]

    def validate(self) -> None:
        from depthlab.models.kinds import kind_of, kind_of_preset
        from depthlab.models.schemes import SCHEMES
        from depthlab.train.family import train_family

        if not self.schemes:
            raise DepthlabError(f"no schemes to compare; {choices(SCHEMES)}")
        labels = self.labels
        dupes = sorted({s for s in labels if labels.count(s) > 1})
        if dupes:
            raise DepthlabError(f"scheme variant(s) listed twice: {', '.join(dupes)}; list each variant once "
                                "(options at their defaults are the plain scheme)")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise DepthlabError(f"seeds must be distinct and non-empty, got {self.seeds}")
        for seed in self.seeds:
            check_int("--seeds", seed, 0, MAX_SEED)
        kind_of_preset(self.preset)  # an unknown preset names every known one
        if "scheme" in self.model_overrides:
            raise DepthlabError("model_overrides may not set 'scheme': list schemes in `schemes`")
        self.train.check_given()
        check_int("--jobs", self.jobs, 1)
        self.diagnose.validate("--diag-")
        if self.diagnose.mc and not self.diagnose.mc.startswith("hf:"):
            from depthlab.analysis.evaluate import load_tasks

            load_tasks([self.diagnose.mc], self.diagnose.mc_limit)  # read whole now, not after the training
        for spec in self.schemes:  # every model config must be valid before anything is trained
            model_cfg = self.model_config(spec)
            train_family(model_cfg).resolve_train(self.train, model_cfg)
        self.downstream.validate(kind_of(self.model_config(self.schemes[0])).name)
        if "depth" in self.sweep and "n_layers" in self.model_overrides:
            raise DepthlabError("--sweep depth and --set n_layers both set the depth; give one")
        for cell in self.cells() if self.sweep else ():
            self.cell_config(cell).validate()  # every cell's settings (optimizer, seq_len vs the model) checked now

    def cells(self) -> list[Cell]:
        """Every cell of the sweep, the first key varying slowest ([] without a sweep)."""
        import itertools

        keys = list(self.sweep)
        return [Cell(tuple(zip(keys, combo))) for combo in itertools.product(*self.sweep.values())] if keys else []

    def cell_config(self, cell: Cell) -> "CompareConfig":
        """The compare of one cell: these settings with the cell's values, no sweep."""
        train, model = {}, dict(self.model_overrides)
        for key, value in cell.values:
            section, name, _ = SWEEP_KEYS[key]
            (train if section == "train" else model)[name] = value
        return dataclasses.replace(self, train=self.train.replace(**train), model_overrides=model, sweep={})

    def model_config(self, scheme: SchemeSpec) -> Any:
        """The model of one scheme variant: the preset, the overrides and the variant's options."""
        from depthlab.models.configure import from_preset

        return from_preset(self.preset, **self.model_overrides, scheme=scheme)

    def to_dict(self) -> dict[str, Any]:
        """compare.json's settings: each variant as its label; weights as pre-training resolves auto (fp32)."""
        d = dataclasses.asdict(self)
        d["schemes"] = self.labels
        if d["train"]["weights"] == "auto":
            d["train"]["weights"] = "fp32"  # what auto means for pre-training, and what compares recorded before it
        d["diagnose"].pop("progress", None)  # display only
        d.pop("jobs")  # how runs are scheduled, not what they are (a compare may resume with other --jobs)
        if not self.downstream.active:
            d.pop("downstream")  # settings of compares without it stay as they were (resume)
        if not self.sweep:
            d.pop("sweep")  # likewise
        return d
