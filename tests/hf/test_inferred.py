"""Decoders outside the family table: their layout read from the model itself (depthlab.hf.inferred).

- the layout read from every table family's own model is the row's (blocks, final norm, index lists): the inference
  is checked against an independent source, the hand-written table; and a row overrides what is inferred;
- the generic path on StableLM (not a row): diagnose streamed equals in memory; prune in both engines writes an export
  that plain transformers reloads with logits equal to the original's with the block skipped and cached generate equal
  to uncached; the report and the export's record say "layout inferred";
- a deterministic sample of transformers' own causal-LM families that are not rows (the list built from transformers,
  not by hand): each either streams equal to in memory and prunes exactly, or is refused in one line with nothing
  written (the full sweep: benchmarks/families_inferred.py);
- the checks that make inference safe: a family whose layer-by-layer forward differs from its own (BLOOM's ALiBi)
  is refused before streaming; a pruned export whose logits differ from skipping in the original is refused, nothing
  written;
- refusals from config.json alone, before any weight is read: the weights file is a large placeholder that any read
  would trip on.
"""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from tiny_models import report_diff

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.base.errors import DepthlabError
from depthlab.hf import inferred
from depthlab.hf.families import FAMILIES, INFERRED, family_of, family_of_model, get_path, known_family
from depthlab.hf.tiny import save_tiny, tiny_config, tiny_model
from depthlab.prune import PruneOptions, prune_target
from depthlab.targets import load_target

OPTS = dict(tokens=64, seq_len=16, batch_size=2, jacobian=False, joint_check=False, progress=False)
PRUNE = dict(method="removal", remove=1, data="builtin", tokens=64, seq_len=16, batch_size=2, progress=False,
             latency_tokens=2)
IDS = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def candidates() -> list[str]:
    """transformers' causal-LM model types whose config is not a row of the table (GPT-SW3's is GPT-2's)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if CONFIG_MAPPING[t].model_type not in FAMILIES)


@pytest.mark.parametrize("model_type", [t for t, f in FAMILIES.items() if not f.wrapped])  # wrapped: no causal LM alone
def test_the_layout_read_from_a_table_familys_model_is_its_row(model_type):
    row = FAMILIES[model_type]
    config = tiny_config(model_type)
    fields = inferred.layout(inferred.meta_model(config))
    assert "blocks" in fields, fields["refused"]
    base = fields["base"]
    full = [".".join(p for p in (base, fields[k]) if p) for k in ("blocks", "norm")]
    assert full == [row.layers, row.final_norm]
    assert set(fields["index_lists"]) == set(row.index_lists)
    assert known_family(config) is row  # the row overrides what is inferred


def _skipping(model, layers_path: str, block: int) -> torch.Tensor:
    """The original's logits with block ``block`` (1-based) handing its input on."""
    layers = get_path(model, layers_path)
    handle = layers[block - 1].register_forward_hook(
        lambda m, a, k, out: type(out)((a[0] if a else k["hidden_states"], *out[1:]))
        if isinstance(out, (tuple, list)) else (a[0] if a else k["hidden_states"]), with_kwargs=True)  # GPT-1: a list
    try:
        with torch.no_grad():
            return model(input_ids=IDS, use_cache=False).logits
    finally:
        handle.remove()


def _reloads_exactly(out, ref: torch.Tensor) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS, use_cache=False).logits, ref, atol=1e-4, rtol=1e-4)
    kw = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    prompt = IDS[:1, :6]
    assert torch.equal(loaded.generate(prompt, use_cache=True, **kw), loaded.generate(prompt, use_cache=False, **kw))
    assert json.loads((out / "config.json").read_text())["depthlab"]["layout"] == INFERRED


def test_a_decoder_outside_the_table_streams_and_prunes_through_its_inferred_layout(tmp_path):
    model = tiny_model("stablelm")
    assert "stablelm" not in FAMILIES and family_of_model(model).inferred
    path = save_tiny(model, tmp_path / "model", max_shard_size="40KB")
    streamed = diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))
    in_memory = diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))
    assert (streamed["engine"]["name"], in_memory["engine"]["name"]) == ("streamed", "in-memory")
    assert report_diff(streamed, in_memory) <= 1e-4
    assert streamed["model"]["layout"] == in_memory["model"]["layout"] == f"stablelm ({INFERRED})"
    runs = {stream: prune_target(str(path), PruneOptions(**PRUNE, stream=stream), tmp_path / f"out-{stream}")
            for stream in (True, False)}
    assert runs[True]["removed_blocks"] == runs[False]["removed_blocks"]
    (removed,) = runs[True]["removed_blocks"]
    ref = _skipping(model, family_of_model(model).layers, removed)
    for stream in (True, False):
        _reloads_exactly(tmp_path / f"out-{stream}", ref)


def sample(k: int = 3) -> list[str]:
    """``k`` candidates in a seeded random order whose tiny config transformers builds (a config whose own defaults do
    not build is nothing of depthlab's: the sweep records those)."""
    order = candidates()
    random.Random(45).shuffle(order)
    out = []
    for model_type in order:
        try:
            tiny_config(model_type)
        except Exception:  # noqa: BLE001, S112 - any failure of transformers' config: not drawn
            continue
        out.append(model_type)
        if len(out) == k:
            return out
    return out


def test_the_committed_sweep_is_of_transformers_own_list_and_reports_the_count(capsys):
    """The sweep's committed result (benchmarks/families_inferred.py) is of the list transformers itself gives, every
    candidate (not hand-picked), with no wrong result: each family passes or is refused in one line. The count is
    reported (pytest -s shows it); with another transformers the list differs and the sweep is to be run again."""
    from pathlib import Path

    import transformers

    record = json.loads((Path(__file__).parents[2] / "benchmarks/results/families_inferred_cpu.json").read_text())
    if record["versions"]["transformers"] != transformers.__version__:
        pytest.skip(f"the sweep ran on transformers {record['versions']['transformers']}, not {transformers.__version__}")
    assert sorted(record["families"]) == candidates()
    outcomes = {t: r["outcome"] for t, r in record["families"].items()}
    assert "fail" not in outcomes.values() and "no fixture" not in outcomes.values()
    assert all("\n" not in r.get("line", "") for r in record["families"].values())
    passed = sum(o == "pass" for o in outcomes.values())
    assert passed == record["counts"]["pass"] == len(record["passed"])
    assert passed >= 0.8 * record["decoders_built"]  # the bar for the generic path
    with capsys.disabled():
        print(f"\nlayout inferred: {passed} of {record['decoders_built']} decoder families transformers "
              f"{transformers.__version__} builds pass ({passed / record['decoders_built']:.0%}); the rest refused")


@pytest.mark.parametrize("model_type", sample())
def test_a_sample_of_transformers_families_streams_and_prunes_exactly_or_is_refused_in_one_line(model_type, tmp_path):
    """Three families drawn (seeded) from transformers' own list: whatever happens is right or one line."""
    model = tiny_model(model_type).float()
    path = save_tiny(model, tmp_path / "model", max_shard_size="40KB")
    try:
        streamed = diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))
        assert report_diff(streamed, diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))) <= 1e-4
        report = prune_target(str(path), PruneOptions(**PRUNE, stream=True), tmp_path / "out")
    except DepthlabError as err:
        assert "\n" not in str(err).strip() and not (tmp_path / "out").exists()
        return
    (removed,) = report["removed_blocks"]
    _reloads_exactly(tmp_path / "out", _skipping(model, family_of_model(model).layers, removed))


def test_a_family_whose_layer_by_layer_forward_differs_is_refused_before_streaming(tmp_path):
    """Inkling 2 mixes every block's output into the stream after the last block (a state the block list does not
    carry): the streamed engine cannot replay it, and the check on a small model of the family says so before any
    weight of the checkpoint is read."""
    path = save_tiny("inkling2_text", tmp_path / "inkling2")
    with pytest.raises(DepthlabError, match=r"cannot stream inkling2_text \(layout inferred\).*small model of its "
                                            "family does not reproduce"):
        diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))


def test_arguments_recorded_per_row_are_repeated_for_every_row(tmp_path):
    """BLOOM's ALiBi bias (rows x heads) and XGLM's mask (passed by position) are built for the rows of the batch the
    calls were recorded on: recorded for one row and for two, they are found to grow with the rows and repeated, so
    both stream equal to in memory."""
    for model_type in ("bloom", "xglm"):
        path = save_tiny(model_type, tmp_path / model_type)
        streamed = diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))
        assert report_diff(streamed, diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))) <= 1e-4


def test_a_pruned_export_that_differs_from_skipping_is_refused_and_nothing_written(tmp_path):
    """DiffLlama's attention mixes by a per-layer lambda fixed by its index: the block renumbered computes otherwise;
    the export's check against the original with the block skipped refuses it in both engines."""
    path = save_tiny("diffllama", tmp_path / "model", max_shard_size="40KB")
    for stream in (True, False):
        with pytest.raises(DepthlabError, match=r"cannot prune diffllama \(layout inferred\).*nothing written"):
            prune_target(str(path), PruneOptions(**PRUNE, stream=stream), tmp_path / f"out-{stream}")
        assert not (tmp_path / f"out-{stream}").exists()


@pytest.mark.parametrize(("model_type", "overrides", "why"), [
    ("bert", {}, "an encoder"), ("internvl", {}, "an image-text model .* not a wrapper it knows"),
    ("t5", {}, "an encoder-decoder")])
def test_refusals_come_from_config_json_before_any_weight_is_read(model_type, overrides, why, tmp_path):
    from transformers import AutoConfig

    path = tmp_path / model_type
    AutoConfig.for_model(model_type, **overrides).save_pretrained(path)
    with open(path / "model.safetensors", "wb") as f:  # a 1 GiB placeholder: any read of it fails on its header
        f.truncate(1 << 30)
    for stream in (True, False):
        with pytest.raises(DepthlabError, match=f"cannot (prune |read model type ')?{model_type}.*{why}") as err:
            prune_target(str(path), PruneOptions(**PRUNE, stream=stream), tmp_path / "out")
        assert "\n" not in str(err.value).strip() and not (tmp_path / "out").exists()
    with pytest.raises(DepthlabError, match=f"cannot (stream|read).*{why}"):
        diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))
    assert family_of(json.loads((path / "config.json").read_text()), None).inferred


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gemma2", "qwen3_next", "olmo2", "gemma4_text"])
def test_the_pre_norms_probed_on_a_table_family_are_its_rows_or_refused(model_type):
    """The probe (on a small model of the family) against the hand-written rows: Llama's two pre-norms, GPT-2's ln_1 /
    ln_2, Gemma 2's sandwich (the post-norms sit on the branch outputs) with (1 + weight), Qwen3-Next's hybrid blocks,
    OLMo 2 without pre-norms; Gemma 4 (its per-layer input added to the stream inside the block) refused rather than
    guessed."""
    row = FAMILIES[model_type]
    got = inferred.probe_pre_norms(tiny_config(model_type))
    if model_type == "gemma4_text" or row.why_not("lns"):
        assert isinstance(got, str) and "\n" not in got
    else:
        assert got == (row.pre_norms, row.norm_offset)


class _Scaled(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x):
        return self.norm(x) * self.scale


@pytest.mark.parametrize(("model_type", "pre_norms"), [("stablelm", ("input_layernorm", "post_attention_layernorm")),
                                                       ("cohere", ("input_layernorm",))])
def test_lns_on_an_inferred_layout_equals_a_naive_scaling_and_folds(model_type, pre_norms):
    """StableLM's two pre-norms; Cohere's parallel block reads one norm for both branches."""
    import copy
    import math

    from depthlab.hf import apply_layernorm_scaling, fold_layernorm_scaling

    model = tiny_model(model_type).float()
    fam = family_of_model(model, "lns")
    assert fam.inferred and fam.pre_norms == pre_norms and fam.norm_offset == 0.0
    naive = copy.deepcopy(model)
    for l, block in enumerate(get_path(naive, fam.layers), start=1):
        for name in pre_norms:
            setattr(block, name, _Scaled(getattr(block, name), 1 / math.sqrt(l)))
    hooked = apply_layernorm_scaling(copy.deepcopy(model))
    with torch.no_grad():
        want = naive(input_ids=IDS, use_cache=False).logits
        got = hooked(input_ids=IDS, use_cache=False).logits
        folded = fold_layernorm_scaling(hooked)(input_ids=IDS, use_cache=False).logits
        plain = model(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(folded, want, atol=2e-5, rtol=1e-4)
    assert (plain - want).abs().max() > 1e-3


def test_the_monitor_finds_an_inferred_layouts_blocks():
    from depthlab.analysis.monitor import DepthMonitor
    from depthlab.targets import find_layers

    model = tiny_model("opt")  # its blocks at model.decoder.layers, its final norm registered before them
    assert find_layers(model) is get_path(model, family_of_model(model).layers) is model.model.decoder.layers
    series = DepthMonitor(model, IDS, every=1, removal=False).probe()
    assert len(series["layer_angular"]) == model.config.num_hidden_layers


@pytest.mark.parametrize(("argv", "why"), [
    (["diagnose", "{m}", "--no-stream"], "cannot find the layer list of XLMWithLMHeadModel"),
    (["evaluate", "{m}", "--tasks", "builtin-mc", "--out", "{o}"], "cannot find the layer list of XLMWithLMHeadModel"),
    (["prune", "{m}", "--remove", "1", "--out", "{o}"], "cannot prune xlm .*ModuleLists"),
    (["finetune", "{m}", "--data", "builtin-sft", "--out", "{o}"], "xlm"),
    (["export", "{m}", "--hf", "{o}"], "{m}"),
])
def test_every_command_refuses_a_model_it_cannot_read_before_any_weight_is_read(argv, why, tmp_path, capsys):
    """XLM (four ModuleLists of its depth, no block list to tell): diagnose in memory, evaluate, prune, finetune and
    export each refuse it in one line, exit 2, from config.json and the class built on the meta device alone; the
    weights file is a 1 GiB placeholder that any read would trip on (its header is zeros)."""
    from transformers import AutoConfig

    from depthlab.cli import main

    path = tmp_path / "xlm"
    AutoConfig.for_model("xlm", n_layers=2, emb_dim=32, n_heads=2, vocab_size=300).save_pretrained(path)
    with open(path / "model.safetensors", "wb") as f:
        f.truncate(1 << 30)
    out = tmp_path / "out"
    code = main([a.format(m=path, o=out) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(why.format(m=path), err), err
    assert "safetensors" not in err.lower() and "header" not in err.lower()  # nothing read the weights file
    assert not out.exists()
