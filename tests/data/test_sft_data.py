"""SFT data: the loss counts only response tokens (prompt masked to -100, EOS after the response),
chat records, padding and packing, record validation, template provenance."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab import build_model, from_preset
from depthlab.base.errors import DepthlabError
from depthlab.data.sft import SFTDataset, batches, get_template, load_records, pack_examples, pad_examples
from depthlab.data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()  # one token per byte: the expected ids are easy to write down
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def _ds(records, **kw):
    return SFTDataset(records, TOK.encode, TOK.eos_id, **kw)


def test_prompt_is_masked_and_eos_ends_the_response():
    ds = _ds([{"instruction": "Say hi", "input": "", "output": "hi"}])
    prompt = list(ALPACA_NO_INPUT.format(instruction="Say hi").encode())
    seq = prompt + [ord("h"), ord("i"), TOK.eos_id]
    item = ds[0]
    assert item["input_ids"] == seq[:-1]
    assert item["labels"] == [-100] * (len(prompt) - 1) + [ord("h"), ord("i"), TOK.eos_id]


def test_input_field_uses_the_input_template():
    ds = _ds([{"instruction": "Add", "input": "2 and 3", "output": "5"}])
    text = bytes(t for t in ds[0]["input_ids"] if t < 256).decode()
    assert "### Input:\n2 and 3\n\n### Response:\n5" in text
    assert [t for t in ds[0]["labels"] if t != -100] == [ord("5"), TOK.eos_id]


def test_loss_counts_only_response_tokens():
    torch.manual_seed(0)
    model = build_model(from_preset("tiny", vocab_size=258, n_layers=2)).eval()
    ds = _ds([{"instruction": "Continue the verse.", "input": "In the beginning", "output": "God created"}])
    x, y = pad_examples([ds[0]], TOK.pad_id)
    with torch.no_grad():
        out = model(x, labels=y)
        logp = torch.log_softmax(model(x).logits[0].float(), -1)
    response = list(b"God created") + [TOK.eos_id]
    pos = [t for t in range(y.shape[1]) if y[0, t] != -100]
    assert [int(y[0, t]) for t in pos] == response and len(pos) == len(response)
    manual = -sum(float(logp[t, y[0, t]]) for t in pos) / len(pos)
    assert float(out.loss) == pytest.approx(manual, abs=1e-5)
    # changing what the model predicts at prompt positions changes nothing: those labels are ignored
    y_all = torch.cat([x[0, 1:], torch.tensor([TOK.eos_id])])[None]
    with torch.no_grad():
        assert float(model(x, labels=y_all).loss) != pytest.approx(float(out.loss), abs=1e-3)


def test_chat_messages_train_every_assistant_turn():
    rec = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
                        {"role": "assistant", "content": "Bye"}]}
    ds = _ds([rec])
    trained = [t for t in ds[0]["labels"] if t != -100]
    assert trained == list(b"Hello") + [TOK.eos_id] + list(b"Bye") + [TOK.eos_id]
    text = bytes(t for t in ds[0]["input_ids"] if t < 256).decode()
    assert text.startswith("Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello")


def test_padding_and_packing_keep_the_mask():
    recs = [{"instruction": f"q{i}", "input": "", "output": "a" * (i + 1)} for i in range(5)]
    ds = _ds(recs)
    x, y = pad_examples([ds[0], ds[4]], TOK.pad_id)
    assert x.shape == y.shape and x.shape[1] == len(ds[4]["input_ids"])
    n0 = len(ds[0]["input_ids"])
    assert (x[0, n0:] == TOK.pad_id).all() and (y[0, n0:] == -100).all()
    px, py = pack_examples(ds, seq_len=64)
    flat = [t for ex in ds.examples for t in ex.ids]
    assert px.shape[1] == 64 and px.flatten().tolist() == flat[: px.numel()]
    kept = sum(1 for ex in ds.examples for m in ex.trained if m)
    assert int((py != -100).sum()) <= kept and int((py == ord("a")).sum()) > 0
    assert int((py == TOK.eos_id).sum()) >= 1  # response EOS tokens are trained
    shapes = {tuple(b[0].shape) for b in batches(ds, 2, TOK.pad_id, seq_len=128)}
    assert shapes <= {(2, 128), (1, 128)}
    assert next(iter(batches(ds, 2, TOK.pad_id, seq_len=32, pack=True, shuffle_seed=0)))[0].shape[1] == 32


def test_long_examples_are_cut_to_max_len():
    ds = _ds([{"instruction": "x", "input": "", "output": "y" * 500}, {"instruction": "z" * 300, "output": "w"}],
             max_len=256)
    assert len(ds) == 1 and ds.dropped == 1  # the second one's prompt alone fills 256 tokens
    assert len(ds[0]["input_ids"]) == 256 == len(ds[0]["labels"])
    with pytest.raises(DepthlabError, match="no record with a response within 128 tokens"):
        _ds([{"instruction": "z" * 300, "output": "w"}], max_len=128)


def test_records_files_and_bad_records(tmp_path):
    recs = [{"instruction": "a", "input": "", "output": "b", "answer": "b"}, {"instruction": "c", "output": "d"}]
    (tmp_path / "r.json").write_text(json.dumps(recs))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert load_records(tmp_path / "r.json") == load_records(tmp_path / "r.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(DepthlabError, match=r"bad\.jsonl:1: not an SFT record.*fields seen: prompt"):
        load_records(tmp_path / "bad.jsonl")
    with pytest.raises(DepthlabError, match="no assistant message"):
        _ds([{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DepthlabError, match="unknown prompt template"):
        get_template("vicuna")


def test_template_is_recorded_for_the_run_config():
    ds = _ds([{"instruction": "a", "output": "b"}], template="llm-adapters")
    cfg = ds.config()
    assert cfg["template"]["name"] == "llm-adapters" and "### Response:" in cfg["template"]["prompt_no_input"]
    assert cfg["trained_tokens"] == 2 and cfg["examples"] == 1
    assert get_template("alpaca").prompt_no_input == ALPACA_NO_INPUT


def test_builtin_sft_records_tokenize():
    from depthlab.analysis.evaluate import builtin_sft_records

    ds = _ds(builtin_sft_records(12), max_len=2048)
    assert len(ds) == 12 and all(any(t != -100 for t in ds[i]["labels"]) for i in range(12))
