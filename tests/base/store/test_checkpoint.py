"""The checkpoint format (depthlab.base.store.checkpoint): a tied weight stored once and read under both names; the
metadata, config and state of a checkpoint readable without its tensors; the newest intact checkpoint chosen."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.store import checkpoint as C


def _save(run, step, scale=1.0):
    embed = torch.randn(5, 3, generator=torch.Generator().manual_seed(step)) * scale
    state = {"embed.weight": embed, "lm_head.weight": embed, "norm.weight": torch.ones(3)}  # lm_head tied to embed
    config = {"model": {"scheme": "lns", "n_layers": 1}, "train": {"steps": step}}
    return C.save_checkpoint(run, step, state, {"state": {}}, {"tokens": 10 * step}, config, keep_last=3), embed


def test_a_tied_weight_is_stored_once_and_read_under_both_names(tmp_path):
    ckpt, embed = _save(tmp_path, 1)
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["embed.weight", "norm.weight"]  # stored once
        meta = f.metadata()
    assert json.loads(meta["aliases"]) == {"lm_head.weight": "embed.weight"} and meta["scheme"] == "lns"
    weights = C.read_weights(ckpt)
    assert torch.equal(weights["lm_head.weight"], embed) and torch.equal(weights["embed.weight"], embed)


def test_a_checkpoint_opens_without_reading_its_tensors(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    _save(tmp_path, 2)

    def no_tensors(*a, **k):
        raise AssertionError("the tensors were read")

    monkeypatch.setattr("safetensors.torch.load_file", no_tensors)
    ckpt, data = C.load_intact(tmp_path, with_optimizer=False, with_model=False)
    assert ckpt.name == "step-00000002" and "model" not in data
    assert data["meta"]["scheme"] == "lns" and data["config"]["train"]["steps"] == 2 and data["state"]["tokens"] == 20
    with pytest.raises(DepthlabError, match="no intact checkpoint"):  # the default reads them: refused here
        C.load_intact(tmp_path, with_optimizer=False)


def test_the_newest_intact_checkpoint_is_chosen_and_a_damaged_one_named(tmp_path, caplog):
    _save(tmp_path, 1)
    newest, _ = _save(tmp_path, 2)
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the checksum tells
    (newest / "model.safetensors").write_bytes(bytes(data))
    assert C.damage(newest) == "model.safetensors does not match its checksum"
    ckpt, _ = C.load_intact(tmp_path, with_optimizer=False, with_model=False)
    assert ckpt.name == "step-00000001" and "step-00000002 is damaged" in caplog.text
    with pytest.raises(DepthlabError, match="is damaged: model.safetensors does not match its checksum"):
        C.load_intact(newest, with_optimizer=False)  # named directly: refused, never swapped for another


def test_a_damaged_checkpoint_is_warned_about_once_however_often_the_run_is_opened(tmp_path, caplog):
    """Issue 49, also seen: ``diagnose`` and ``prune`` of a damaged run warned twice about the same checkpoint (the
    plan opens the run for its metadata, the load for its weights)."""
    _save(tmp_path, 1)
    resized, _ = _save(tmp_path, 2)
    newest, _ = _save(tmp_path, 3)
    (resized / "model.safetensors").write_bytes(b"cut")  # resized: skipped as incomplete
    (newest / "model.safetensors").write_bytes(bytes((newest / "model.safetensors").stat().st_size))  # checksum
    for _ in range(3):
        assert C.load_intact(tmp_path, with_optimizer=False)[0].name == "step-00000001"
    assert caplog.text.count("step-00000003 is damaged") == 1
    assert caplog.text.count("skipping incomplete checkpoint") == 1
