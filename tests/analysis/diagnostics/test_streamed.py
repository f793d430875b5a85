"""The layer-streamed engine gives the in-memory engine's numbers, holds one layer at a time, resumes after kill -9.

Equality is asserted to 1e-5 (max |Δ|) on every number both engines report: the angular distance of all
pairs, the held-out loss, the loss and Δloss with each block removed and with each adjacent pair swapped, the
variance / norm lists; the effective depth exactly."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_streamed_units_lens import units_lens_diff
from tiny_models import KINDS, hf_dir, save_hf, tiny_hf

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
from depthlab.base.precision import default_compute_dtype
from depthlab.cli import main
from depthlab.targets.stream.open import open_streamed
from depthlab.targets.stream.resume import state_dir
from depthlab.targets.stream.sweep import CPU_ROWS_PER_CALL, Sweeper, SweepSettings

# the block-level numbers (attention/MLP units and the lens: test_streamed_units_lens.py)
OPTS = dict(tokens=96, seq_len=32, batch_size=2, jacobian=False, progress=False, sublayers=False, lens=False)
TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _flat(x):
    if isinstance(x, list):
        return [v for item in x for v in _flat(item)]
    return [x]


def assert_same(a: dict, b: dict, tol: float = TOL) -> None:
    """Every number of the two reports' angular, loss, removal and variance sections within ``tol``."""
    keys = [("angular", k) for k in ("matrix", "adjacent", "to_last")] + [("variance", k) for k in a["variance"]]
    keys += [("loss", "loss")] + ([("removal", k) for k in ("base_loss", "loss", "delta_loss")] if "removal" in a else [])
    keys += [("swap", k) for k in ("base_loss", "loss", "delta_loss")] if "swap" in a else []
    assert ("swap" in a) == ("swap" in b) and ("effective_depth" in a) == ("effective_depth" in b)
    if "effective_depth" in a:  # the same blocks count; the threshold in nats follows the loss (to tol)
        (ea, na), (eb, nb) = [({k: v for k, v in r["effective_depth"].items() if k != "threshold_nats"},
                               r["effective_depth"]["threshold_nats"]) for r in (a, b)]
        assert ea == eb and abs(na - nb) <= tol
    for section, key in keys:
        x, y = _flat(a[section][key]), _flat(b[section][key])
        assert len(x) == len(y) and [v is None for v in x] == [v is None for v in y], (section, key)
        worst = max((abs(u - v) for u, v in zip(x, y) if u is not None), default=0.0)
        assert worst <= tol, f"{section}.{key}: max |Δ| = {worst:.3g}"
    assert a["data"]["tokens"] == b["data"]["tokens"] and a["summary"] == b["summary"]


def _both(path: Path, **kw) -> tuple[dict, dict]:
    opts = DiagnoseOptions(**{**OPTS, **kw})
    return diagnose(load_target(str(path)), opts), diagnose(open_streamed(str(path)), opts)


@pytest.mark.parametrize("kind", list(KINDS))
def test_streamed_equals_in_memory_on_hf_families(tmp_path, kind, caplog):
    caplog.set_level(logging.INFO, logger="depthlab")
    mem, streamed = _both(hf_dir(tmp_path, kind, 4), joint_check=kind == "llama-lns")  # one joint check is enough
    assert_same(mem, streamed)
    assert set(streamed) == set(mem) and streamed["engine"]["name"] == "streamed" and mem["engine"]["name"] == "in-memory"
    assert streamed["model"] == mem["model"]  # the report says the same of the model
    said = [r.getMessage() for r in caplog.records]
    assert not any(l.startswith("joint-") for l in said)  # no progress lines per joint sweep, one line per set
    evaluated = streamed["removal"]["removable"].get("evaluated", {})
    assert sum(l.startswith("removable blocks, joint check:") for l in said) == len(evaluated) - ("0" in evaluated)


def _run(tmp_path: Path, scheme: str = "lns") -> Path:
    import depthlab as d
    from depthlab.train import TrainConfig, train

    out = tmp_path / f"run-{scheme}"
    cfg = d.from_preset("tiny", n_layers=4, d_model=32, n_heads=4, d_ff=64, scheme=scheme)
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=2, batch_size=4, seq_len=32, eval_every=0,
                           eval_tokens=256, variance_every=0, ckpt_every=0, device="cpu"), out, quiet=True)
    return out


@pytest.mark.parametrize("scheme", ["lns", "peri-ln"])
def test_streamed_equals_in_memory_on_a_depthlab_run(tmp_path, scheme):
    mem, streamed = _both(_run(tmp_path, scheme))  # LNS: 1/sqrt(l) per block; Peri-LN: a norm after the embedding
    assert_same(mem, streamed)
    assert streamed["model"] == mem["model"] and streamed["data"]["split"] == "val"


def test_multiple_choice_drop_equals_in_memory(tmp_path):
    mem, streamed = _both(hf_dir(tmp_path, "llama", 3), mc="builtin-mc", mc_limit=6, joint_check=False)
    assert streamed["mc"] == mem["mc"]
    assert len(streamed["mc"]["removed_acc"]) == 3


def test_bf16_weights_are_computed_in_fp32_one_layer_at_a_time(tmp_path):
    """--dtype bf16 streamed on a CPU: weights rounded to bf16 as read, each layer upcast while it computes; the
    numbers are those of the in-memory fp32 model holding the same bf16-rounded weights."""
    path = hf_dir(tmp_path, "llama", 3)
    opts = DiagnoseOptions(**OPTS, joint_check=False)
    target = load_target(str(path))
    with torch.no_grad():
        for p in target.model.parameters():
            p.copy_(p.bfloat16().float())
    streamed = open_streamed(str(path), "cpu", torch.bfloat16, default_compute_dtype(torch.device("cpu"), torch.bfloat16))
    rep = diagnose(streamed, opts)
    assert rep["engine"]["compute_dtype"] == "float32" and rep["model"]["dtype"] == "bfloat16"
    assert_same(diagnose(target, opts), rep)


def test_bf16_in_memory_on_a_cpu_keeps_bf16_weights_and_gives_the_streamed_numbers(tmp_path):
    """load_target(dtype=bf16) on a CPU: every weight stays bf16 (no fp32 copy of the model survives a forward),
    each linear layer computes in fp32, so diagnose gives the streamed bf16 engine's numbers and the logits of the
    fp32 model holding the same bf16-rounded weights; plain bf16 arithmetic would differ by bf16 rounding."""
    from depthlab.prune.export import lm_logits

    path = hf_dir(tmp_path, "llama", 3)
    opts = DiagnoseOptions(**OPTS, joint_check=False)
    bf16 = load_target(str(path), dtype=torch.bfloat16)
    rounded = load_target(str(path))
    with torch.no_grad():
        for p in rounded.model.parameters():
            p.copy_(p.bfloat16().float())
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = lm_logits(bf16.model, ids), lm_logits(rounded.model, ids)
    assert got.dtype == torch.float32 and float((got - want).abs().max()) <= TOL
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        plain = lm_logits(copy.deepcopy(rounded.model).to(torch.bfloat16), ids)  # bf16 arithmetic, no hooks
    assert float((plain.float() - want).abs().max()) > 100 * TOL
    streamed = open_streamed(str(path), "cpu", torch.bfloat16, default_compute_dtype(torch.device("cpu"), torch.bfloat16))
    assert_same(diagnose(bf16, opts), diagnose(streamed, opts))


def test_memory_is_one_layer_plus_the_streams(tmp_path):
    """24 small layers: the weights alive at once never exceed the largest single module (a layer, the embedding
    or the head), two layers while the swap lanes apply the previous layer after the current one; every tensor is
    read once per pass over the weights; the streams take what the layout says. A stream budget of a third of that
    splits the batches into groups (more weight passes), same numbers."""
    L = 24
    path = save_hf(tiny_hf("llama", L, hidden=64), tmp_path / "deep")
    opts = DiagnoseOptions(**{**OPTS, "tokens": 192}, joint_check=False)
    target = open_streamed(str(path))
    src = target.source
    one = max([src.store.nbytes(src.keys_of(m)) for m in (*src.embed_modules, *src.head_modules)]
              + [src.layer_nbytes(i) for i in range(L)])
    assert src.store.nbytes() > 20 * one  # the whole model is far more than one layer
    no_swap = diagnose(target, DiagnoseOptions(**{**OPTS, "tokens": 192}, joint_check=False, swap=False))
    assert 0 < src.store.meter.peak <= one and "swap" not in no_swap
    target = open_streamed(str(path))
    src = target.source
    whole = diagnose(target, opts)
    meter = src.store.meter
    assert one < meter.peak <= 2 * one and meter.live == 0  # a layer and the one before it, for the swap lanes
    assert set(meter.reads.values()) == {1} and len(meter.reads) == len(src.store.index)
    n_tok, D = whole["data"]["tokens"], 64
    streams, states = L + 1 + L - 1, L + 1  # the base + one per removed block + one per swapped pair; x^1 .. x^{L+1}
    assert whole["engine"]["stream_bytes"] == (streams + states) * n_tok * D * 4
    assert whole["engine"]["weight_passes"] == 1 and whole["engine"]["layers_computed"] == L

    target = open_streamed(str(path))
    grouped = diagnose(target, opts, settings=SweepSettings(lane_budget=whole["engine"]["stream_bytes"] // 3,
                                                                     progress=False))
    assert grouped["engine"]["weight_passes"] == 3 and set(target.source.store.meter.reads.values()) == {3}
    assert grouped["engine"]["stream_bytes"] <= whole["engine"]["stream_bytes"] // 3
    assert_same(whole, grouped, tol=1e-12)


def test_layer_calls_are_capped_on_a_cpu_and_their_size_does_not_change_the_numbers(tmp_path):
    """The default rows per call is at most CPU_ROWS_PER_CALL on a CPU (big calls run out of cache); calls of one
    sequence each (many calls per layer) give the same report as the default."""
    path = save_hf(tiny_hf("llama", 6, hidden=64), tmp_path / "m")
    opts = DiagnoseOptions(**{**OPTS, "tokens": 192}, joint_check=False)
    target = open_streamed(str(path))
    assert 1 <= Sweeper(target)._budget()[1] <= CPU_ROWS_PER_CALL
    default = diagnose(target, opts, settings=SweepSettings(progress=False))
    one_seq = diagnose(open_streamed(str(path)), opts,
                                settings=SweepSettings(max_rows=opts.seq_len, progress=False))
    assert_same(default, one_seq)


_KILLED = """
import os, signal, torch
from pathlib import Path
torch.set_num_threads(1)
from depthlab.analysis.diagnostics import DiagnoseOptions
from depthlab.analysis.diagnostics import diagnose
from depthlab.targets.stream.open import open_streamed
from depthlab.targets.stream.sweep import SweepSettings

def on_layer(name, group, layer):
    if name == "diagnose" and layer == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no cleanup of any kind

opts = DiagnoseOptions(tokens=96, seq_len=32, batch_size=2, jacobian=False, joint_check=False, progress=False)
diagnose(open_streamed({path!r}), opts, out=Path({out!r}), settings=SweepSettings(on_layer=on_layer))
"""


def test_a_sweep_killed_mid_way_resumes_after_the_last_saved_layer(tmp_path):
    path, out, kill_at = hf_dir(tmp_path, "llama", 6), tmp_path / "report", 3
    code = textwrap.dedent(_KILLED.format(kill_at=kill_at, path=str(path), out=str(out)))
    env_path = str(Path(__file__).resolve().parents[3] / "src")
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {env_path!r})\n" + code],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    saved = sorted(p.name for p in (state_dir(out) / "diagnose").iterdir())
    assert f"g00000-streams-{kill_at:05d}.pt" in saved and f"g00000-streams-{kill_at + 1:05d}.pt" not in saved
    assert main(["diagnose", str(path), "--stream", "--out", str(out), "--tokens", "96", "--seq-len", "32",
                 "--batch-size", "2", "--no-joint-check", "--no-progress"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["engine"]["resumed"] == [{"pass": "diagnose", "group": 0, "layer": kill_at}]
    assert rep["engine"]["layers_computed"] == 6 - kill_at
    assert not state_dir(out).exists()  # the state goes once the report is written
    mem = diagnose(load_target(str(path)), DiagnoseOptions(**{**OPTS, "sublayers": True, "lens": True}, joint_check=False))
    assert_same(mem, rep, tol=0.0)  # the same numbers as a run never interrupted
    assert units_lens_diff(mem, rep) <= 1e-12  # units and lens too: their sums of layers 1..3 were saved with layer 3
    html = (out / "report.html").read_text()
    assert "Logit lens" in html and "Attention and MLP" in html


def test_diagnose_streams_by_itself_when_the_model_does_not_fit(tmp_path, monkeypatch, capsys):
    import depthlab.targets.engine as engine

    path = hf_dir(tmp_path, "llama", 3)
    monkeypatch.setattr(engine, "available_memory", lambda device: 100_000)  # the model needs ~0.2 MB
    assert main(["diagnose", str(path), "--out", str(tmp_path / "o"), "--tokens", "64", "--seq-len", "32",
                 "--no-progress", "--no-joint-check"]) == 0
    plan = capsys.readouterr().out.splitlines()[0]
    assert plan.startswith("diagnose on cpu:") and "engine: streamed, one layer at a time (the model needs" in plan
    assert "Jacobians are in-memory only" in plan
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["engine"]["name"] == "streamed" and "jacobian" not in rep and rep["options"]["stream"] is None
    assert "streamed, one layer at a time" in (tmp_path / "o" / "report.html").read_text()


def _exit_2(argv, capsys, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_clear_errors_before_streaming(tmp_path, monkeypatch, capsys):
    import depthlab.targets.stream.sweep as engine

    path = hf_dir(tmp_path, "llama", 2)
    out = ["--out", str(tmp_path / "o"), "--no-progress"]
    _exit_2(["diagnose", "preset:tiny", "--stream", *out], capsys, "cannot stream 'preset:tiny'")
    _exit_2(["diagnose", str(path), "--stream", "--jacobian", *out], capsys, "--jacobian needs the model in memory")
    monkeypatch.setattr(engine, "available_memory", lambda device: 10_000)
    _exit_2(["diagnose", str(path), "--stream", "--tokens", "64", *out], capsys, "not enough memory to stream")


@pytest.mark.slow
def test_streamed_equals_in_memory_on_smollm2(smollm2_dir):
    mem, streamed = _both(smollm2_dir, tokens=24, seq_len=24, batch_size=1, joint_check=False)
    assert_same(mem, streamed)
    assert streamed["model"]["n_layers"] == 30 and 2.0 < streamed["loss"]["loss"] < 7.0
