"""Generative tasks scored by exact match: the model continues a prompt greedily and its first line must begin
with the answer. Offline, from data the packages ship, deterministic (the same seed gives the same items):

``builtin-arith``   arithmetic word problems from templates (addition, subtraction, multiplication of small
                    numbers; names and objects drawn), three worked examples before each question
                    ("Question: ...\\nAnswer: 7\\n\\n"): the answer is a number. 200 items, seed 0.
``builtin-verses``  the first half of a verse from the held-out books of the built-in corpus; the answer is the
                    verse's next ``VERSE_WORDS`` words. 200 items, seed 0.
``FILE.jsonl``      rows with ``prompt`` and ``answer`` (a task file whose rows have exactly these fields).

Likelihood scores flatter a pruned model: a layer that costs little held-out loss can still be needed to
produce an answer (2510.02091, 2602.01997). These tasks are the generation side of that check
(``depthlab evaluate --scoring generate``, ``depthlab prune --generate``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError

GEN_TASKS = ("builtin-arith", "builtin-verses")
GEN_ITEMS = 200
SEED = 0
SHOTS = 3  # worked examples before each arithmetic question
VERSE_WORDS = 3  # words of a verse's continuation to produce exactly

NAMES = ("Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Ida", "Jonas", "Karen", "Leo")
OBJECTS = ("apples", "books", "pencils", "marbles", "stamps", "coins", "cards", "shells")
#: (template, answer(a, b), range of a, range of b): every answer a non-negative integer
TEMPLATES = (
    ("{n} has {a} {o} and gets {b} more. How many {o} does {n} have now?", lambda a, b: a + b, (2, 20), (2, 20)),
    ("{n} had {a} {o} and gave {b} of them away. How many {o} does {n} have left?", lambda a, b: a - b, (10, 30), (1, 9)),
    ("{n} buys {a} boxes with {b} {o} in each box. How many {o} does {n} buy?", lambda a, b: a * b, (2, 9), (2, 9)),
)


@dataclass(frozen=True)
class GenItem:
    prompt: str  # the text the model continues
    answer: str  # what the continuation's first line must begin with (then a non-word character or its end)
    source: str = ""  # "task:n" or "file:line"


@dataclass
class GenTask:
    name: str
    items: list[GenItem]
    source: str = ""
    max_new_tokens: int = 32  # enough for any answer of the task in any tokenizer (bytes included)
    info: dict[str, Any] = field(default_factory=dict)
    format: str = "exact-match"


def _problem(rng: random.Random) -> tuple[str, str]:
    template, fn, (a0, a1), (b0, b1) = TEMPLATES[rng.randrange(len(TEMPLATES))]
    a, b = rng.randint(a0, a1), rng.randint(b0, b1)
    return template.format(n=rng.choice(NAMES), o=rng.choice(OBJECTS), a=a, b=b), str(fn(a, b))


def arith_items(n: int = GEN_ITEMS, seed: int = SEED) -> list[GenItem]:
    """``builtin-arith``: ``n`` questions, each after SHOTS worked examples (drawn from a different seed)."""
    shots_rng, rng = random.Random(seed + 1_000_003), random.Random(seed)
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in (_problem(shots_rng) for _ in range(SHOTS)))
    items = []
    for k in range(n):
        q, a = _problem(rng)
        items.append(GenItem(f"{shots}Question: {q}\nAnswer:", a, f"builtin-arith:{k + 1}"))
    return items


def verse_items(n: int = GEN_ITEMS, seed: int = SEED) -> list[GenItem]:
    """``builtin-verses``: first halves of held-out verses; the answer is the next VERSE_WORDS words."""
    from depthlab.data.builtin_tasks import verses

    pool = verses("val")
    rng = random.Random(seed)
    items = []
    for i in rng.sample(range(len(pool)), min(n, len(pool))):
        words = pool[i]["text"].split()
        k = len(words) // 2
        items.append(GenItem(" ".join(words[:k]), " ".join(words[k:k + VERSE_WORDS]), pool[i]["citation"]))
    return items


def builtin_gen_task(name: str, limit: int | None = None) -> GenTask:
    if name == "builtin-arith":
        task = GenTask(name, arith_items()[:limit], "templates", 8, {"shots": SHOTS, "seed": SEED})
    elif name == "builtin-verses":
        task = GenTask(name, verse_items()[:limit], "builtin corpus, held-out books", 32,
                       {"words": VERSE_WORDS, "seed": SEED})
    else:
        raise DepthlabError(f"unknown generative task {name!r}; choose one of: {', '.join(GEN_TASKS)}")
    return task


def is_gen_rows(row: Any) -> bool:
    """Whether a task-file row is an exact-match item (exactly ``prompt`` and ``answer``)."""
    return isinstance(row, dict) and set(row) == {"prompt", "answer"}


def gen_task_from_rows(rows: list[tuple[str, Any]], name: str, source: str, limit: int | None = None) -> GenTask:
    items = []
    for where, row in rows[:limit]:
        if not is_gen_rows(row) or not all(isinstance(row[k], str) for k in row) or not row["answer"].strip():
            raise DepthlabError(f"{where}: an exact-match item needs the fields prompt and answer (non-empty strings)")
        items.append(GenItem(row["prompt"], row["answer"].strip(), where))
    if not items:
        raise DepthlabError(f"task {name!r} ({source}) holds no items")
    return GenTask(name, items, source)


def exact_match(text: str, answer: str) -> bool:
    """Whether the first line of ``text`` (leading blanks dropped) begins with ``answer`` as a whole: followed by
    its end or a character that is not a letter or a digit (``7`` matches "7.", not "72")."""
    lines = text.lstrip().splitlines()
    first = lines[0].strip() if lines else ""
    return first.startswith(answer) and (len(first) == len(answer) or not first[len(answer)].isalnum())


def load_gen_file(path: str | Path, limit: int | None = None) -> GenTask:
    from depthlab.base.fileio import read_json_records

    path = Path(path)
    return gen_task_from_rows(list(read_json_records(path, "task file")), path.stem, str(path), limit)
