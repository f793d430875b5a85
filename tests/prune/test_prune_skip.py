"""``prune --unit attn|mlp`` exports carry ``per_layer_config`` ``skip`` entries where the family's config accepts them:
they round-trip through ``save_pretrained``, plain transformers loads the export with the logits (and cached generate)
of the same checkpoint without them, and a config that refuses them keeps today's export and says why."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import hf_dir

from depthlab.prune import PruneOptions, prune_target
from depthlab.prune.skip import SKIP_NAMES, skip_entries
from depthlab.targets import load_target
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _without_entries(src, dst):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["per_layer_config"]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("kind, unit, blocks, engine", [("llama", "attn", [2, 4], "memory"),
                                                        ("qwen2-tied", "mlp", [1, 3], "streamed"),
                                                        ("qwen3_moe", "attn", [3], "memory")])
def test_unit_export_carries_skip_entries_that_round_trip_and_change_no_logit(tmp_path, kind, unit, blocks, engine):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = hf_dir(tmp_path, kind, 4)
    target = load_target(str(path)) if engine == "memory" else open_streamed(str(path))
    rep = prune_target(target, PruneOptions(unit=unit, blocks=blocks, **OPTS), tmp_path / "out")
    out = tmp_path / "out"
    saved = json.loads((out / "config.json").read_text())["per_layer_config"]
    want = {str(b - 1): {"skip": [SKIP_NAMES[unit]]} for b in blocks}
    assert {str(int(k)): v for k, v in saved.items()} == want == skip_entries(unit, blocks)
    assert rep["export"]["per_layer_config"]["written"] is True
    cfg = AutoConfig.from_pretrained(str(out))
    assert [cfg.per_layer_config[i].skip for i in range(4)] == [[SKIP_NAMES[unit]] if i + 1 in blocks else []
                                                                for i in range(4)]
    cfg.save_pretrained(str(tmp_path / "again"))
    again = json.loads((tmp_path / "again" / "config.json").read_text())["per_layer_config"]
    assert {str(int(k)): v for k, v in again.items()} == want
    plain = _without_entries(out, tmp_path / "plain")
    a, b = (AutoModelForCausalLM.from_pretrained(str(p)).eval() for p in (out, plain))
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        torch.testing.assert_close(a(input_ids=ids).logits, b(input_ids=ids).logits, rtol=0, atol=0)
        assert torch.equal(a.generate(ids[:1, :6], use_cache=True, **kw), b.generate(ids[:1, :6], use_cache=True, **kw))
    assert rep["export"]["max_abs_logit_diff"] < 1e-5 and rep["export"]["generate_cache_matches_no_cache"]


def test_a_config_that_refuses_the_entries_keeps_the_export_and_says_why(tmp_path, monkeypatch):
    from depthlab.prune.skip import round_trip

    path = hf_dir(tmp_path, "llama", 3)
    config = json.loads((path / "config.json").read_text())
    why = round_trip({**config, "per_layer_config": skip_entries("attn", [9])}, tmp_path)  # layer 9 of 3: refused
    assert why is not None and why.startswith("ValueError") and "per_layer_config" in why
    monkeypatch.setattr("depthlab.prune.skip.round_trip", lambda *_a: why)
    rep = prune_target(load_target(str(path)), PruneOptions(unit="mlp", blocks=[2], **OPTS), tmp_path / "out")
    assert rep["export"]["per_layer_config"] == {"written": False, "why": why}
    assert "per_layer_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert not list(tmp_path.glob("**/.skip-probe"))
