"""The engine is chosen by the library (depthlab.targets.engine, load_target(stream=)), not the command line:
a library call that asks to stream streams, with the in-memory engine's numbers; the automatic choice follows
the device's free memory; a target whose engine contradicts the options is refused, never run on the other
engine."""

from __future__ import annotations

import pytest
import torch
from tiny_models import hf_dir, report_diff

import depthlab.targets.engine as engine
from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.base.errors import DepthlabError
from depthlab.prune import PruneOptions, prune_target
from depthlab.targets import load_target
from depthlab.targets.engine import plan_engine
from depthlab.targets.stream.open import StreamTarget
from depthlab.targets.target import Target

OPTS = dict(tokens=96, seq_len=32, batch_size=2, jacobian=False, joint_check=False, progress=False)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_a_library_call_with_stream_true_streams_and_gives_the_in_memory_numbers(tmp_path):
    path = hf_dir(tmp_path, "llama", 4)
    streamed = diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))  # a path: opened as the options say
    assert streamed["engine"]["name"] == "streamed" and streamed["engine"]["line"].startswith("streamed")
    assert streamed["engine"]["layers_computed"] == 4 and streamed["engine"]["weight_passes"] == 1  # it did stream
    in_memory = diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))
    assert in_memory["engine"]["name"] == "in-memory"
    assert report_diff(streamed, in_memory) <= 1e-5
    opened = load_target(str(path), stream=True)  # the same through an opened target
    assert isinstance(opened, StreamTarget) and opened.plan.streamed
    assert diagnose(opened, DiagnoseOptions(**OPTS, stream=True))["engine"]["name"] == "streamed"


def test_options_that_contradict_the_target_are_refused_not_run_on_the_other_engine(tmp_path):
    path = hf_dir(tmp_path, "llama", 2)
    with pytest.raises(DepthlabError, match="stream=True asks for the layer-streamed engine, but .* is loaded in memory"):
        diagnose(load_target(str(path)), DiagnoseOptions(**OPTS, stream=True))
    with pytest.raises(DepthlabError, match="stream=False asks for the in-memory engine"):
        diagnose(load_target(str(path), stream=True), DiagnoseOptions(**OPTS, stream=False))
    with pytest.raises(DepthlabError, match="loaded in memory"):
        prune_target(load_target(str(path)), PruneOptions(remove=1, stream=True, progress=False), tmp_path / "p")
    assert not (tmp_path / "p").exists()
    with pytest.raises(DepthlabError, match="cannot stream 'preset:tiny'"):
        load_target("preset:tiny", stream=True)
    from depthlab.analysis.evaluate import evaluate

    with pytest.raises(DepthlabError, match="stream=False asks for the in-memory engine"):  # scoring needs the model
        evaluate(load_target(str(path), stream=True), "builtin-mc", limit=2)


def test_the_automatic_choice_follows_the_free_memory(tmp_path, monkeypatch):
    path = hf_dir(tmp_path, "llama", 3)
    need = plan_engine(str(path), CPU, torch.float32, None).model_bytes
    assert need == sum(p.numel() * 4 for p in load_target(str(path)).model.parameters())  # fp32 bytes of the model
    monkeypatch.setattr(engine, "available_memory", lambda device: int(need / engine.MEMORY_FRACTION) + 1)
    fits = load_target(str(path), stream=None)
    assert isinstance(fits, Target) and not fits.plan.streamed and fits.plan.line.startswith("in memory (the model needs")
    monkeypatch.setattr(engine, "available_memory", lambda device: int(need / engine.MEMORY_FRACTION) - 1)
    too_big = load_target(str(path), stream=None)
    assert isinstance(too_big, StreamTarget) and too_big.plan.streamed
    assert too_big.plan.line.startswith("streamed, one layer at a time (the model needs")
    assert diagnose(too_big, DiagnoseOptions(**OPTS))["engine"]["name"] == "streamed"
    # in bf16 the same model needs half: it fits again
    assert not plan_engine(str(path), CPU, torch.bfloat16, None).streamed
    # forced either way, whatever the memory; a target that cannot stream stays in memory and says why
    assert plan_engine(str(path), CPU, torch.float32, False).line == "in memory (streaming off)"
    assert plan_engine(str(path), CPU, torch.float32, True).line.startswith("streamed, one layer at a time (streaming on;")
    assert "only HF safetensors directories and depthlab LM runs stream" in plan_engine("preset:tiny", CPU, torch.float32,
                                                                                         None).line


def test_prune_target_dispatches_on_the_target_and_gives_the_in_memory_choice(tmp_path):
    path = hf_dir(tmp_path, "llama", 4)
    opts = dict(method="angular-block", remove=1, data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False,
                latency_tokens=2)
    streamed = prune_target(str(path), PruneOptions(**opts, stream=True), tmp_path / "s")
    in_memory = prune_target(load_target(str(path)), PruneOptions(**opts), tmp_path / "m")
    assert (streamed["engine"]["name"], in_memory["engine"]["name"]) == ("streamed", "in-memory")
    assert streamed["removed_blocks"] == in_memory["removed_blocks"]
    assert streamed["loss"]["pruned"] == pytest.approx(in_memory["loss"]["pruned"], abs=1e-5)


def test_bf16_arithmetic_from_fp32_weights_is_refused_and_bf16_weights_compute_as_asked(tmp_path):
    path = hf_dir(tmp_path, "llama", 2)
    with pytest.raises(DepthlabError, match="bfloat16 arithmetic from float32 weights is not supported"):
        load_target(str(path), compute_dtype=torch.bfloat16)
    upcast = load_target(str(path), dtype=torch.bfloat16)  # the CPU default: each linear upcast to fp32
    plain = load_target(str(path), dtype=torch.bfloat16, compute_dtype=torch.bfloat16)  # bf16 arithmetic, as asked
    assert "compute_dtype" in upcast.info and "compute_dtype" not in plain.info
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = upcast.model(input_ids=ids).logits
        b = plain.model(input_ids=ids).logits
    assert a.dtype == torch.float32 and b.dtype == torch.bfloat16
    assert float((a - b.float()).abs().max()) > 0  # the two precisions really differ
