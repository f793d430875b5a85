"""Fault injection: a checkpoint called good holds finite weights, damage falls back to an older
checkpoint with an exact continuation, one writer per run, changed inputs are refused on resume."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from depthlab import from_preset
from depthlab.base.errors import DepthlabError
from depthlab.base.store.checkpoint import damage, list_checkpoints, save_checkpoint
from depthlab.base.store.lock import RunLock
from depthlab.cli import main
from depthlab.data import build_tokenizer
from depthlab.train import TrainConfig, TrainingDiverged, load_run, train
from depthlab.train import loop as loop_mod

SRC = str(Path(__file__).resolve().parents[2] / "src")


def small_model(**kw):
    return from_preset("tiny", **{"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, **kw})


def corpus(path: Path, word: str = "word") -> Path:
    """A small local jsonl corpus (fast; the built-in one takes seconds to load)."""
    path.write_text("\n".join(json.dumps({"text": f"In the beginning {i} was the {word}, and {i * 7} more. " * 8})
                              for i in range(120)) + "\n")
    return path


DATA = corpus(Path(os.environ.get("TMPDIR", "/tmp")) / f"depthlab-faults-{os.getpid()}.jsonl")


def small_train(**kw):
    base = dict(data=str(DATA), tokenizer="bytes", steps=6, batch_size=4, seq_len=32, eval_tokens=256,
                eval_every=3, variance_every=3, log_every=1, ckpt_every=3, keep_last=3, lr=3e-3, device="cpu")
    return TrainConfig(**{**base, **kw})


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A finished 6-step run (checkpoints at 3 and 6) and a copy of its final weights."""
    out = tmp_path_factory.mktemp("ref") / "run"
    train(small_model(), small_train(), out, quiet=True)
    return out, weights(out / "checkpoint" / "step-00000006")


# ------------------------------------------------------------------ 1. finite checkpoints only
def test_nan_weights_after_a_finite_loss_are_never_checkpointed(tmp_path, monkeypatch):
    real = loop_mod.train_step

    def blow_up(step, forward, model, *a, **k):  # the update of step 2 produces NaN weights, its loss was finite
        res = real(step, forward, model, *a, **k)
        if step == 2:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        return res

    monkeypatch.setattr(loop_mod, "train_step", blow_up)
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as info:
        train(small_model(), small_train(ckpt_every=1), out, quiet=True)
    assert info.value.step == 2 and info.value.checkpoint.name == "step-00000001"
    assert "step-00000001" in str(info.value)
    assert [p.name for p in list_checkpoints(out)] == ["step-00000001"]
    assert all(torch.isfinite(t).all() for t in weights(info.value.checkpoint).values())


def test_real_divergence_keeps_finite_checkpoints_and_resumes_with_lower_lr(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--data", str(DATA), "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2",
            "--set", "d_ff=64", "--tokenizer", "bytes", "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "128",
            "--steps", "30", "--ckpt-every", "1", "--keep-last", "1", "--device", "cpu", "--no-plots", "-q",
            "--out", str(out)]
    assert main([*args, "--lr", "1e6", "--warmup", "29"]) == 1  # blows up after a few warm-up steps
    err = capsys.readouterr().err
    assert "last good checkpoint" in err or "no checkpoint was written yet" in err
    for ckpt in list_checkpoints(out):  # keep_last=1 kept a finite one, never a NaN one
        assert all(torch.isfinite(t).all() for t in weights(ckpt).values())
    if not list_checkpoints(out):
        return  # diverged before the first checkpoint: nothing to resume
    assert main(["train", "--resume", str(out), "--lr", "1e-3", "-q", "--no-plots"]) == 2
    assert "--allow-changed lr" in capsys.readouterr().err
    code = main(["train", "--resume", str(out), "--lr", "1e-3", "--warmup", "0", "--allow-changed", "lr,warmup", "-q",
                 "--no-plots"])
    assert code in (0, 1), capsys.readouterr().err  # accepted (weights this far gone may diverge again: exit 1)
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["lr"] == 1e-3 and config["resume_changes"][-1]["changed"]["lr"] == [1e6, 1e-3]
    assert main(["train", "--resume", str(out), "--warmup", "3", "--allow-changed", "steps", "-q"]) == 2
    assert "only lr, warmup, min_lr_ratio" in capsys.readouterr().err


def test_nan_checkpoint_refused_by_load_run_export_and_diagnose(tmp_path, reference, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    sd = {k: torch.full_like(v, float("nan")) for k, v in reference[1].items()}
    config = json.loads((run / "config.json").read_text())
    save_checkpoint(run, 9, sd, {}, {"tokens": 0}, config, keep_last=5)  # e.g. written by an older depthlab
    with pytest.raises(DepthlabError, match="NaN/inf"):
        load_run(run)
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 2
    assert main(["diagnose", str(run), "--out", str(tmp_path / "rep"), "--tokens", "64", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("NaN/inf" in line for line in err), err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "rep").exists()


# ------------------------------------------------------------------ 3. damaged checkpoints
def _corrupt(ckpt: Path, how: str) -> None:
    if how == "tensor-bytes":  # same size, flipped bytes at the end (tensor data, not the header)
        path = ckpt / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[-64:] = bytes(b ^ 0xFF for b in data[-64:])
        path.write_bytes(bytes(data))
    else:
        name = {"header": "model.safetensors", "optimizer": "optimizer.pt", "rng": "rng.pt", "config": "config.json",
                "state": "trainer_state.json"}[how]
        path = ckpt / name
        size = path.stat().st_size
        path.write_bytes((b"\x00garbage{" * size)[:size])


@pytest.mark.parametrize("how", ["tensor-bytes", "header", "optimizer"])
def test_damaged_newest_checkpoint_falls_back_and_continues_exactly(tmp_path, reference, how, caplog):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    _corrupt(run / "checkpoint" / "step-00000006", how)
    train(small_model(), small_train(), run, resume=True, quiet=True)  # retrains 4..6 from step 3
    assert "step-00000006 is damaged" in caplog.text
    assert_same(weights(run / "checkpoint" / "step-00000006"), reference[1])


@pytest.mark.parametrize("how", ["tensor-bytes", "header", "optimizer", "rng", "config", "state"])
def test_damage_names_every_kind_of_corruption(tmp_path, reference, how):
    ckpt = tmp_path / "step-00000006"
    shutil.copytree(reference[0] / "checkpoint" / "step-00000006", ckpt)
    assert damage(ckpt) is None
    _corrupt(ckpt, how)
    assert damage(ckpt) is not None


def test_no_intact_checkpoint_is_one_line(tmp_path, reference, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    for ckpt in list_checkpoints(run):
        _corrupt(ckpt, "tensor-bytes")
    assert main(["train", "--resume", str(run), "-q", "--no-plots"]) == 2
    assert main(["diagnose", str(run), "--out", str(tmp_path / "rep"), "--tokens", "64", "--device", "cpu"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 2 and all("no intact checkpoint" in ln for ln in err), err


def test_unsafe_pickle_is_one_line_without_advice(tmp_path, reference):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    ckpt = run / "checkpoint" / "step-00000006"

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, ckpt / "optimizer.pt")
    state = json.loads((ckpt / "trainer_state.json").read_text())  # a consistent tampering: sizes and sums updated
    from depthlab.base.fileio import sha256_file

    state["files"]["optimizer.pt"] = (ckpt / "optimizer.pt").stat().st_size
    state["sha256"]["optimizer.pt"] = sha256_file(ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    from depthlab.base.store.checkpoint import load_intact

    with pytest.raises(DepthlabError) as info:
        load_intact(ckpt)
    msg = str(info.value)
    assert "\n" not in msg and "weights_only" not in msg and "refusing to unpickle" in msg


# ------------------------------------------------------------------ 4, 9. changed inputs on resume
def test_swapped_tokenizer_is_refused_on_resume(tmp_path):
    data = corpus(tmp_path / "a.jsonl")
    cfg = small_train(data=str(data), tokenizer="bpe:300", steps=2, ckpt_every=2, cache_dir=str(tmp_path / "c"))
    run = tmp_path / "run"
    train(small_model(), cfg, run, quiet=True)
    other = build_tokenizer("bpe:300", ["lorem ipsum dolor sit amet, consectetur " * 50] * 20,
                            cache_dir=tmp_path / "c2")
    shutil.rmtree(run / "tokenizer")
    other.save(run / "tokenizer")
    with pytest.raises(DepthlabError, match="not the one the run was trained with"):
        train(small_model(), cfg, run, resume=True, quiet=True)


def test_data_file_edited_in_place_is_refused_on_resume(tmp_path):
    data = corpus(tmp_path / "a.jsonl")
    cfg = small_train(data=str(data), steps=2, ckpt_every=2)
    run = tmp_path / "run"
    train(small_model(), cfg, run, quiet=True)
    corpus(data, word="WORD")  # same size, other content
    with pytest.raises(DepthlabError, match="changed since the run started.*content"):
        train(small_model(), cfg, run, resume=True, quiet=True)


# ------------------------------------------------------------------ 5. metrics.jsonl
def test_torn_metrics_line_is_dropped_on_resume(tmp_path, reference, caplog):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    shutil.rmtree(run / "checkpoint" / "step-00000006")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "loss": 1.2')  # a crash mid-write
    train(small_model(), small_train(), run, resume=True, quiet=True)
    assert "unreadable line" in caplog.text
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------ 2. one writer
def test_locked_run_is_refused_naming_the_holder_and_left_untouched(tmp_path, reference, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(run / '.lock')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode())
        print("locked", flush=True); time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
        assert main(["train", "--resume", str(run), "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by process {holder.pid}" in err[0], err
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    finally:
        holder.kill()
        holder.wait()
    with RunLock(run):  # the dead holder's lock is gone (the kernel released it)
        pass


def test_two_concurrent_writers_exactly_one_runs(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "depthlab", "train", "--data", str(DATA), "--set", "n_layers=2", "--set",
           "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--tokenizer", "bytes", "--seq-len", "16",
           "--batch-size", "4", "--eval-tokens", "128", "--steps", "40", "--device", "cpu", "--no-plots", "-q",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert len(loser.strip().splitlines()) == 1 and ("in use by process" in loser or "already exists" in loser
                                                      or "another process" in loser), loser
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(ln)]
    assert steps == sorted(set(steps))  # one writer: no interleaved history


# ------------------------------------------------------------------ kill -9 during a checkpoint write
def test_kill_during_checkpoint_write_resumes_exactly(tmp_path, reference):
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, signal, torch
        import depthlab.base.store.checkpoint as ck
        from depthlab import from_preset
        from depthlab.train import TrainConfig, train
        torch.set_num_threads(1)
        real, calls = torch.save, [0]
        def dying_save(obj, f, *a, **k):
            calls[0] += 1
            if calls[0] == 3:  # the optimizer file of the second checkpoint (step 6)
                real(obj, f, *a, **k)
                os.kill(os.getpid(), signal.SIGKILL)
            return real(obj, f, *a, **k)
        ck.torch.save = dying_save
        model = from_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64)
        cfg = TrainConfig(data={str(DATA)!r}, tokenizer="bytes", steps=6, batch_size=4, seq_len=32, eval_tokens=256,
                          eval_every=3, variance_every=3, log_every=1, ckpt_every=3, keep_last=3, lr=3e-3,
                          device="cpu")
        train(model, cfg, {str(run)!r}, quiet=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert any(".tmp-" in p.name for p in (run / "checkpoint").iterdir())
    train(small_model(), small_train(), run, resume=True, quiet=True)
    assert not any(".tmp-" in p.name for p in (run / "checkpoint").iterdir())
    assert_same(weights(run / "checkpoint" / "step-00000006"), reference[1])
