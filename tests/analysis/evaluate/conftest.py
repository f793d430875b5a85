"""Hand-written items in each native task format, and a tiny random HF Llama with a byte-level BPE
tokenizer (BOS added, as Llama's) saved to a temp dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evaldata import ITEMS, write_jsonl


@pytest.fixture
def task_files(tmp_path) -> dict[str, Path]:
    return {name: write_jsonl(tmp_path / f"{name}.jsonl", rows) for name, rows in ITEMS.items()}


def _texts() -> list[str]:
    return [json.dumps(r) for rows in ITEMS.values() for r in rows] * 3


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory) -> Path:
    """A random 2-layer Llama (vocab of a 400-token byte-level BPE with BOS) saved with its tokenizer."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from depthlab.hf.tiny import tiny_model

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_texts(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    model = tiny_model("llama", jitter=False, vocab_size=tok.get_vocab_size(), num_hidden_layers=2, initializer_range=0.5,
                       bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out
