"""Opening a run directory: the checks before anything is written, then config.json + tokenizer/.

    run = open_run(model_cfg, train_cfg, out, resume, env)   # validate; resolve tokenizer; no writes
    ...                                                       # load data (bad data fails here too)
    config = write_run_dir(run, command, env)                 # rank 0 writes a fresh run's files

A fresh run needs ``out`` absent or empty; a resumed one needs ``out/config.json``, the same
tokenizer, model and :data:`RESUME_KEYS` settings (they fix the data order and the update rule), except
``steps``: a resume with more steps *extends* the run (finished or not; see :func:`extension_rule`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import write_json_atomic
from depthlab.base.provenance import command_line, versions
from depthlab.base.store.integrity import data_fingerprint, fingerprint_change
from depthlab.base.store.lock import check_resumable, stopped_before_first_checkpoint
from depthlab.data import (
    DEFAULT_TOKENIZER,
    Tokenizer,
    build_tokenizer,
    check_tokenizer_spec,
    is_shard_dir,
    iter_documents,
    load_tokenizer,
    shard_meta,
    shard_path,
)
from depthlab.models.config import ModelConfig
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig

#: TrainConfig fields that must match to resume a run (they fix the data order and the update rule).
RESUME_KEYS = ("data", "val_data", "text_field", "tokenizer", "seq_len", "pack", "streaming", "batch_size", "steps",
               "lr", "warmup", "min_lr_ratio", "optimizer", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip",
               "seed")
#: RESUME_KEYS a resume may change when asked explicitly (``--allow-changed lr,warmup,min_lr_ratio``).
CHANGEABLE_KEYS = ("lr", "warmup", "min_lr_ratio")
#: Schedules that follow the run's length: those a fresh run left to their defaults (config.json's
#: ``defaulted``) are planned again for the new length when a resume extends the run.
REPLANNED_KEYS = ("eval_every", "variance_every", "ckpt_every", "track_removal")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSetup:
    """A checked run: resolved configs (vocabulary and tokenizer filled in) and its tokenizer."""

    out: Path
    model_cfg: ModelConfig  # or a ViTConfig (family "vit")
    cfg: TrainConfig
    tokenizer: Tokenizer | None  # None for families without one (ViT)
    resume: bool
    saved: dict[str, Any] | None  # the run's config.json when resuming
    changed: dict[str, list] = field(default_factory=dict)  # key -> [saved, new], allowed on resume
    family: str = "lm"  # depthlab.train.family: which family builds, feeds and evaluates the model
    defaulted: tuple[str, ...] = ()  # REPLANNED_KEYS a fresh run left to their defaults (config.json)
    resumed_at: int | None = None  # the step of the checkpoint a resume starts from


def open_run(model_cfg: ModelConfig, train_cfg: TrainConfig, out: Path, resume: bool, env: D.DistEnv,
             tokenizer: Tokenizer | None = None, allow_changed: tuple[str, ...] = ()) -> RunSetup:
    """Check ``out``, resolve the training config and the tokenizer (``tokenizer``: a fresh run's
    given one, e.g. a fine-tuned model's own), check a resume; writes nothing (a BPE tokenizer may be
    trained into the cache). Raises DepthlabError on any mismatch. ``allow_changed``:
    :data:`CHANGEABLE_KEYS` a resume may change."""
    bad = [k for k in allow_changed if k not in CHANGEABLE_KEYS]
    if bad:
        raise DepthlabError(f"--allow-changed {','.join(bad)}: only {', '.join(CHANGEABLE_KEYS)} may change on resume")
    saved = saved_config(out) if resume else None
    if not resume:
        check_fresh_out(out)
    else:
        train_cfg = resumed_train_config(train_cfg, saved)
    cfg = train_cfg.resolve(model_cfg, env.world_size)
    tok = tokenizer if tokenizer is not None and not resume else resolve_tokenizer(cfg, out, resume, env)
    cfg = cfg.replace(tokenizer=tok.spec)
    model_cfg = model_cfg.replace(vocab_size=embedding_rows(tok.vocab_size, model_cfg, saved, tokenizer is not None))
    changed, at = {}, None
    if saved is not None:
        check_inputs(saved, tok, cfg, out)  # first: a swapped tokenizer also changes vocab_size
        changed, at = check_resume(saved, model_cfg, cfg, out, allow_changed), latest_step(out)
    return RunSetup(out, model_cfg, cfg, tok, resume, saved, changed, defaulted=defaulted_keys(train_cfg),
                    resumed_at=at)


def embedding_rows(n_tokens: int, model_cfg: ModelConfig, saved: dict[str, Any] | None, with_weights: bool) -> int:
    """The model's vocabulary size: the tokenizer's for a fresh model; a model that comes with weights (``with_weights``:
    fine-tuning, ``--init-from``) or a resumed run (``saved``) keeps its embedding when it is padded past the
    tokenizer, as many HF models ship (Qwen2: 151936 rows for 151665 tokens)."""
    rows = (saved.get("model") or {}).get("vocab_size") if saved is not None else \
        model_cfg.vocab_size if with_weights else None
    return rows if isinstance(rows, int) and rows >= n_tokens else n_tokens


def check_fresh_out(out: Path) -> None:
    """Refuse a fresh run's ``out`` that holds something: a run (say so, and how to continue it) or other files
    (name a few)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DepthlabError(f"--out {str(out)!r} is a file, not a directory; choose a new --out")
    held = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    if not held or stopped_before_first_checkpoint(out):  # the latter: nothing to resume, started afresh
        return
    if (out / "config.json").is_file() and ((out / "checkpoint").is_dir() or (out / "metrics.jsonl").is_file()):
        at = latest_step(out)
        where = f"at step {at}" if at else "with no checkpoint yet"
        raise DepthlabError(f"{str(out)!r} is already a run ({where}); continue it with --resume {str(out)!r} "
                            f"(--steps N to extend it) or choose a new --out")
    shown = ", ".join(held[:4]) + (f", … ({len(held)} entries)" if len(held) > 4 else "")
    raise DepthlabError(f"--out {str(out)!r} is not empty and is not a depthlab run (it holds {shown}); "
                        "choose a new or empty directory")


def latest_step(out: Path) -> int:
    """The step of the run's newest complete checkpoint (0 when it has none)."""
    from depthlab.base.store.checkpoint import list_checkpoints

    ckpts = list_checkpoints(out)
    return int(ckpts[-1].name.split("-")[-1]) if ckpts else 0


def defaulted_keys(train_cfg: TrainConfig) -> tuple[str, ...]:
    """The :data:`REPLANNED_KEYS` ``train_cfg`` leaves to their defaults."""
    return tuple(k for k in REPLANNED_KEYS if getattr(train_cfg, k) is None)


def resumed_train_config(train_cfg: TrainConfig, saved: dict[str, Any]) -> TrainConfig:
    """A resume's settings: ``train_cfg``'s where it sets them, the saved run's elsewhere. When the steps change
    (an extension), the schedules the run left to their defaults (:data:`REPLANNED_KEYS`) and that the resume
    does not set to another value are planned again for the new length."""
    before = saved["train"]
    c = train_cfg.to_dict()
    c.update({k: v for k, v in before.items() if k in c and c[k] is None})
    if c["steps"] != before.get("steps"):
        for key in saved.get("defaulted", ()):
            if key in REPLANNED_KEYS and c.get(key) == before.get(key):
                c[key] = None
    return TrainConfig.from_dict(c)


def extension_rule(before: int, after: int, at: int) -> str:
    """What an extension from ``before`` to ``after`` steps does to the learning-rate schedule, in one line (the
    plan line of the resumed run).

    The rule: every step after the checkpoint (``at``) gets the learning rate a run *planned* for ``after`` steps
    gets at that step (:func:`depthlab.train.optim.lr_at` with ``steps = after``; warm-up and cosine over the new
    length), and reads the same batch (the data order does not depend on the length). Steps up to ``at`` keep the
    schedule they were trained with. So an extended run equals a run planned for ``after`` steps exactly when the
    two schedules agreed up to ``at`` (a checkpoint inside a warm-up given in steps); otherwise they differ in
    the first ``at`` steps only, and a finished run, whose cosine had reached its floor, warms back up at once."""
    return (f"extending from {before} to {after} steps at step {at}: steps {at + 1}-{after} follow the {after}-step "
            f"schedule, as a run planned for {after} steps would; steps 1-{at} kept the {before}-step one")


def saved_config(out: Path) -> dict[str, Any]:
    """``out/config.json`` of a run to resume (DepthlabError when there is none)."""
    if not (out / "config.json").is_file():
        raise DepthlabError(f"cannot resume {str(out)!r}: no config.json there (not a run directory)")
    try:
        saved = json.loads((out / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise DepthlabError(f"cannot resume {str(out)!r}: its config.json is unreadable ({err})") from None
    if not isinstance(saved, dict) or not {"model", "train"} <= saved.keys():
        raise DepthlabError(f"cannot resume {str(out)!r}: its config.json is not a depthlab run config")
    check_resumable(out)
    return saved


def check_inputs(saved: dict[str, Any], tok: Tokenizer, cfg: TrainConfig, out: Path) -> None:
    """Refuse a resume whose tokenizer on disk or local data files differ from the ones the run
    started with (the saved tokenizer fingerprint; size, mtime and head hash of each data file)."""
    fp = (saved.get("tokenizer") or {}).get("fingerprint")
    if fp is not None and fp != tok.fingerprint():
        raise DepthlabError(f"cannot resume {str(out)!r}: the tokenizer in {str(out / 'tokenizer')!r} is not the one "
                            f"the run was trained with (fingerprint {tok.fingerprint()}, saved {fp})")
    for key, spec in (("data", cfg.data), ("val_data", cfg.val_data)):
        before = (saved.get("data_fingerprint") or {}).get(key)
        if before is None:
            continue
        change = fingerprint_change(before, data_fingerprint(spec))
        if change:
            raise DepthlabError(f"cannot resume {str(out)!r}: --{key.replace('_', '-')} {spec!r} changed since the "
                                f"run started: {change}")


def resolve_tokenizer(cfg: TrainConfig, out: Path, resume: bool, env: D.DistEnv) -> Tokenizer:
    """The run's tokenizer: the saved one when resuming, a token-shard directory's own, or built
    from ``cfg.tokenizer`` (rank 0 first: it trains / caches, then the others read the cache)."""
    if resume:
        tok = load_tokenizer(out / "tokenizer")
        if cfg.tokenizer is not None and cfg.tokenizer != tok.spec:
            raise DepthlabError(f"cannot resume {str(out)!r}: it was trained with tokenizer {tok.spec!r}, "
                                f"not {cfg.tokenizer!r}")
        return tok
    if is_shard_dir(cfg.data):
        meta = shard_meta(cfg.data)
        if cfg.tokenizer is not None and cfg.tokenizer != meta["tokenizer"]:
            raise DepthlabError(f"token shards {cfg.data!r} were made with tokenizer {meta['tokenizer']!r}, "
                                f"not {cfg.tokenizer!r}")
        return load_tokenizer(shard_path(cfg.data) / "tokenizer")
    spec = cfg.tokenizer or DEFAULT_TOKENIZER
    check_tokenizer_spec(spec)
    iter_documents(cfg.data, "train", cfg.text_field)  # bad data specs fail here, before any training
    tok = None
    for turn in (0, 1):
        if (turn == 0) == env.is_main:
            texts = iter_documents(cfg.data, "train", cfg.text_field) if spec.startswith("bpe:") else None
            tok = build_tokenizer(spec, texts, cache_dir=cfg.cache_dir)
        D.barrier(env)
    return tok


def check_resume(saved: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig, out: Path,
                 allow: tuple[str, ...] = ()) -> dict[str, list]:
    """Raise DepthlabError naming what differs when the saved run has another model or other
    :data:`RESUME_KEYS` settings than ``allow`` lists; returns the allowed changes, key -> [saved, new]. Other
    ``steps`` extend the run (:func:`extension_rule`), down to its latest checkpoint's step at least."""
    if saved["model"] != model_cfg.to_dict():
        diff = sorted(k for k in model_cfg.to_dict() if saved["model"].get(k) != model_cfg.to_dict()[k])
        raise DepthlabError(f"cannot resume {str(out)!r}: the model differs from the saved run in {', '.join(diff)} "
                            f"(saved scheme {saved['model'].get('scheme')!r})")
    diff = [k for k in RESUME_KEYS if saved["train"].get(k) != getattr(cfg, k)]
    if "steps" in diff:
        at = latest_step(out)
        if cfg.steps < at:
            raise DepthlabError(f"cannot resume {str(out)!r} with --steps {cfg.steps}: it is already at step {at}; "
                                f"give --steps {at} or more")
        log.info("%s: %s", out.name, extension_rule(saved["train"]["steps"], cfg.steps, at))
    refused = [k for k in diff if k not in (*allow, "steps")]
    if refused:
        detail = ", ".join(f"{k}={getattr(cfg, k)!r} (saved {saved['train'].get(k)!r})" for k in refused)
        hint = (" (pass --allow-changed " + ",".join(k for k in refused if k in CHANGEABLE_KEYS) + " to change them)"
                if any(k in CHANGEABLE_KEYS for k in refused) else "")
        raise DepthlabError(f"cannot resume {str(out)!r}: training settings differ: {detail}{hint}")
    return {k: [saved["train"].get(k), getattr(cfg, k)] for k in diff}


def run_config(run: RunSetup, command: str | None, world_size: int,
               record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's config record (config.json, and the copy in every checkpoint). Resuming keeps the
    saved record, adding this session's command as ``command_resume`` and its versions. ``record``:
    extra keys of a fresh run (e.g. ``finetune``)."""
    tok = run.tokenizer
    config = {"model": run.model_cfg.to_dict(), "train": run.cfg.to_dict(),
              "tokenizer": None if tok is None else {"spec": tok.spec, "vocab_size": tok.vocab_size,
                                                     "eos_id": tok.eos_id, "pad_id": tok.pad_id,
                                                     "fingerprint": tok.fingerprint()},
              "versions": versions(), "command": command or command_line(), "world_size": world_size,
              "family": run.family, "defaulted": list(run.defaulted),
              "data_fingerprint": {"data": data_fingerprint(run.cfg.data),
                                   "val_data": data_fingerprint(run.cfg.val_data)},
              **(record or {})}
    if run.resume:
        resumed = {**run.saved, "command_resume": config["command"], "versions": config["versions"]}
        if run.changed:  # the new schedule rules from now on; the history says what changed when
            replanned = {k: getattr(run.cfg, k) for k in run.saved.get("defaulted", ()) if k in REPLANNED_KEYS}
            resumed["train"] = {**run.saved["train"], **replanned, **{k: new for k, (_, new) in run.changed.items()}}
            resumed["resume_changes"] = [*run.saved.get("resume_changes", []),
                                         {"command": config["command"], "changed": run.changed, "at_step": run.resumed_at}]
        return resumed
    return config


def write_run_dir(run: RunSetup, command: str | None, env: D.DistEnv,
                  record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create a fresh run's directory with config.json and tokenizer/ (rank 0; every rank waits);
    returns :func:`run_config`'s record."""
    config = run_config(run, command, env.world_size, record)
    if env.is_main and not run.resume:
        run.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run.out / "config.json", config)
        if run.tokenizer is not None:
            run.tokenizer.save(run.out / "tokenizer")
    elif env.is_main and run.changed:
        write_json_atomic(run.out / "config.json", config)
    D.barrier(env)
    return config
