"""Tokenizers behind one small interface: ``encode``, ``decode``, ``vocab_size``, ``eos_id``, ``pad_id``.

Specs (``--tokenizer``):

    bytes               UTF-8 bytes (256 ids) + EOS (256) + PAD (257)
    bpe:N               byte-level BPE of N tokens trained with Hugging Face ``tokenizers`` on the
                        training split, cached by (N, hash of the training texts)
    hf:NAME_OR_PATH     any ``transformers.AutoTokenizer`` (e.g. hf:t5-base; a local directory;
                        a ``.gguf`` file, whose tokenizer transformers reads)

``tok.save(directory)`` writes ``depthlab_tokenizer.json`` (kind + spec) beside the tokenizer's own
files; ``load_tokenizer(directory)`` reads it back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.fileio import publish

log = logging.getLogger(__name__)

META = "depthlab_tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BPE_MAX_TEXTS = 200_000  # at most this many training documents feed a bpe:N tokenizer
TOKENIZER_SPECS = ("bytes", "bpe:N", "hf:NAME_OR_PATH")
ENCODE_CHUNK = 512  # documents per encode_batch call


def default_cache_dir() -> Path:
    """``$DEPTHLAB_CACHE`` or ``~/.cache/depthlab``."""
    return Path(os.environ.get("DEPTHLAB_CACHE") or Path.home() / ".cache" / "depthlab")


class Tokenizer:
    """Base interface. ``spec`` is the string that rebuilds it (stored in run configs)."""

    spec: str
    vocab_size: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_files(directory)
        (directory / META).write_text(json.dumps({"kind": self.kind, "spec": self.spec}, indent=2) + "\n")
        return directory

    kind = "base"

    def _save_files(self, directory: Path) -> None:
        pass

    def fingerprint(self) -> str:
        """A short hash identifying the exact vocabulary (for resume checks and caches)."""
        h = hashlib.sha256(self.spec.encode())
        for i in (0, 1, 2, self.vocab_size // 2, self.vocab_size - 1):
            h.update(repr(self.decode([i])).encode())
        h.update(f"{self.vocab_size}/{self.eos_id}/{self.pad_id}".encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    kind = "bytes"

    def __init__(self) -> None:
        self.spec = "bytes"
        self.vocab_size = 258
        self.eos_id = 256
        self.pad_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizersTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (our trained byte-level BPE)."""

    kind = "tokenizers"

    def __init__(self, tok, spec: str) -> None:  # tok: tokenizers.Tokenizer
        self.tok = tok
        self.spec = spec
        self.vocab_size = tok.get_vocab_size()
        self.eos_id = tok.token_to_id(EOS_TOKEN)
        self.pad_id = tok.token_to_id(PAD_TOKEN)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def _save_files(self, directory: Path) -> None:
        self.tok.save(str(directory / "tokenizer.json"))

    @classmethod
    def load(cls, directory: Path, spec: str) -> HFTokenizersTokenizer:
        from tokenizers import Tokenizer as _Tok

        return cls(_Tok.from_file(str(directory / "tokenizer.json")), spec)


class AutoTokenizerWrapper(Tokenizer):
    """A ``transformers`` tokenizer; EOS from the tokenizer, PAD = its pad token or else EOS."""

    kind = "hf"

    def __init__(self, tok, spec: str) -> None:
        self.tok = tok
        self.spec = spec
        self.vocab_size = len(tok)
        eos = tok.eos_token_id
        if eos is None:
            eos = tok.sep_token_id if tok.sep_token_id is not None else tok.pad_token_id
        if eos is None:
            raise DepthlabError(f"tokenizer {spec!r} has no EOS (or SEP/PAD) token to separate documents")
        self.eos_id = int(eos)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False, verbose=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tok(list(texts), add_special_tokens=False, verbose=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids))

    def _save_files(self, directory: Path) -> None:
        self.tok.save_pretrained(str(directory))

    @classmethod
    def from_spec(cls, spec: str) -> AutoTokenizerWrapper:
        name = spec[3:]
        if not name:
            raise DepthlabError(f"tokenizer {spec!r}: expected hf:NAME_OR_PATH")
        from transformers import AutoTokenizer

        kwargs = {}
        path = Path(name).expanduser()
        if path.suffix == ".gguf":
            if not path.is_file():
                raise DepthlabError(f"tokenizer {spec!r}: GGUF file not found")
            name, kwargs = str(path.parent), {"gguf_file": path.name}
        try:
            tok = AutoTokenizer.from_pretrained(name, trust_remote_code=False, **kwargs)
        except Exception as err:  # offline, unknown repo, missing gguf extra, ...
            raise DepthlabError(f"cannot load tokenizer {spec!r}: {first_line(err)}") from None
        return cls(tok, spec)


def _bpe_size(spec: str) -> int:
    m = re.fullmatch(r"bpe:(\d+)", spec)
    if not m:
        raise DepthlabError(f"invalid tokenizer {spec!r}; bpe takes a size, e.g. bpe:4096")
    n = int(m.group(1))
    if not 260 <= n <= 1_000_000:
        raise DepthlabError(f"tokenizer {spec!r}: the BPE size must lie in [260, 1000000]")
    return n


def check_tokenizer_spec(spec: str) -> None:
    """Raise DepthlabError for a malformed spec, without building anything."""
    if spec == "bytes" or spec.startswith("hf:"):
        if spec == "hf:":
            raise DepthlabError(f"tokenizer {spec!r}: expected hf:NAME_OR_PATH")
        return
    if spec.startswith("bpe:"):
        _bpe_size(spec)
        return
    raise DepthlabError(f"unknown tokenizer {spec!r}; choose one of: {', '.join(TOKENIZER_SPECS)}")


def _train_bpe(size: int, texts: list[str], spec: str) -> HFTokenizersTokenizer:
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizersTokenizer(tok, spec)


def build_tokenizer(spec: str, train_texts: Iterable[str] | None = None, cache_dir: str | Path | None = None) -> Tokenizer:
    """Build the tokenizer a spec names. ``bpe:N`` trains on ``train_texts`` (required) and caches
    the result under ``cache_dir`` (default :func:`default_cache_dir`) keyed by N and the texts."""
    check_tokenizer_spec(spec)
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        return AutoTokenizerWrapper.from_spec(spec)
    size = _bpe_size(spec)
    if train_texts is None:
        raise DepthlabError(f"tokenizer {spec!r} must be trained: give training texts")
    texts, h = [], hashlib.sha256(spec.encode())
    for text in train_texts:
        texts.append(text)
        h.update(hashlib.sha256(text.encode("utf-8")).digest())
        if len(texts) >= BPE_MAX_TEXTS:
            break
    if not texts:
        raise DepthlabError(f"tokenizer {spec!r}: no training text (the data's train split is empty)")
    cache = Path(cache_dir or default_cache_dir()) / "tokenizers" / f"bpe{size}-{h.hexdigest()[:16]}"
    if (cache / META).is_file():
        log.debug("tokenizer %s from cache %s", spec, cache)
        return HFTokenizersTokenizer.load(cache, spec)
    log.info("training %s tokenizer on %d documents", spec, len(texts))
    tok = _train_bpe(size, texts, spec)
    try:  # published whole: a concurrent or interrupted build never leaves half a cache
        with publish(cache, directory=True, if_exists="keep") as tmp:  # "keep": another process won the race
            tok.save(tmp)
    except (OSError, DepthlabError) as err:
        log.warning("could not cache tokenizer in %s: %s", cache, err)
    return tok


def encode_documents(docs: Iterable[str], tokenizer: Tokenizer) -> Iterator[list[int]]:
    """Encode documents in chunks (fast batched tokenizers), yielding one id list per document."""
    it = iter(docs)
    while True:
        chunk = list(islice(it, ENCODE_CHUNK))
        if not chunk:
            return
        yield from tokenizer.encode_batch(chunk)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """A tokenizer saved with ``tok.save(directory)`` (e.g. a run's ``tokenizer/``)."""
    directory = Path(directory)
    meta_path = directory / META
    if not meta_path.is_file():
        raise DepthlabError(f"{str(directory)!r} holds no saved depthlab tokenizer ({META} missing)")
    meta = json.loads(meta_path.read_text())
    kind, spec = meta["kind"], meta["spec"]
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "tokenizers":
        return HFTokenizersTokenizer.load(directory, spec)
    if kind == "hf":
        from transformers import AutoTokenizer

        return AutoTokenizerWrapper(AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False), spec)
    raise DepthlabError(f"{meta_path}: unknown tokenizer kind {kind!r}")


def model_tokenizer(path: str | Path, **kwargs) -> AutoTokenizerWrapper | None:
    """The tokenizer shipped in a Hugging Face model directory (``kwargs``: e.g. ``gguf_file``), or None when it has
    none: a command that needs text says so in its one line when it gets there."""
    from transformers import AutoTokenizer

    spec = "hf:" + (str(Path(path) / kwargs["gguf_file"]) if "gguf_file" in kwargs else str(path))
    try:
        return AutoTokenizerWrapper(AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, **kwargs), spec)
    except DepthlabError:
        raise
    except Exception as err:  # noqa: BLE001 - any loader failure
        log.debug("no tokenizer for %s (%s); pass token data another way", path, first_line(err)[:120])
        return None
