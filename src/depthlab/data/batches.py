"""From documents (or token shards, :mod:`depthlab.data.shards`) to fixed-shape token batches: packing (default)
or per-document padding.

Packing (default): documents are encoded, each followed by EOS, concatenated, and cut into windows
of ``seq_len + 1`` tokens; a window gives inputs ``x = w[:-1]`` and next-token labels ``y = w[1:]``
(the model does not shift labels).

Padding (``pack=False``, as the paper's official code): each document + EOS is truncated to
``seq_len + 1`` tokens and padded with PAD; labels at pad positions are ``-100`` (ignored), so the
mask covers exactly the pad positions, whatever the PAD id is.

Training order: :class:`TokenSequences` holds every training window; global sequence ``g`` (the
``g``-th sequence the run consumes) is row ``perm_e[g mod N]`` of a permutation drawn per epoch
``e = g div N`` from the seed alone. The order thus depends only on (data, tokenizer, seq_len,
seed) — never on the model or scheme — and resuming means knowing ``g``.
"""

from __future__ import annotations

import hashlib
import logging
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import publish
from depthlab.data.corpora import builtin_path, iter_documents, resolve_files
from depthlab.data.named import NAMED_CORPORA, named_fingerprint
from depthlab.data.shards import reads_shards, shard_tokens
from depthlab.data.tokenizers import Tokenizer, default_cache_dir, encode_documents
from depthlab.models.decoder import IGNORE_INDEX  # the loss convention is the model's; re-exported by depthlab.data

log = logging.getLogger(__name__)

def pack_tokens(token_lists: Iterable[Sequence[int]], eos_id: int, window: int) -> np.ndarray:
    """Concatenate documents, each followed by EOS, into rows of ``window`` tokens (tail dropped)."""
    eos = np.asarray([eos_id], dtype=np.int64)
    parts = [p for ids in token_lists for p in (np.asarray(ids, dtype=np.int64), eos)]
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    n = len(flat) // window
    return flat[: n * window].reshape(n, window)


def pad_tokens(token_lists: Iterable[Sequence[int]], eos_id: int, pad_id: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """One row per document: ids + EOS, truncated to ``window``, padded with ``pad_id``.
    Returns (rows (N, window), lengths (N,)): positions >= length are padding."""
    rows, lengths = [], []
    for ids in token_lists:
        seq = (list(ids) + [eos_id])[:window]
        lengths.append(len(seq))
        rows.append(seq + [pad_id] * (window - len(seq)))
    if not rows:
        return np.zeros((0, window), np.int64), np.zeros((0,), np.int64)
    return np.asarray(rows, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


def inputs_and_labels(rows: np.ndarray, lengths: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows (B, T+1) -> inputs (B, T) and labels (B, T); label ``-100`` where the target is padding."""
    rows_t = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    x, y = rows_t[:, :-1].clone(), rows_t[:, 1:].clone()
    if lengths is not None:
        pos = torch.arange(1, rows_t.shape[1]).unsqueeze(0)  # position of each target in the window
        y[pos >= torch.as_tensor(np.asarray(lengths)).unsqueeze(1)] = IGNORE_INDEX
    return x, y


# ---------------------------------------------------------------------- token shards
# ---------------------------------------------------------------------- training sequences
class SeededOrder:
    """The order in which a training source serves its ``n`` items: global item ``g`` is
    ``permutation(epoch = g // n)[g % n]``, a fresh seeded permutation per epoch. Shared by the
    pre-training and fine-tuning sources, so a seed fixes the same order everywhere."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._perm: dict[int, np.ndarray] = {}  # the current epoch's permutation only

    def _epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm:
            self._perm = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n)}
        return self._perm[epoch]

    def ids(self, start: int, count: int) -> np.ndarray:
        """Item numbers of global items ``start .. start+count-1``."""
        n = self.n
        return np.asarray([self._epoch(g // n)[g % n] for g in range(start, start + count)], dtype=np.int64)


class CausalLMWindows(torch.utils.data.Dataset):
    """Packed token rows as a ``torch`` dataset of ``{"input_ids", "labels"}`` items, the form Hugging Face's
    ``Trainer`` and causal LMs take (they shift the labels themselves, so ``labels`` is ``input_ids``)."""

    def __init__(self, rows) -> None:
        self.rows = torch.as_tensor(np.asarray(rows), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class TokenSequences:
    """All training windows of a split, in memory (or memory-mapped), served in seeded order."""

    def __init__(self, rows: np.ndarray, lengths: np.ndarray | None, seed: int) -> None:
        if len(rows) == 0:
            raise DepthlabError("the training data is too short to fill one sequence; add data or lower --seq-len")
        self.rows, self.lengths, self.seed = rows, lengths, seed
        self.order = SeededOrder(len(rows), seed)

    def __len__(self) -> int:
        return len(self.rows)

    def row_ids(self, start: int, count: int) -> np.ndarray:
        """Row numbers of global sequences ``start .. start+count-1``."""
        return self.order.ids(start, count)

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels (count, T) of global sequences ``start .. start+count-1``."""
        idx = self.row_ids(start, count)
        rows = np.asarray(self.rows[np.sort(idx)])[np.argsort(np.argsort(idx))]  # memmap-friendly fancy index
        return inputs_and_labels(rows, None if self.lengths is None else self.lengths[idx])

    def rank_batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share (batch_size // world_size sequences) of global batch ``step`` (0-based):
        rank r takes the r-th slice, so N ranks together see exactly one process's batch."""
        per = batch_size // world_size
        return self.batch(step * batch_size + rank * per, per)

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum()) if self.lengths is not None else self.rows.size


class StreamingSequences:
    """Sequences made on the fly from a document stream too large to hold (``hf:`` data).

    Documents are dealt to ranks round-robin (document ``i`` to rank ``i mod world_size``); each rank
    packs (or pads) its own share in stream order, without shuffling (streamed corpora such as C4
    come shuffled). Access must move forward; resuming skips the sequences already consumed. At the
    end of the stream it starts over (a new epoch). Runs on different world sizes therefore see
    different batches: for exact parity across world sizes, tokenize to shards (``depthlab tokenize``).
    """

    def __init__(self, spec: str, tokenizer: Tokenizer, seq_len: int, *, split: str = "train", pack: bool = True,
                 text_field: str = "text", rank: int = 0, world_size: int = 1) -> None:
        self.spec, self.tokenizer, self.window, self.split, self.pack = spec, tokenizer, seq_len + 1, split, pack
        self.text_field, self.rank, self.world_size = text_field, rank, world_size
        iter_documents(spec, split, text_field)  # fail early on a bad spec
        self.pos, self.epoch = 0, 0
        self._rows = self._generate()

    def __len__(self) -> int:
        return 0  # unknown

    def _docs(self) -> Iterator[list[int]]:
        docs = islice(iter_documents(self.spec, self.split, self.text_field), self.rank, None, self.world_size)
        return encode_documents(docs, self.tokenizer)

    def _generate(self) -> Iterator[tuple[list[int], int]]:
        eos, pad, W = self.tokenizer.eos_id, self.tokenizer.pad_id, self.window
        while True:
            produced, buf = 0, []
            for ids in self._docs():
                if self.pack:
                    buf.extend(ids)
                    buf.append(eos)
                    while len(buf) >= W:
                        produced += 1
                        yield buf[:W], W
                        del buf[:W]
                else:
                    seq = (list(ids) + [eos])[:W]
                    produced += 1
                    yield seq + [pad] * (W - len(seq)), len(seq)
            if produced == 0:
                raise DepthlabError(f"data {self.spec!r} gives rank {self.rank} no {self.split} sequence of {W} tokens")
            self.epoch += 1
            log.info("%s: starting epoch %d of the stream", self.spec, self.epoch)

    def rank_batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        per = batch_size // world_size
        target = step * per
        if target < self.pos:
            raise RuntimeError(f"streaming data cannot go back (at sequence {self.pos}, asked for {target})")
        for _ in range(target - self.pos):  # resume: skip what was consumed
            next(self._rows)
        rows = [next(self._rows) for _ in range(per)]
        self.pos = target + per
        arr = np.asarray([r for r, _ in rows], dtype=np.int64)
        return inputs_and_labels(arr, None if self.pack else np.asarray([n for _, n in rows]))


def _local_fingerprint(spec: str) -> str | None:
    """A cache key for a local corpus (paths, sizes, mtimes); None for streamed data."""
    if spec.startswith("hf:"):
        return None
    if spec in NAMED_CORPORA:
        return named_fingerprint(spec)
    files = [builtin_path()] if spec == "builtin" else resolve_files(spec)
    h = hashlib.sha256(spec.encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _cached_encode(spec: str, split: str, tokenizer: Tokenizer, text_field: str, cache_dir) -> list[np.ndarray]:
    """Encoded documents of a split, cached as one .npz per (corpus, split, tokenizer)."""
    fp = _local_fingerprint(spec)
    path = None
    if fp is not None:
        key = hashlib.sha256(f"{fp}|{split}|{text_field}|{tokenizer.fingerprint()}".encode()).hexdigest()[:20]
        path = Path(cache_dir or default_cache_dir()) / "tokens" / f"{key}.npz"
        if path.is_file():
            try:
                with np.load(path) as z:
                    flat, offsets = z["flat"], z["offsets"]
                return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
            except Exception:  # a damaged cache file: rebuild it
                log.warning("ignoring unreadable token cache %s", path)
    docs = [np.asarray(ids, dtype=np.int64) for ids in encode_documents(iter_documents(spec, split, text_field), tokenizer)]
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            offsets = np.cumsum([0] + [len(d) for d in docs])
            with publish(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, flat=np.concatenate(docs) if docs else np.zeros(0, np.int64), offsets=offsets)
        except (OSError, DepthlabError) as err:
            log.warning("could not cache tokens in %s: %s", path, err)
    return docs


def load_sequences(
    spec: str,
    tokenizer: Tokenizer,
    seq_len: int,
    *,
    split: str = "train",
    pack: bool = True,
    seed: int = 0,
    text_field: str = "text",
    cache_dir=None,
    streaming: bool | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> TokenSequences | StreamingSequences:
    """Every window of ``seq_len + 1`` tokens of a split (packed) or one padded row per document.

    Local corpora are tokenized in full (and cached); token shards are memory-mapped; ``hf:`` data
    (or ``streaming=True``) is streamed by :class:`StreamingSequences`. Both kinds serve
    ``rank_batch(step, batch_size, rank, world_size)``.
    """
    window = seq_len + 1
    if streaming or (streaming is None and spec.startswith("hf:")):
        return StreamingSequences(spec, tokenizer, seq_len, split=split, pack=pack, text_field=text_field,
                                  rank=rank, world_size=world_size)
    if reads_shards(spec, tokenizer, split) and (pack or spec not in NAMED_CORPORA):  # a name: documents to pad
        if not pack:
            raise DepthlabError(f"token shards {spec!r} are packed; --no-pack needs documents, not shards")
        flat = shard_tokens(spec, split)
        n = len(flat) // window
        return TokenSequences(flat[: n * window].reshape(n, window), None, seed)
    docs = _cached_encode(spec, split, tokenizer, text_field, cache_dir)
    if not docs:
        raise DepthlabError(f"data {spec!r} has no documents in its {split} split")
    if pack:
        return TokenSequences(pack_tokens(docs, tokenizer.eos_id, window), None, seed)
    rows, lengths = pad_tokens(docs, tokenizer.eos_id, tokenizer.pad_id, window)
    return TokenSequences(rows, lengths, seed)


# ---------------------------------------------------------------------- evaluation batches
class EvalBatches:
    """Iterable of LongTensor (B, seq_len) batches of packed held-out text, ``n_tokens`` in all.

    After iterating: ``tokens`` = tokens yielded, ``short`` = True when the split held fewer
    than asked (a warning is logged too). Iterating again yields the same batches.
    """

    def __init__(self, spec: str, tokenizer: Tokenizer, n_tokens: int, seq_len: int, batch_size: int,
                 split: str = "val", text_field: str = "text") -> None:
        if n_tokens < 1 or seq_len < 1 or batch_size < 1:
            raise DepthlabError("n_tokens, seq_len and batch_size must be positive")
        self.spec, self.tokenizer, self.n_tokens = spec, tokenizer, n_tokens
        self.seq_len, self.batch_size, self.split, self.text_field = seq_len, batch_size, split, text_field
        self.tokens, self.short = 0, False
        self.shards = reads_shards(spec, tokenizer, split)
        if not self.shards:
            iter_documents(spec, split, text_field)  # validate the spec eagerly

    def _windows(self) -> Iterator[np.ndarray]:
        T = self.seq_len
        if self.shards:
            flat = shard_tokens(self.spec, self.split)
            for i in range(len(flat) // T):
                yield np.asarray(flat[i * T:(i + 1) * T], dtype=np.int64)
            return
        buf: list[int] = []
        for ids in encode_documents(iter_documents(self.spec, self.split, self.text_field), self.tokenizer):
            buf.extend(ids)
            buf.append(self.tokenizer.eos_id)
            while len(buf) >= T:
                yield np.asarray(buf[:T], dtype=np.int64)
                del buf[:T]

    def __iter__(self) -> Iterator[torch.Tensor]:
        want = -(-self.n_tokens // self.seq_len)  # sequences needed
        self.tokens, got, batch = 0, 0, []
        for w in self._windows():
            batch.append(w)
            got += 1
            if len(batch) == self.batch_size or got == want:
                self.tokens += len(batch) * self.seq_len
                yield torch.as_tensor(np.stack(batch))
                batch = []
            if got == want:
                break
        if batch:
            self.tokens += len(batch) * self.seq_len
            yield torch.as_tensor(np.stack(batch))
        self.short = got < want
        if self.short:
            log.warning("%s split of %r holds only %d tokens in windows of %d (asked for %d)",
                        self.split, self.spec, self.tokens, self.seq_len, self.n_tokens)


def eval_token_batches(spec: str, tokenizer: Tokenizer, n_tokens: int, seq_len: int, batch_size: int,
                       split: str = "val", text_field: str = "text") -> EvalBatches:
    """Packed held-out text as LongTensor (B, seq_len) batches, stopping at ``n_tokens`` tokens
    (rounded up to whole sequences). Check ``.short`` / ``.tokens`` after iterating. For next-token
    loss, ask for ``seq_len + 1`` and use ``b[:, :-1]`` as inputs, ``b[:, 1:]`` as labels."""
    return EvalBatches(spec, tokenizer, n_tokens, seq_len, batch_size, split, text_field)
