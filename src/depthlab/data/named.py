"""Named corpora: ``--data NAME`` for a corpus built once into the cache by its own build command.

    open-english    public-domain and freely licensed English text from the package registries
                    (docs/corpus.md), built by ``python3 -m depthlab.data.opencorpus``

A built corpus lives in ``<cache>/corpora/NAME/`` (cache: :func:`default_cache_dir`):

    docs/train.jsonl, docs/val.jsonl   the cleaned, deduplicated documents ({"id", "source", "text"})
    shards/                            token shards (shards.json, tokenizer/, train-00000.bin, ...)

``--data NAME`` means the shard directory for training and evaluation with the corpus's own
tokenizer, and the documents (its own held-out split) wherever text is needed: ``depthlab tokenize``
with another tokenizer, or ``diagnose`` of a model with another vocabulary. A name that is not built
raises a one-line :class:`DepthlabError` naming the build command. Names win over a relative path
of the same name (write ``./open-english`` for a local directory).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from depthlab.base.errors import DepthlabError
from depthlab.data.tokenizers import default_cache_dir

SHARDS_META = "shards.json"  # marks a token-shard directory (``depthlab tokenize``, named corpora)

#: name -> the command that builds it into the default cache
NAMED_CORPORA = {"open-english": "python3 -m depthlab.data.opencorpus"}


def corpus_root(name: str, cache_dir: str | Path | None = None) -> Path:
    """``<cache>/corpora/<name>``, built or not."""
    return Path(cache_dir or default_cache_dir()) / "corpora" / name


def _built(name: str) -> Path:
    """The root of a built named corpus, or a DepthlabError naming the build command."""
    root = corpus_root(name)
    if not (root / "shards" / SHARDS_META).is_file():
        raise DepthlabError(f"corpus {name!r} is not built in {str(root)!r}; build it with: {NAMED_CORPORA[name]}")
    return root


def shard_path(spec: str) -> Path:
    """The directory a data spec names: a named corpus's shard directory, else the path itself."""
    if spec in NAMED_CORPORA:
        return _built(spec) / "shards"
    return Path(spec).expanduser()


def named_fingerprint(name: str) -> str:
    """A cache key for a built named corpus's documents (a hash of their build record)."""
    return hashlib.sha256((_built(name) / "docs" / "stage.json").read_bytes()).hexdigest()[:16]


def iter_named_documents(name: str, split: str) -> Iterator[str]:
    """Texts of a named corpus's ``train``, ``val`` or ``all`` (train then val) documents."""
    docs = _built(name) / "docs"
    files = [docs / f"{s}.jsonl" for s in (("train", "val") if split == "all" else (split,))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DepthlabError(f"corpus {name!r} lacks its documents ({missing[0]}); rebuild with: {NAMED_CORPORA[name]}")

    def gen() -> Iterator[str]:
        for path in files:
            with path.open(encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)["text"]

    return gen()
