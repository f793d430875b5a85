"""``evaluate(target, tasks)``: score multiple-choice tasks and write ``eval.json`` + ``eval.md``."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from depthlab.analysis.evaluate.options import SCORINGS
from depthlab.analysis.evaluate.scoring import score_exact_match, score_generate, score_loglik
from depthlab.base.errors import DepthlabError, choices, first_line
from depthlab.base.extras import needs
from depthlab.base.progress import logs_to_stderr
from depthlab.base.provenance import versions
from depthlab.data.builtin_tasks import BUILTIN_TASKS, builtin_task
from depthlab.data.gentasks import GEN_TASKS, GenTask, builtin_gen_task, is_gen_rows, load_gen_file
from depthlab.data.image_tasks import ImageTask, is_image_row, load_image_task
from depthlab.data.shapes import IMAGE_TASKS, builtin_image_task
from depthlab.data.tasks import Task, load_task_file, parse_rows

log = logging.getLogger(__name__)

TASK_FORMS = ("a .jsonl file, an image-text .parquet file or 'GLOB' of them (MMMU), "
              + ", ".join(BUILTIN_TASKS + GEN_TASKS + IMAGE_TASKS) + " or hf:NAME[:CONFIG[:SPLIT]]")
AnyTask = Task | GenTask | ImageTask


def _hf_task(spec: str, limit: int | None) -> Task:
    name, config, split = (spec[3:].split(":") + [None, None])[:3]
    if not name:
        raise DepthlabError(f"task {spec!r}: expected hf:NAME[:CONFIG[:SPLIT]]")
    try:
        import datasets
    except ImportError:
        raise needs(f"task {spec!r}", "hf-data") from None
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "validation")
    except Exception as err:  # noqa: BLE001 - offline, unknown name, ...: one line
        raise DepthlabError(f"cannot load task {spec!r}: {first_line(err)[:300]}") from None
    return parse_rows(((f"{spec}[{i}]", dict(row)) for i, row in enumerate(ds)), spec, spec, limit)


def _file_task(spec: str, limit: int | None) -> AnyTask:
    """A task file: exact-match items (rows of ``prompt`` and ``answer``), image-text multiple choice (rows with a
    question, options and an image: MMMU's format) or text multiple choice (any other format)."""
    from depthlab.base.fileio import read_json_records

    first = next(iter(read_json_records(Path(spec), "task file")), (None, None))[1] if Path(spec).is_file() else None
    if is_image_row(first):
        return load_image_task(spec, limit)
    return load_gen_file(spec, limit) if is_gen_rows(first) else load_task_file(spec, limit)


def _is_image_spec(spec: str) -> bool:
    """A parquet file or a glob pattern: image-text tasks (MMMU's files) only."""
    return spec.lower().endswith(".parquet") or any(c in spec for c in "*?[")


def load_tasks(specs: str | Sequence[str | AnyTask], limit: int | None = None) -> list[AnyTask]:
    """Tasks from specs (a comma-separated string or a list): .jsonl files, builtin-mc, builtin-arith, builtin-verses,
    builtin-shapes, image-text .parquet files or globs, hf:NAME. Generative tasks
    (:class:`~depthlab.data.gentasks.GenTask`) are scored by exact match, image-text tasks
    (:class:`~depthlab.data.image_tasks.ImageTask`) through the model's processor."""
    if isinstance(specs, str):
        specs = [s.strip() for s in specs.split(",") if s.strip()]
    if not specs:
        raise DepthlabError(f"no tasks given; give {TASK_FORMS}")
    if limit is not None and limit < 1:
        raise DepthlabError(f"--limit must be positive, got {limit}")
    tasks = []
    for spec in specs:
        if isinstance(spec, (Task, GenTask, ImageTask)):
            tasks.append(dataclasses.replace(spec, items=spec.items[:limit]))
        elif spec in GEN_TASKS:
            tasks.append(builtin_gen_task(spec, limit))
        elif spec in BUILTIN_TASKS:
            tasks.append(builtin_task(spec, limit))
        elif spec in IMAGE_TASKS:
            tasks.append(builtin_image_task(spec, limit))
        elif spec.startswith("hf:"):
            tasks.append(_hf_task(spec, limit))
        elif _is_image_spec(spec):
            tasks.append(load_image_task(spec, limit))
        elif Path(spec).suffix == ".jsonl" or Path(spec).is_file():
            tasks.append(_file_task(spec, limit))
        else:
            raise DepthlabError(f"unknown task {spec!r}; give {TASK_FORMS}")
    names = [t.name for t in tasks]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DepthlabError(f"two tasks are named {dup[0]!r}; rename one of the files")
    return tasks


class Codec:
    """encode / decode / special ids of a Target, tokenizing as lm-eval's HFLM does for HF models
    (the tokenizer's own special tokens, e.g. BOS) and as depthlab trains for depthlab models."""

    def __init__(self, target: Any) -> None:
        tok = target.tokenizer
        if tok is None:
            raise DepthlabError(f"{target.name!r} has no tokenizer; evaluation needs one")
        if not target.causal:
            raise DepthlabError(f"{target.name!r} is an encoder, not a causal LM; it cannot score continuations")
        # an HF model gets its tokenizer's own special tokens (BOS), as HFLM gives them; a depthlab model
        # (even one trained with an hf: tokenizer) gets exactly what it was trained on: tok.encode
        hf = getattr(tok, "tok", None) if target.kind == "hf-causal-lm" and getattr(tok, "kind", "") == "hf" else None
        self.eos_id: int = tok.eos_id
        self.pad_id: int = tok.pad_id
        if hf is not None:
            self.encode: Callable[[str], list[int]] = lambda s: list(hf.encode(s))
            self.decode: Callable[[list[int]], str] = lambda ids: hf.decode(ids, skip_special_tokens=True)
            self.prefix_id = hf.bos_token_id if hf.bos_token_id is not None else self.eos_id
        else:
            self.encode, self.decode, self.prefix_id = tok.encode, tok.decode, self.eos_id


def _max_length(target: Any) -> int:
    cfg = getattr(target.model, "cfg", None) or getattr(target.model, "config", None)
    for attr in ("max_seq_len", "n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None):
            return int(getattr(cfg, attr))
    return int(target.max_seq_len or 2048)


def _open(target: Any, processor: Any) -> tuple[Any, Any]:
    """(the loaded target, its processor): a path to an image-text-to-text model directory is loaded with its
    processor (:mod:`~depthlab.analysis.evaluate.image_model`), anything else as ``load_target`` loads it."""
    from depthlab.analysis.evaluate.image_model import image_text_config, load_image_text
    from depthlab.targets.load import target_for

    if isinstance(target, (str, Path)) and image_text_config(target) is not None:
        target, loaded = load_image_text(str(target))
        return target, processor if processor is not None else loaded
    return target_for(target, stream=False), processor  # a target read layer by layer is refused: scoring runs the
    # whole model on each batch


def _check(task_list: list[AnyTask], scoring: str, sees_images: bool, name: str) -> None:
    """Refuse, before a model is loaded, a task the scoring or the model cannot serve."""
    gen = [t.name for t in task_list if isinstance(t, GenTask)]
    if gen and scoring != "generate":
        raise DepthlabError(f"task {gen[0]!r} is generative (exact match of a continuation); score it with "
                            "--scoring generate")
    image = [t.name for t in task_list if isinstance(t, ImageTask)]
    if image and scoring != "loglik":
        raise DepthlabError(f"task {image[0]!r} is image-text multiple choice: it is scored by loglikelihood only "
                            "(--scoring loglik)")
    if not sees_images:
        from depthlab.analysis.evaluate.image_model import refuse_image_tasks

        refuse_image_tasks(task_list, name)


@logs_to_stderr
def evaluate(target: Any, tasks: str | Sequence[str | AnyTask], *, out: str | Path | None = None,
             limit: int | None = None, batch_size: int = 8, scoring: str = "loglik", template: str = "alpaca",
             max_new_tokens: int = 32, progress: bool = True, command: str | None = None, processor: Any = None,
             chat_template: bool = False) -> dict[str, dict[str, Any]]:
    """Score ``tasks`` on ``target`` (a :class:`~depthlab.targets.Target` or what
    ``load_target`` accepts, or an image-text-to-text model directory). Returns ``{task: {acc, acc_norm, n,
    acc_stderr, acc_norm_stderr, ...}}`` (``generate``: acc only); with ``out``, writes ``eval.json`` and ``eval.md``
    there. Image-text tasks need the model's ``processor`` (loaded with a model directory); ``chat_template``
    renders their prompts through it (:mod:`~depthlab.analysis.evaluate.image_scoring`)."""
    from depthlab.analysis.evaluate.image_model import image_text_config
    from depthlab.analysis.evaluate.image_scoring import score_image_loglik
    from depthlab.data.sft import get_template

    if scoring not in SCORINGS:
        raise DepthlabError(f"unknown scoring {scoring!r}; {choices(SCORINGS)}")
    if batch_size < 1:
        raise DepthlabError(f"--batch-size must be positive, got {batch_size}")
    tmpl = get_template(template)
    task_list = load_tasks(tasks, limit)
    sees = processor is not None or (isinstance(target, (str, Path)) and image_text_config(target) is not None)
    _check(task_list, scoring, sees, str(getattr(target, "name", target)))
    target, processor = _open(target, processor)
    codec, fn, max_len = Codec(target), target.forward_fn(), _max_length(target)
    kw = {"batch_size": batch_size, "max_length": max_len, "pad_id": codec.pad_id, "device": target.device,
          "progress": progress}
    results: dict[str, dict[str, Any]] = {}
    generations: dict[str, list[dict[str, Any]]] = {}
    for task in task_list:
        if isinstance(task, ImageTask):
            res = score_image_loglik(target.model, processor, task, chat_template=chat_template,
                                     progress=progress).metrics()
        elif isinstance(task, GenTask):
            res = score_exact_match(fn, task, codec.encode, codec.decode, eos_id=codec.eos_id,
                                    max_new_tokens=max_new_tokens, **kw)
            generations[task.name] = res.pop("outputs")
        elif scoring == "loglik":
            res = score_loglik(fn, task, codec.encode, prefix_id=codec.prefix_id, **kw).metrics()
        else:
            res = score_generate(fn, task, codec.encode, codec.decode, tmpl.render, eos_id=codec.eos_id,
                                 max_new_tokens=max_new_tokens, **kw)
            generations[task.name] = res.pop("outputs")
        results[task.name] = {"format": task.format, "source": task.source, **res}
        log.info("%s: %s", task.name, ", ".join(f"{k}={v:.4f}" for k, v in res.items() if k.startswith("acc")
                                                  and not k.endswith("stderr")))
    if out is not None:
        meta = {"target": target.name, "target_info": {k: v for k, v in target.info.items() if k != "config"},
                "scoring": scoring, "template": tmpl.to_dict() if scoring == "generate" else None, "limit": limit,
                "chat_template": chat_template if any(isinstance(t, ImageTask) for t in task_list) else None,
                "batch_size": batch_size, "max_length": max_len, "command": command, "versions": versions()}
        write_results(out, results, meta, generations)
    return results


def _fmt(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| task | format | n | acc | ± | acc_norm | ± |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r.get('format', '')} | {r['n']} | {_fmt(r.get('acc'))} | {_fmt(r.get('acc_stderr'))} "
                     f"| {_fmt(r.get('acc_norm'))} | {_fmt(r.get('acc_norm_stderr'))} |")
    accs = [r["acc"] for r in results.values()]
    if len(accs) > 1:
        lines.append(f"| **mean** | | | {_fmt(sum(accs) / len(accs))} | | | |")
    return "\n".join(lines) + "\n"


def write_results(out: str | Path, results: dict[str, dict[str, Any]], meta: dict[str, Any],
                  generations: dict[str, list[dict[str, Any]]] | None = None) -> Path:
    """``eval.json``, ``eval.md`` (and the generations) into ``out``, which must be new or empty: written into a
    hidden sibling and renamed, so ``out`` appears whole or not at all."""
    from depthlab.base.fileio import publish_dir

    out = Path(out)

    def clean(v: Any) -> Any:  # NaN is not JSON
        return None if isinstance(v, float) and math.isnan(v) else v

    body = {**meta, "results": {t: {k: clean(v) for k, v in r.items()} for t, r in results.items()}}
    with publish_dir(out) as tmp:
        (tmp / "eval.json").write_text(json.dumps(body, indent=2) + "\n")
        (tmp / "eval.md").write_text(markdown_table(results))
        for name, rows in (generations or {}).items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            (tmp / f"generations-{safe}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out
