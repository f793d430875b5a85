"""The open-english corpus builder: its dry run end to end (split, dedup, parts, manifest, loading,
round trip, rerun), the ``--data open-english`` name, and the package-format readers on made-up files."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.cli import main
from depthlab.data import (
    BUILTIN_VAL_BOOKS,
    ByteTokenizer,
    eval_token_batches,
    is_shard_dir,
    iter_documents,
    load_sequences,
    load_tokenizer,
)
from depthlab.data.named import corpus_root
from depthlab.data.opencorpus import NAME, build, toy_options, verify
from depthlab.data.opencorpus import readers as R
from depthlab.data.opencorpus.build import MIN_PARAGRAPH, _norm
from depthlab.data.shards import shard_tokens

PART = 16 * 1024  # a tiny part limit, so the dry run writes several parts


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The dry run, built once into a cache laid out as the default one (for the name tests)."""
    cache = tmp_path_factory.mktemp("cache")
    meta = build(toy_options(corpus_root(NAME, cache), part_bytes=PART))
    return cache, corpus_root(NAME, cache), meta


def _docs(root: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (root / "docs" / f"{split}.jsonl").read_text().splitlines()]


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_ino) for p in root.rglob("*") if p.is_file()}


def test_toy_split_is_by_whole_document_and_disjoint(toy):
    _, root, _ = toy
    train, val = _docs(root, "train"), _docs(root, "val")
    assert train and val
    assert not {d["id"] for d in train} & {d["id"] for d in val}
    assert not {_norm(d["text"]) for d in train} & {_norm(d["text"]) for d in val}
    books = {s: {d["id"].split("/")[1] for d in docs if d["source"] == "kjv"} for s, docs in (("t", train), ("v", val))}
    assert books["v"] and books["v"] <= set(BUILTIN_VAL_BOOKS) and not books["t"] & set(BUILTIN_VAL_BOOKS)


def test_toy_dedup_removes_every_planted_copy(toy):
    _, root, meta = toy
    docs = _docs(root, "train") + _docs(root, "val")
    assert len({_norm(d["text"]) for d in docs}) == len(docs)  # no exact duplicate document
    paras = [n for d in docs for p in re.split(r"\n\s*\n", d["text"]) if len(n := _norm(p)) >= MIN_PARAGRAPH]
    assert len(set(paras)) == len(paras)  # no repeated paragraph either
    ids = {d["id"] for d in docs}
    assert not any(i.startswith(("repeat/exact", "repeat/near")) for i in ids)
    partial = [d for d in docs if d["id"].startswith("repeat/partial")]
    assert len(partial) == 5 and all(d["text"].startswith("Fresh sentence") for d in partial)
    dedup = meta["corpus"]["dedup"]
    assert (dedup["exact_docs"], dedup["near_docs"], dedup["paragraphs"]) == (5, 5, 5)


def test_toy_parts_respect_the_limit_and_match_the_manifest(toy):
    _, root, meta = toy
    shards = root / "shards"
    parts = meta["parts"]
    assert len(parts["train"]) > 2
    for split, ps in parts.items():
        assert sum(p["tokens"] for p in ps) == meta[f"{split}_tokens"]
        for p in ps:
            data = (shards / p["file"]).read_bytes()
            assert len(data) == p["bytes"] <= PART and hashlib.sha256(data).hexdigest() == p["sha256"]
    assert verify(shards) == []
    per_source = {s["name"]: s for s in meta["corpus"]["sources"]}
    assert sum(s["tokens_train"] for s in per_source.values()) == meta["train_tokens"]


def test_toy_shards_decode_back_to_the_documents_and_load_for_training(toy):
    _, root, meta = toy
    shards = str(root / "shards")
    tok = load_tokenizer(root / "shards" / "tokenizer")
    assert tok.fingerprint() == meta["fingerprint"]
    for split in ("train", "val"):
        flat = np.asarray(shard_tokens(shards, split))
        assert len(flat) == meta[f"{split}_tokens"] and flat[-1] == tok.eos_id
        ends = np.flatnonzero(flat == tok.eos_id)
        decoded = [tok.decode(flat[a + 1:b].tolist()) for a, b in zip(np.r_[-1, ends[:-1]], ends)]
        assert decoded == [d["text"] for d in _docs(root, split)]
    seqs = load_sequences(shards, tok, 32)
    assert len(seqs) == meta["train_tokens"] // 33
    x, y = seqs.batch(0, 4)
    flat = np.asarray(shard_tokens(shards, "train"), dtype=np.int64)
    rows = torch.as_tensor(flat[: len(seqs) * 33].reshape(-1, 33)[seqs.row_ids(0, 4)])
    assert torch.equal(x, rows[:, :-1]) and torch.equal(y, rows[:, 1:])


def test_toy_rerun_is_a_no_op_and_a_damaged_part_is_rebuilt(toy, tmp_path):
    _, root, _ = toy
    before = _files(root)
    assert build(toy_options(root, part_bytes=PART))["reused"] is True
    assert _files(root) == before
    out = tmp_path / "c"
    first = build(toy_options(out, part_bytes=PART))
    victim = out / "shards" / first["parts"]["train"][1]["file"]
    victim.write_bytes(b"\0\0" + victim.read_bytes()[2:])
    assert verify(out / "shards") and build(toy_options(out, part_bytes=PART))["reused"] is False
    assert verify(out / "shards") == []


def test_name_resolves_to_the_built_corpus(toy, monkeypatch):
    cache, root, meta = toy
    monkeypatch.setenv("DEPTHLAB_CACHE", str(cache))
    tok = load_tokenizer(root / "shards" / "tokenizer")
    assert is_shard_dir(NAME)
    a, b = load_sequences(NAME, tok, 16), load_sequences(str(root / "shards"), tok, 16)
    assert torch.equal(a.batch(0, 8)[0], b.batch(0, 8)[0])
    assert list(iter_documents(NAME, "val")) == [d["text"] for d in _docs(root, "val")]
    # a model with another vocabulary is evaluated on the documents, encoded with its own tokenizer
    byte_batch = next(iter(eval_token_batches(NAME, ByteTokenizer(), 64, 64, 1)))
    first_val = _docs(root, "val")[0]["text"].encode("utf-8")[:64]
    assert bytes(byte_batch[0].tolist()) == first_val
    byte_seqs = load_sequences(NAME, ByteTokenizer(), 63, cache_dir=cache)  # so are its training sequences
    first_train = _docs(root, "train")[0]["text"].encode("utf-8")
    assert bytes(np.asarray(byte_seqs.rows[0]).tolist()) == first_train[:64]
    assert len(byte_seqs) == sum(len(d["text"].encode()) + 1 for d in _docs(root, "train")) // 64
    padded = load_sequences(NAME, tok, 16, pack=False)  # --no-pack: one row per document
    assert len(padded) == len(_docs(root, "train"))


def test_trainer_takes_the_name(toy, monkeypatch, tmp_path):
    cache, _, meta = toy
    monkeypatch.setenv("DEPTHLAB_CACHE", str(cache))
    small = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--steps", "2",
             "--batch-size", "4", "--seq-len", "16", "--eval-tokens", "256", "--no-plots", "-q"]
    out = tmp_path / "run"
    assert main(["train", *small, "--data", NAME, "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["data"] == NAME and cfg["model"]["vocab_size"] == load_tokenizer(out / "tokenizer").vocab_size
    assert load_tokenizer(out / "tokenizer").fingerprint() == meta["fingerprint"]


def test_unbuilt_name_is_a_one_line_error_naming_the_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path))
    with pytest.raises(DepthlabError, match=r"python3 -m depthlab\.data\.opencorpus"):
        iter_documents(NAME)
    assert main(["train", "--data", NAME, "--steps", "1", "-q", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "python3 -m depthlab.data.opencorpus" in err


# ---------------------------------------------------------------------- readers on made-up files
def _b64(n: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        out = digits[n % 64] + out
        n //= 64
        if not n:
            return out


def test_dictd_reader(tmp_path):
    entries = ["00-database-info\nheader text\n", "Apple \\Ap\"ple\\, n.\n   A fruit.\n   [1913 Webster]\n",
               "Pear, n.\n   Another {fruit}.\n"]
    data, index, off = b"", [], 0
    for text in entries:
        raw = text.encode()
        index.append((text.split("\n")[0].split(" ")[0].split(",")[0], off, len(raw)))
        data, off = data + raw, off + len(raw)
    index.append(("Apfel", index[1][1], index[1][2]))  # a second headword of the same entry
    (tmp_path / "d.dict.dz").write_bytes(gzip.compress(data))
    (tmp_path / "d.index").write_text("".join(f"{w}\t{_b64(o)}\t{_b64(n)}\n" for w, o, n in sorted(index)))
    got = list(R.dictd_entries(tmp_path / "d.dict.dz", tmp_path / "d.index"))
    assert [w for w, _ in got] == ["Apfel", "Pear"]  # the header skipped, the shared entry once
    assert [t for _, t in got] == entries[1:]
    assert R.gcide_text(got[0][1]).split() == ["Apple,", "n.", "A", "fruit."]
    assert R.gcide_text('Courtepy \\Cour"te*py\\ (k??r"t?-p?), n. [D. kort + pije]\n') == "Courtepy, n. [D. kort + pije]\n"
    assert R.link_braces(got[1][1]) == "Pear, n.\n   Another fruit.\n"


@pytest.mark.parametrize("width", [10, 12])
def test_sword_reader(tmp_path, width):
    e1, e2, e3 = "<p>In the beginning</p>.", "<note>a note</note>Second entry", "Third &amp; last"
    blocks = [e1 + e2, e3]
    bzz, bzs = b"", b""
    for b in blocks:
        z = zlib.compress(b.encode())
        bzs += struct.pack("<III", len(bzz), len(z), len(b.encode()))
        bzz += z
    fmt = "<IIH" if width == 10 else "<III"
    rows = [(0, 0, 0), (0, 0, len(e1)), (0, 0, len(e1)), (0, len(e1), len(e2)), (1, 0, len(e3))]  # empty, link
    (tmp_path / "ot.bzs").write_bytes(bzs)
    (tmp_path / "ot.bzz").write_bytes(bzz)
    (tmp_path / "ot.bzv").write_bytes(b"".join(struct.pack(fmt, *r) for r in rows))
    got = list(R.sword_entries(tmp_path))
    assert got == [e1, e2, e3]
    assert [R.osis_text(g).strip() for g in got] == ["In the beginning\n.", "Second entry", "Third & last"]


def test_rdata_reader(tmp_path):
    def strsxp(strings):
        out = b"X\n" + struct.pack(">iii", 3, 0x040300, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
        out += struct.pack(">ii", 16, len(strings))
        for s in strings:
            out += struct.pack(">ii", 0x40009, -1) if s is None else struct.pack(">ii", 0x8009, len(s.encode())) + s.encode()
        return out

    other = b"X\n" + struct.pack(">iii", 2, 0, 0) + struct.pack(">ii", 13, 0)  # an integer vector: skipped
    objs = [strsxp(["EMMA", "", "Chapter 1", None]), other, strsxp(["Persuasion"])]
    (tmp_path / "Rdata.rdb").write_bytes(b"".join(struct.pack(">I", len(o)) + zlib.compress(o) for o in objs))
    assert list(R.rdata_strings(tmp_path / "Rdata.rdb")) == [["EMMA", "", "Chapter 1", ""], ["Persuasion"]]


def test_html_and_cleaning():
    page = ("<html><head><title>T</title><script>var x;</script></head><body><div class=nosearch><div>menu</div>"
            "more menu</div><h1>Title</h1><p>One   two\nthree.<p>Four<pre>  code\n    block</pre></body></html>")
    text = R.clean_text(R.html_to_text(page))
    assert text == "Title\n\nOne two three.\n\nFour\n\n  code\n    block"
    assert R.clean_text("a\r\n\r\n\r\n\r\nb\t c \x07", dedent=True) == "a\n\nb     c"
    assert R.english_enough("He said “yes” — and left the room quietly after the long meeting.")
    assert not R.english_enough("これは日本語の文書です")
