"""Token shards: a corpus tokenized once into ``train.bin`` / ``val.bin`` (uint16/uint32, EOS-separated) and
memory-mapped by training (``depthlab tokenize`` writes them; ``--data DIR`` reads them).

    meta = write_shards("corpus.jsonl", tokenizer, "shards/")   # + shards/tokenizer, shards/<SHARDS_META>
    tokens = shard_tokens("shards/", "train")                   # a 1-D memmap of every training token
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import fresh_out
from depthlab.data.corpora import SHARDS_META, iter_documents
from depthlab.data.named import NAMED_CORPORA, shard_path
from depthlab.data.tokenizers import Tokenizer, encode_documents


def is_shard_dir(spec: str) -> bool:
    """True for a token-shard directory or a built named corpus (an unbuilt name raises)."""
    return not spec.startswith("hf:") and spec != "builtin" and (shard_path(spec) / SHARDS_META).is_file()


def shard_meta(spec: str) -> dict:
    return json.loads((shard_path(spec) / SHARDS_META).read_text())


def shard_tokens(spec: str, split: str) -> np.ndarray:
    """The 1-D memmap of a shard directory's ``train`` or ``val`` tokens. A split stored in parts
    (``meta["parts"][split]``: files cut at token boundaries, as named corpora are) is concatenated."""
    meta, root = shard_meta(spec), shard_path(spec)
    dtype = np.dtype(meta["dtype"])
    parts = [p["file"] for p in meta.get("parts", {}).get(split, [])] or [f"{split}.bin"]
    arrays = []
    for name in parts:
        path = root / name
        if not path.is_file():
            raise DepthlabError(f"token shards {spec!r} have no {split} split ({path.name} missing)")
        arrays.append(np.memmap(path, dtype=dtype, mode="r"))
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def shards_fit(spec: str, tokenizer: Tokenizer) -> bool:
    """Whether a shard directory was tokenized with ``tokenizer`` (same vocabulary fingerprint)."""
    return shard_meta(spec).get("fingerprint") == tokenizer.fingerprint()


def reads_shards(spec: str, tokenizer: Tokenizer, split: str) -> bool:
    """Whether ``split`` of ``spec`` comes from token shards. A named corpus asked for both splits,
    or for another vocabulary than its shards', is encoded from its documents instead."""
    if not is_shard_dir(spec):
        return False
    return spec not in NAMED_CORPORA or (split != "all" and shards_fit(spec, tokenizer))


def write_shards(spec: str, tokenizer: Tokenizer, out_dir: str | Path, text_field: str = "text",
                 command: str | None = None) -> dict:
    """Tokenize a corpus once into ``out_dir/{train,val}.bin`` (uint16/uint32, EOS-separated) for
    training on large data: ``--data out_dir`` then memory-maps them. Returns the metadata (``command``: the
    command line that made them, recorded there)."""
    out = fresh_out(out_dir)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "val"):
        n = 0
        with open(out / f"{split}.bin", "wb") as f:
            for ids in encode_documents(iter_documents(spec, split, text_field), tokenizer):
                arr = np.asarray([*ids, tokenizer.eos_id], dtype=dtype)
                f.write(arr.tobytes())
                n += len(arr)
        counts[f"{split}_tokens"] = n
    tokenizer.save(out / "tokenizer")
    meta = {"dtype": np.dtype(dtype).name, "tokenizer": tokenizer.spec, "fingerprint": tokenizer.fingerprint(),
            "source": spec, "text_field": text_field, **counts, **({"command": command} if command else {})}
    (out / SHARDS_META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta
