"""prune --unit attn|mlp --stream: the in-memory engine's choice (the same units, the same losses) measured by sweeps,
and a checkpoint written shard by shard that plain transformers loads with the in-memory unit-pruned export's logits."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import family_dir, hf_dir

from depthlab.cli import main
from depthlab.prune import PruneOptions, prune_target
from depthlab.targets import load_target
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2)
FAST = ["--tokens", "96", "--seq-len", "32", "--batch-size", "2", "--no-progress"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _logits(path, ids):
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(str(path)).eval()(input_ids=ids).logits


# kind, unit, selection, tolerance on losses (MoE routing sums in another order)
CASES = [("llama", "attn", {"method": "removal", "remove": 2}, 1e-5),
         ("qwen2-tied", "mlp", {"method": "angular-block", "budget": 0.05}, 1e-5),
         ("llama-lns", "mlp", {"method": "influence", "remove": 2}, 1e-5),
         ("qwen3_moe", "attn", {"method": "removal", "remove": 1}, 1e-4)]


@pytest.mark.parametrize("kind, unit, sel, tol", CASES, ids=[c[0] for c in CASES])
def test_streamed_unit_prune_equals_in_memory(tmp_path, kind, unit, sel, tol):
    path = family_dir(tmp_path, kind) if kind == "qwen3_moe" else hf_dir(tmp_path, kind, 5, max_shard_size="40KB")
    opts = PruneOptions(unit=unit, **sel, **OPTS)
    mem = prune_target(load_target(str(path)), opts, tmp_path / "mem")
    streamed = prune_target(open_streamed(str(path)), opts, tmp_path / "streamed")
    assert streamed["engine"]["name"] == "streamed"
    assert streamed["unit"] == unit and streamed["removed_blocks"] == mem["removed_blocks"]
    assert streamed["method"] == mem["method"]
    for stage in ("original", "pruned"):
        assert streamed["loss"][stage] == pytest.approx(mem["loss"][stage], abs=tol)
    for key in ("contribution", "angular"):
        assert streamed["survey"][unit][key] == pytest.approx(mem["survey"][unit][key], abs=tol)
    if sel["method"] == "removal":  # every greedy step's candidate losses
        for a, b in zip(streamed["selection"]["greedy_path"], mem["selection"]["greedy_path"], strict=True):
            assert a["block"] == b["block"] and a["candidates"] == pytest.approx(b["candidates"], abs=tol)
    if "budget_evaluated" in mem["selection"]:
        assert streamed["selection"]["budget_evaluated"] == pytest.approx(mem["selection"]["budget_evaluated"], abs=tol)
    # the export: same depth, several shards, plain transformers gives the in-memory export's logits
    out = tmp_path / "streamed"
    assert len(streamed["export"]["written"]["files"]) > 1 and (out / "model.safetensors.index.json").is_file()
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == mem["n_units"]["original"]
    ids = torch.randint(0, 200, (2, 20), generator=torch.Generator().manual_seed(1))
    diff = float((_logits(out, ids) - _logits(tmp_path / "mem", ids)).abs().max())
    assert diff <= tol, diff
    assert streamed["export"]["max_abs_logit_diff_zeroed_vs_hooked"] <= tol  # the files vs the branches zeroed
    assert streamed["export"]["loaded_with"].startswith("transformers") and streamed["export"]["max_abs_logit_diff"] <= tol
    assert streamed["export"]["generate_cache_matches_no_cache"] is True
    assert (out / "report.html").is_file() and not (tmp_path / ".streamed.stream-state").exists()


def test_only_the_removed_projections_change(tmp_path):
    """The written tensors: the removed blocks' o_proj zero, every other tensor the source's bytes."""
    from safetensors.torch import load_file

    path = hf_dir(tmp_path, "qwen2-tied", 4)  # q/k/v biases; o_proj has none
    rep = prune_target(open_streamed(str(path)), PruneOptions(unit="attn", blocks=[2, 4], **OPTS), tmp_path / "o")
    assert rep["removed_blocks"] == [2, 4]
    src, got = load_file(path / "model.safetensors"), load_file(tmp_path / "o" / "model.safetensors")
    assert set(src) == set(got)
    zero = {f"model.layers.{b}.self_attn.o_proj.weight" for b in (1, 3)}
    for k, t in got.items():
        assert torch.equal(t, torch.zeros_like(t) if k in zero else src[k]), k


def test_streamed_unit_refusals_are_one_line_before_any_work(tmp_path, capsys):
    llama, moe = hf_dir(tmp_path, "llama", 4), family_dir(tmp_path, "qwen3_moe")
    cases = [([str(llama), "--unit", "attn", "--remove", "1", "--heal-steps", "2", "--heal", "lora"], "--heal"),
             ([str(llama), "--unit", "mlp", "--remove", "1", "--generate", "builtin-arith"], "--generate"),
             ([str(moe), "--unit", "mlp", "--remove", "1"], "mlp output projection")]
    for args, word in cases:
        out = tmp_path / "o"
        code = main(["prune", *args, "--stream", "--out", str(out), *FAST])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and word in err, err
        assert not out.exists() and not (tmp_path / ".o.stream-state").exists()


def test_cli_streamed_unit_prune(tmp_path, capsys):
    path = hf_dir(tmp_path, "llama", 4)
    out = tmp_path / "o"
    assert main(["prune", str(path), "--unit", "mlp", "--remove", "1", "--method", "angular-block", "--stream",
                 "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["unit"] == "mlp" and len(rep["removed_blocks"]) == 1 and rep["engine"]["name"] == "streamed"
    assert rep["latency"] is None and rep["heal"] is None and "not measured" in rep["summary"]
