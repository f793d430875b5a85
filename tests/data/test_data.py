"""Data pipeline: held-out split without leakage, packing, pad masks, tokenizers, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.data import (
    BUILTIN_VAL_BOOKS,
    ByteTokenizer,
    build_tokenizer,
    builtin_path,
    eval_token_batches,
    inputs_and_labels,
    iter_documents,
    load_sequences,
    load_tokenizer,
    pack_tokens,
    pad_tokens,
    write_shards,
)


def _chapters_by_book():
    chapters = {}
    with builtin_path().open() as f:
        for line in f:
            r = json.loads(line)
            chapters.setdefault((r["book"], r["chapter"]), []).append(r["text"])
    return {" ".join(v): book for (book, _), v in chapters.items()}


def test_builtin_split_is_by_book_without_leakage():
    book_of = _chapters_by_book()
    train, val = list(iter_documents("builtin", "train")), list(iter_documents("builtin", "val"))
    assert {book_of[d] for d in val} == set(BUILTIN_VAL_BOOKS)
    assert not {book_of[d] for d in train} & set(BUILTIN_VAL_BOOKS)
    assert not set(train) & set(val)
    assert len(train) + len(val) == len(book_of) == len(list(iter_documents("builtin", "all")))
    assert train == list(iter_documents("builtin", "train"))  # deterministic


def test_local_split_deterministic_and_disjoint(tmp_path):
    docs = [f"document number {i} " * 3 for i in range(400)] + ["a repeated document"] * 5
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(json.dumps({"body": d}) for d in docs))
    train = list(iter_documents(str(p), "train", text_field="body"))
    val = list(iter_documents(str(p), "val", text_field="body"))
    assert val and train and not set(train) & set(val)
    assert len(train) + len(val) == len(docs)
    # order of files does not matter: the rule is a hash of the text
    q = tmp_path / "d" / "c.jsonl"
    q.parent.mkdir()
    q.write_text("\n".join(json.dumps({"body": d}) for d in reversed(docs)))
    assert set(iter_documents(str(q.parent), "val", text_field="body")) == set(val)


def test_packing_separates_with_eos_and_shifts():
    rows = pack_tokens([[1, 2, 3], [4, 5], [6, 7, 8, 9]], eos_id=0, window=4)
    assert rows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]
    x, y = inputs_and_labels(rows)
    assert torch.equal(x, torch.tensor(rows[:, :-1])) and torch.equal(y, torch.tensor(rows[:, 1:]))


@pytest.mark.parametrize("pad_id", [9, 0])  # pad distinct from EOS, and pad == EOS (HF tokenizers without pad)
def test_pad_mask_covers_exactly_pad_positions(pad_id):
    docs = [[5, 6, 7], [1], [2, 3, 4, 5, 6, 7, 8, 1, 2], []]
    rows, lengths = pad_tokens(docs, eos_id=0, pad_id=pad_id, window=6)
    x, y = inputs_and_labels(rows, lengths)
    for r, doc in enumerate(docs):
        real = (doc + [0])[:6]  # doc + EOS, truncated to the window
        n_targets = len(real) - 1  # targets are real[1:]
        assert (y[r, :n_targets] != -100).all()
        assert torch.equal(y[r, :n_targets], torch.tensor(real[1:], dtype=torch.long))
        assert (y[r, n_targets:] == -100).all()
        assert (x[r, len(real):] == pad_id).all()


def test_sequences_order_depends_on_seed_only(tmp_path):
    tok = ByteTokenizer()
    p = tmp_path / "a.txt"
    p.write_text("\n\n".join(f"paragraph {i} " * 5 for i in range(300)))
    a = load_sequences(str(p), tok, 16, seed=3, cache_dir=tmp_path)
    b = load_sequences(str(p), tok, 16, seed=3, cache_dir=tmp_path)  # from the token cache
    c = load_sequences(str(p), tok, 16, seed=4, cache_dir=tmp_path)
    assert torch.equal(a.batch(5, 7)[0], b.batch(5, 7)[0])
    assert not torch.equal(a.batch(0, 7)[0], c.batch(0, 7)[0])
    n = len(a)  # second epoch is another permutation of the same rows
    assert sorted(a.row_ids(0, n).tolist()) == sorted(a.row_ids(n, n).tolist()) == list(range(n))


def test_eval_batches_stop_and_report_short(tmp_path):
    tok = ByteTokenizer()
    e = eval_token_batches("builtin", tok, n_tokens=1000, seq_len=64, batch_size=4)
    batches = list(e)
    assert all(b.dtype == torch.long and b.shape[1] == 64 for b in batches)
    assert e.tokens == 16 * 64 and not e.short
    p = tmp_path / "small.txt"
    p.write_text("\n\n".join(["x" * 50] * 400))
    e = eval_token_batches(str(p), tok, n_tokens=10**7, seq_len=64, batch_size=4)
    list(e)
    assert e.short and e.tokens < 10**7


def test_tokenizers_roundtrip_and_cache(tmp_path):
    text = "In the beginning God created the heaven and the earth. ñ"
    b = ByteTokenizer()
    assert b.decode(b.encode(text)) == text and b.vocab_size == 258
    docs = list(iter_documents("builtin", "train"))[:60]
    tok = build_tokenizer("bpe:300", docs, cache_dir=tmp_path)
    assert tok.vocab_size == 300 and tok.eos_id != tok.pad_id
    assert tok.decode(tok.encode(text)) == text
    again = build_tokenizer("bpe:300", docs, cache_dir=tmp_path)
    assert again.encode(text) == tok.encode(text)
    tok.save(tmp_path / "saved")
    loaded = load_tokenizer(tmp_path / "saved")
    assert loaded.spec == "bpe:300" and loaded.encode(text) == tok.encode(text)
    assert loaded.fingerprint() == tok.fingerprint()


def test_token_shards(tmp_path):
    tok = ByteTokenizer()
    p = tmp_path / "a.txt"
    p.write_text("\n\n".join(f"paragraph {i} " * 5 for i in range(300)))
    meta = write_shards(str(p), tok, tmp_path / "shards")
    assert meta["dtype"] == "uint16" and meta["train_tokens"] > 0
    seqs = load_sequences(str(tmp_path / "shards"), tok, 16)
    direct = load_sequences(str(p), tok, 16, cache_dir=tmp_path)
    assert len(seqs) == len(direct) and torch.equal(seqs.batch(0, 4)[0], direct.batch(0, 4)[0])
    assert list(eval_token_batches(str(tmp_path / "shards"), tok, 100, 16, 2))


@pytest.mark.parametrize("case", ["missing", "empty_dir", "no_field", "bad_utf8", "bad_tok", "bad_bpe", "bad_split", "bad_hf"])
def test_bad_input_raises_depthlab_error(tmp_path, case):
    with pytest.raises(DepthlabError) as err:
        if case == "missing":
            list(iter_documents(str(tmp_path / "nope.jsonl")))
        elif case == "empty_dir":
            list(iter_documents(str(tmp_path)))
        elif case == "no_field":
            (tmp_path / "a.jsonl").write_text('{"content": "hello"}\n')
            list(iter_documents(str(tmp_path / "a.jsonl")))
        elif case == "bad_utf8":
            (tmp_path / "a.txt").write_bytes(b"hello \xff\xfe world")
            list(iter_documents(str(tmp_path / "a.txt")))
        elif case == "bad_tok":
            build_tokenizer("wordpiece")
        elif case == "bad_bpe":
            build_tokenizer("bpe:lots", ["x"])
        elif case == "bad_hf":
            build_tokenizer("hf:")
        else:
            list(iter_documents("builtin", "test"))
    assert len(str(err.value).splitlines()) == 1
    if case == "no_field":
        assert "'text'" in str(err.value) and "content" in str(err.value)


def test_streaming_sequences_resume_and_rank_sharding(tmp_path):
    from depthlab.data.batches import StreamingSequences

    tok = ByteTokenizer()
    p = tmp_path / "a.txt"
    p.write_text("\n\n".join(f"paragraph {i} " * (1 + i % 5) for i in range(300)))
    straight = StreamingSequences(str(p), tok, 16)
    batches = [straight.rank_batch(s, 4) for s in range(4)]
    resumed = StreamingSequences(str(p), tok, 16)
    assert torch.equal(resumed.rank_batch(2, 4)[0], batches[2][0])  # skips what was consumed
    # packed stream = packed documents in order
    rows = pack_tokens((tok.encode(d) for d in iter_documents(str(p))), tok.eos_id, 17)
    assert torch.equal(batches[0][0], torch.tensor(rows[:4, :-1]))
    # two ranks get disjoint halves of the documents
    r0 = StreamingSequences(str(p), tok, 16, pack=False, rank=0, world_size=2).rank_batch(0, 8, 0, 2)[0]
    r1 = StreamingSequences(str(p), tok, 16, pack=False, rank=1, world_size=2).rank_batch(0, 8, 1, 2)[0]
    docs = list(iter_documents(str(p)))
    assert tok.decode(r0[0].tolist()).startswith(docs[0][:10]) and tok.decode(r1[0].tolist()).startswith(docs[1][:10])


def test_hf_tokenizer_from_local_directory(tmp_path):
    from transformers import PreTrainedTokenizerFast

    docs = list(iter_documents("builtin", "train"))[:40]
    bpe = build_tokenizer("bpe:300", docs, cache_dir=tmp_path)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe.tok, eos_token="<|endoftext|>")  # no pad token
    fast.save_pretrained(tmp_path / "hf")
    tok = build_tokenizer(f"hf:{tmp_path / 'hf'}")
    text = "And God said, Let there be light: and there was light."
    assert tok.encode(text) == bpe.encode(text) and tok.encode_batch([text, text]) == [bpe.encode(text)] * 2
    assert tok.eos_id == bpe.eos_id and tok.pad_id == tok.eos_id and tok.vocab_size == 300
    tok.save(tmp_path / "saved")
    assert load_tokenizer(tmp_path / "saved").encode(text) == tok.encode(text)
