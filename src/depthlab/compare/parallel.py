"""Run a compare's independent (scheme, seed) runs side by side: ``compare(..., jobs=2)``.

Each worker is a fresh (spawned) process that trains one run and diagnoses it, with the machine's
cores split between the workers (``torch.set_num_threads``). Small models on a CPU gain most: two
single-threaded runs on two cores do more work than one run on two threads. The tokenizer is built
once, before the workers start, so they read it from the cache instead of racing to train it. The
results land in the run directories, where the sequential pass of ``compare`` picks them up.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _warm_tokenizer(cfg: Any) -> None:
    """Train (and cache) the runs' BPE tokenizer once, so parallel runs only read it."""
    from depthlab.data import DEFAULT_TOKENIZER, build_tokenizer, is_shard_dir, iter_documents
    from depthlab.families import family_of_preset

    if family_of_preset(cfg.preset).name != "lm":  # ViTs read images: no tokenizer
        return
    t = cfg.train
    spec = t.tokenizer or DEFAULT_TOKENIZER
    if spec.startswith("bpe:") and not is_shard_dir(t.data):
        build_tokenizer(spec, iter_documents(t.data, "train", t.text_field), cache_dir=t.cache_dir)


def run_in_parallel(work: Callable[..., str], cfg: Any, todo: list[tuple[str, int, Path]], jobs: int,
                    command: str | None) -> None:
    """``work(cfg, scheme, seed, run_dir, command)`` (a module-level function: workers import it by
    name) for every (scheme, seed, run_dir) of ``todo``, ``jobs`` at a time."""
    if jobs < 2 or len(todo) < 2:
        return
    jobs = min(jobs, len(todo))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    _warm_tokenizer(cfg)
    log.info("training %d runs, %d at a time (%d thread(s) each)", len(todo), jobs, threads)
    ctx = mp.get_context("spawn")  # fresh interpreters: no forked torch thread pools or locks
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads,)) as pool:
        futures = [pool.submit(work, cfg, s, seed, d, command) for s, seed, d in todo]
        for fut in as_completed(futures):
            log.info("%s: trained and diagnosed", fut.result())
