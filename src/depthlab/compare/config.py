"""A comparison's settings: plain data, no torch (the command line derives its flags from these fields).

    cfg = CompareConfig(schemes=["pre", "lns:position=after-branch"], preset="tiny", train=TrainConfig(steps=300))
    cfg.schemes           # [SchemeSpec("pre"), SchemeSpec("lns", {"position": "after-branch"})]: parsed once, here
    cfg.validate()        # every scheme variant, preset, model and training setting checked before any run

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

    def __post_init__(self) -> None:
        """Each scheme variant given as text is parsed, once: an unknown scheme or option fails here, in one line."""
        from depthlab.models.schemes import SchemeSpec, parse_scheme_spec

        self.schemes = [s if isinstance(s, SchemeSpec) else parse_scheme_spec(s) for s in self.schemes]
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
        return d
