"""Run a compare's independent (scheme, seed) runs side by side: ``compare(..., jobs=2)``.

Each worker is a fresh (spawned) process that trains one run and diagnoses it, with the machine's
cores split between the workers (``torch.set_num_threads``). Small models on a CPU gain most: two
single-threaded runs on two cores do more work than one run on two threads. The tokenizer is built
once, before the workers start, so they read it from the cache instead of racing to train it. The
results land in the run directories, where the sequential pass of ``compare`` picks them up.

Each run has its own process (not a pool: one dead pool worker breaks the whole pool), so a worker that
fails or is killed (``kill -9``, the OOM killer) stops only its own run; the others finish, and the
compare then ends with one line naming the runs that did not. Run the same command again to resume them.
A worker whose compare process is gone (killed, even with ``kill -9``) stops within seconds: no orphan keeps
training into a directory nobody is watching.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError

log = logging.getLogger(__name__)


def _warm_tokenizer(cfg: Any) -> None:
    """Train (and cache) the runs' BPE tokenizer once, so parallel runs only read it."""
    from depthlab.data import DEFAULT_TOKENIZER, build_tokenizer, is_shard_dir, iter_documents
    from depthlab.models.kinds import kind_of_preset

    if kind_of_preset(cfg.preset).name != "lm":  # ViTs read images: no tokenizer
        return
    t = cfg.train
    spec = t.tokenizer or DEFAULT_TOKENIZER
    if spec.startswith("bpe:") and not is_shard_dir(t.data):
        build_tokenizer(spec, iter_documents(t.data, "train", t.text_field), cache_dir=t.cache_dir)


#: How often a worker checks that the compare that started it is still alive (seconds).
PARENT_CHECK_S = 1.0


def _exit_with(parent_pid: int) -> None:
    """Stop this process once ``parent_pid`` is gone (the worker is then re-parented): a daemon thread."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)  # nothing to clean up: the run's checkpoints are atomic, and it resumes from them

    threading.Thread(target=watch, name="depthlab-parent-watch", daemon=True).start()


def _worker(conn: Any, threads: int, work: Callable[..., str], args: tuple, parent_pid: int | None = None,
            level: int = logging.WARNING) -> None:
    """One run in a fresh process; sends ("ok", name) or ("error", one line) back. Its progress goes to the
    shared stderr as log lines (bars of two processes would overwrite each other), at the parent's ``level``."""
    import torch

    from depthlab.base.progress import use_log_lines

    if parent_pid is not None:
        _exit_with(parent_pid)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("depthlab").setLevel(level)
    use_log_lines()
    torch.set_num_threads(threads)
    try:
        conn.send(("ok", work(*args)))
    except BaseException as err:  # noqa: BLE001 - reported by the parent, in one line
        from depthlab.base.errors import DepthlabError, first_line

        line = first_line(err) if isinstance(err, DepthlabError) else f"{type(err).__name__}: {first_line(err)}"
        conn.send(("error", line[:300]))
    finally:
        conn.close()


def _ended(proc: Any, conn: Any, label: str) -> str | None:
    """None when the worker finished its run, else one line saying how it ended."""
    try:
        status, text = conn.recv() if conn.poll() else (None, None)
    except (EOFError, OSError):  # died before it could answer: its pipe is closed
        status, text = None, None
    conn.close()
    if status == "ok":
        return None
    if status == "error":
        return f"{label}: {text}"
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"{label}: its worker process was {how}"


def run_in_parallel(work: Callable[..., str], cfg: Any, todo: list[tuple[str, int, Path]], jobs: int,
                    command: str | None, label: Callable[[str, int], str] = lambda s, seed: f"{s}-seed{seed}",
                    on_done: Callable[[str], None] | None = None) -> None:
    """``work(cfg, scheme, seed, run_dir, command)`` (a module-level function: workers import it by
    name) for every (scheme, seed, run_dir) of ``todo``, ``jobs`` at a time, each in its own process.

    A worker that fails or dies (``kill -9``, the OOM killer) stops only its own run: the others go on to the
    end, and then one DepthlabError names every run that did not finish (each resumes when the command is run
    again: its checkpoints are kept). ``on_done(label)`` is called for every run that finished."""
    if jobs < 2 or len(todo) < 2:
        return
    jobs = min(jobs, len(todo))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    _warm_tokenizer(cfg)
    log.info("training %d runs, %d at a time (%d thread(s) each)", len(todo), jobs, threads)
    ctx = mp.get_context("spawn")  # fresh interpreters: no forked torch thread pools or locks
    pending, running, failed = list(todo), {}, []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                scheme, seed, run_dir = pending.pop(0)
                parent, child = ctx.Pipe(duplex=False)
                run_args = (cfg, scheme, seed, run_dir, command)
                level = logging.getLogger("depthlab").getEffectiveLevel()
                proc = ctx.Process(target=_worker, args=(child, threads, work, run_args, os.getpid(), level), daemon=False)
                proc.start()
                child.close()
                running[proc.sentinel] = (proc, parent, label(scheme, seed))
            for sentinel in mp_connection.wait(list(running)):
                proc, conn, name = running.pop(sentinel)
                proc.join()
                why = _ended(proc, conn, name)
                if why is None:
                    if on_done is not None:
                        on_done(name)
                    else:
                        log.info("%s: trained and diagnosed", name)
                else:
                    log.warning("%s", why)
                    failed.append(why)
    finally:
        for proc, _, _ in running.values():  # interrupted (Ctrl-C, an error here): no orphan keeps training
            proc.terminate()
            proc.join()
    if failed:
        raise DepthlabError(f"{len(failed)} of {len(todo)} runs did not finish ({'; '.join(failed)}); the others "
                            "finished; run the same command again to resume")
