"""SFT data: Alpaca / LLM-Adapters records and chat ``messages`` -> masked token sequences.

Records (``.json`` list or ``.jsonl``), one of:

    {"instruction": ..., "input": ..., "output": ...}    Alpaca; LLM-Adapters' Commonsense170K
                                                         (``input`` may be empty or absent; an
                                                         ``answer`` field is ignored)
    {"messages": [{"role": ..., "content": ...}, ...]}   chat; roles system / user / assistant

A record is rendered into segments ``(text, trained)``: the prompt (template text around the
instruction and input, every user/system turn) is not trained, the response (``output``, every
assistant turn) is, and EOS follows each response. Segments are encoded one by one and concatenated,
so the mask boundary is exact whatever the tokenizer does at the seam. The result follows depthlab's
trainer convention (the model does not shift labels): ``input_ids = seq[:-1]`` and
``labels = seq[1:]``, with ``-100`` wherever the predicted token belongs to the prompt.

Templates are named and their text is recorded (:meth:`PromptTemplate.to_dict`) so a run's config
can store exactly what the model was trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, choices
from depthlab.base.fileio import read_json_records
from depthlab.models.decoder import IGNORE_INDEX  # the one definition (the model's loss convention)

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class PromptTemplate:
    """``prompt_input`` / ``prompt_no_input`` are ``str.format`` strings over ``instruction``,
    ``input``; the response follows them directly."""

    name: str
    prompt_input: str
    prompt_no_input: str
    source: str = ""

    def render(self, instruction: str, input: str = "") -> str:
        if input:
            return self.prompt_input.format(instruction=instruction, input=input)
        return self.prompt_no_input.format(instruction=instruction)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


_INDENT = " " * 16
TEMPLATES: dict[str, PromptTemplate] = {
    "alpaca": PromptTemplate(
        "alpaca",
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
        "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:\n",
        "Stanford Alpaca (tatsu-lab/stanford_alpaca PROMPT_DICT)",
    ),
    # verbatim, indentation included, as LLM-Adapters' commonsense_evaluate.py prompts the model
    "llm-adapters": PromptTemplate(
        "llm-adapters",
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        f"{_INDENT}### Instruction:\n{_INDENT}{{instruction}}\n\n{_INDENT}### Input:\n{_INDENT}{{input}}\n\n"
        f"{_INDENT}### Response:\n{_INDENT}",
        "Below is an instruction that describes a task. Write a response that appropriately completes the request. \n\n"
        f"{_INDENT}### Instruction:\n{_INDENT}{{instruction}}\n\n{_INDENT}### Response:\n{_INDENT}",
        "AGI-Edgerunners/LLM-Adapters commonsense_evaluate.py generate_prompt",
    ),
}
CHAT_ROLES = {"system": "", "user": "### Instruction:\n", "assistant": "### Response:\n"}


def get_template(name: str) -> PromptTemplate:
    if name not in TEMPLATES:
        raise DepthlabError(f"unknown prompt template {name!r}; {choices(TEMPLATES)}")
    return TEMPLATES[name]


# ---------------------------------------------------------------------- records
def _read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    return read_json_records(path, "SFT file")


def check_record(row: Any, where: str) -> dict[str, Any]:
    """An Alpaca or chat record, validated; raises DepthlabError naming ``where``."""
    if not isinstance(row, dict):
        raise DepthlabError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "messages" in row:
        msgs = row["messages"]
        ok = isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and m.get("role") in CHAT_ROLES and isinstance(m.get("content"), str) for m in msgs)
        if not ok:
            raise DepthlabError(f"{where}: 'messages' must be a non-empty list of {{role, content}} with roles "
                                f"{', '.join(CHAT_ROLES)}")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DepthlabError(f"{where}: the conversation has no assistant message to train on")
        return {"messages": msgs}
    if not isinstance(row.get("instruction"), str) or not isinstance(row.get("output"), str):
        raise DepthlabError(f"{where}: not an SFT record: need instruction + output (Alpaca) or messages (chat); "
                            f"fields seen: {', '.join(sorted(row)) or 'none'}")
    inp = row.get("input")
    if inp is None:
        inp = ""
    if not isinstance(inp, str):
        raise DepthlabError(f"{where}: 'input' must be a string or absent, got {json.dumps(inp)[:40]}")
    return {"instruction": row["instruction"], "input": inp, "output": row["output"]}


def load_records(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Records of a ``.json`` (list) or ``.jsonl`` file, validated."""
    path = Path(path)
    if not path.is_file():
        raise DepthlabError(f"SFT file {str(path)!r} does not exist")
    out = []
    for where, row in _read_rows(path):
        out.append(check_record(row, where))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DepthlabError(f"SFT file {str(path)!r} holds no records")
    return out


def segments(record: dict[str, Any], template: PromptTemplate) -> list[tuple[str, bool]]:
    """``[(text, trained), ...]`` of one record; an EOS goes after every trained segment."""
    if "messages" not in record:
        return [(template.render(record["instruction"], record.get("input") or ""), False), (record["output"], True)]
    out: list[tuple[str, bool]] = []
    for m in record["messages"]:
        if m["role"] == "assistant":
            out += [(CHAT_ROLES["assistant"], False), (m["content"], True)]
        else:
            out.append((CHAT_ROLES[m["role"]] + m["content"] + "\n\n", False))
    return out


# ---------------------------------------------------------------------- tokens
@dataclass
class SFTExample:
    """One record's tokens: ``ids`` (prompt + response + EOS) and ``trained[t]`` (is ``ids[t]`` a
    response token or a response's EOS)."""

    ids: list[int]
    trained: list[bool]

    def inputs_and_labels(self) -> tuple[list[int], list[int]]:
        return self.ids[:-1], [t if m else IGNORE_INDEX for t, m in zip(self.ids[1:], self.trained[1:])]


def tokenize_record(record: dict[str, Any], template: PromptTemplate, encode: Callable[[str], list[int]],
                    eos_id: int, bos_id: int | None = None) -> SFTExample:
    ids: list[int] = [] if bos_id is None else [bos_id]
    trained: list[bool] = [False] * len(ids)
    for text, train in segments(record, template):
        toks = list(encode(text)) if text else []
        if train:
            toks.append(eos_id)
        ids += toks
        trained += [train] * len(toks)
    return SFTExample(ids, trained)


class SFTDataset(torch.utils.data.Dataset):
    """Records tokenized once; item ``i`` is ``{"input_ids", "labels"}`` (lists, unpadded, at most
    ``max_len`` tokens: longer examples are cut on the right, and dropped when no response token is
    left; ``dropped`` counts those). Batch with :func:`pad_examples` or :func:`pack_examples`."""

    def __init__(self, records: Iterable[dict[str, Any]], encode: Callable[[str], list[int]], eos_id: int, *,
                 template: str | PromptTemplate = "alpaca", max_len: int = 512, bos_id: int | None = None) -> None:
        self.template = get_template(template) if isinstance(template, str) else template
        self.max_len = int(max_len)
        self.examples: list[SFTExample] = []
        cut = dropped = 0
        for i, rec in enumerate(records):
            ex = tokenize_record(check_record(rec, f"record {i}"), self.template, encode, eos_id, bos_id)
            if len(ex.ids) > self.max_len + 1:
                ex, cut = SFTExample(ex.ids[: self.max_len + 1], ex.trained[: self.max_len + 1]), cut + 1
                if not any(ex.trained[1:]):  # the prompt alone fills max_len: nothing left to learn
                    dropped += 1
                    continue
            self.examples.append(ex)
        self.dropped = dropped
        if not self.examples:
            raise DepthlabError(f"the SFT data holds no record with a response within {self.max_len} tokens")
        if cut:
            log.info("%d SFT examples were longer than %d tokens and were cut on the right; %d whose prompt alone "
                     "filled them were dropped", cut, max_len, dropped)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        x, y = self.examples[i].inputs_and_labels()
        return {"input_ids": x, "labels": y}

    def config(self) -> dict[str, Any]:
        """What a run config should record about the SFT data."""
        return {"template": self.template.to_dict(), "max_len": self.max_len, "examples": len(self.examples),
                "dropped": self.dropped,
                "trained_tokens": sum(sum(1 for v in self[i]["labels"] if v != IGNORE_INDEX) for i in range(len(self)))}


def pad_examples(items: Sequence[dict[str, list[int]]], pad_id: int, seq_len: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a batch to ``seq_len`` (default: its longest item); labels ``-100`` on padding."""
    width = seq_len or max(len(it["input_ids"]) for it in items)
    x = torch.full((len(items), width), pad_id, dtype=torch.long)
    y = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
    for r, it in enumerate(items):
        n = min(len(it["input_ids"]), width)
        x[r, :n] = torch.as_tensor(it["input_ids"][:n])
        y[r, :n] = torch.as_tensor(it["labels"][:n])
    return x, y


def pack_examples(dataset: SFTDataset, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate whole examples (prompt + response + EOS) into rows of ``seq_len`` inputs with
    their labels (the prompt stays masked; the tail that fills no row is dropped). Attention crosses
    example boundaries, as in pre-training packing."""
    ids: list[int] = []
    trained: list[bool] = []
    for ex in dataset.examples:
        ids += ex.ids
        trained += ex.trained
    n = (len(ids) - 1) // seq_len
    if n == 0:
        raise DepthlabError(f"the SFT data ({len(ids)} tokens) does not fill one packed row of {seq_len}")
    x = torch.as_tensor(ids[: n * seq_len]).view(n, seq_len)
    tgt = torch.as_tensor(ids[1: n * seq_len + 1])
    keep = torch.as_tensor(trained[1: n * seq_len + 1])
    y = torch.where(keep, tgt, torch.full_like(tgt, IGNORE_INDEX)).view(n, seq_len)
    return x, y


def batches(dataset: SFTDataset, batch_size: int, pad_id: int, *, seq_len: int | None = None, pack: bool = False,
            shuffle_seed: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed-shape ``(input_ids, labels)`` batches: packed rows of ``seq_len``, or padded examples
    (to ``seq_len`` when given, else to each batch's longest)."""
    if pack:
        x, y = pack_examples(dataset, seq_len or dataset.max_len)
        order = torch.arange(len(x))
        if shuffle_seed is not None:
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(shuffle_seed))
        for a in range(0, len(order), batch_size):
            yield x[order[a:a + batch_size]], y[order[a:a + batch_size]]
        return
    order = list(range(len(dataset)))
    if shuffle_seed is not None:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
    for a in range(0, len(order), batch_size):
        yield pad_examples([dataset[i] for i in order[a:a + batch_size]], pad_id, seq_len)
