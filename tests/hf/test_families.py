"""Every decoder family of the registry (depthlab.hf.families), each on its tiny random model built with
transformers' own ``AutoConfig.for_model`` + ``from_config`` and saved with ``save_pretrained`` (sharded):

- diagnose streamed equals diagnose in memory (angular distances, loss, removal Δloss, variance; max |Δ| <= 1e-4);
- prune --remove block 2, in memory (drop_layers + write_hf) and shard by shard (write_pruned_shards): plain
  ``AutoModelForCausalLM.from_pretrained`` loads it, its logits are the original's with block 2 skipped (a naive
  forward written here), cached ``generate`` equals uncached, and every per-layer config fact is cut;
- LayerNorm Scaling: the hooked model equals a naive one (each pre-norm wrapped by hand), and its fold equals both;
- DepthMonitor finds the blocks with no ``layers=``;
- blocks that read per-token values (Gemma 4's per-layer embeddings, DeepSeek-V4's hash routing) get them in the
  streamed engine: the equality above fails when they are replaced;
- a refused capability is one line naming why (OLMo 2 LNS; Gemma 4 streaming with KV sharing, and pruning the
  blocks whose keys and values later blocks reuse).
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import GEMMA4_KV, report_diff
from torch import nn

from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
from depthlab.analysis.monitor import DepthMonitor
from depthlab.base.errors import DepthlabError
from depthlab.hf import apply_layernorm_scaling, fold_layernorm_scaling
from depthlab.hf.families import FAMILIES, LAYER_LISTS, family_of, get_path
from depthlab.hf.tiny import save_tiny, tiny_model
from depthlab.prune.export import drop_layers, write_hf
from depthlab.prune.shards import write_pruned_shards
from depthlab.targets import find_layers, load_target

OPTS = dict(tokens=64, seq_len=16, batch_size=2, jacobian=False, joint_check=False, progress=False)
TOL = 1e-4
#: Families built alone (a text tower transformers builds only inside its wrapper is tested through the wrapper:
#: tests/hf/test_wrappers.py).
ALONE = {t: f for t, f in FAMILIES.items() if not f.wrapped}
STREAM = [t for t, f in ALONE.items() if f.why_not("stream") is None]
PRUNE = [t for t, f in ALONE.items() if f.why_not("prune") is None]
READ = [t for t, f in ALONE.items() if f.why_not("diagnose") is None]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


_MODELS: dict[str, tuple] = {}


def tiny(model_type: str, tmp_path_factory) -> tuple[nn.Module, object]:
    """The family's tiny model (norm weights jittered so a misplaced scale shows) and its saved directory, built once."""
    if model_type not in _MODELS:
        model = tiny_model(model_type)  # several shards below: the streamed export cuts each
        _MODELS[model_type] = (model, save_tiny(model, tmp_path_factory.mktemp(model_type), max_shard_size="40KB"))
    return _MODELS[model_type]


@pytest.mark.parametrize("model_type", STREAM)
def test_streamed_diagnose_equals_in_memory(model_type, tmp_path_factory):
    _, path = tiny(model_type, tmp_path_factory)
    streamed = diagnose(str(path), DiagnoseOptions(**OPTS, stream=True))
    assert streamed["engine"]["name"] == "streamed" and streamed["engine"]["layers_computed"] == 4
    in_memory = diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))
    assert in_memory["engine"]["name"] == "in-memory"
    assert report_diff(streamed, in_memory) <= TOL


@pytest.mark.parametrize("model_type", [t for t in STREAM if FAMILIES[t].token_args])
def test_streamed_blocks_get_their_own_per_token_inputs(model_type, tmp_path_factory, monkeypatch):
    """Each block's per-token arguments (Gemma 4: its slice of the per-layer embeddings; DeepSeek-V4: the ids its
    hash router reads) are the batch's own: handing every block block 1's, or another batch's, breaks the equality."""
    from depthlab.targets.stream.hf import HFLayerSource

    _, path = tiny(model_type, tmp_path_factory)
    in_memory = diagnose(load_target(str(path)), DiagnoseOptions(**OPTS))
    own = HFLayerSource.token_inputs
    monkeypatch.setattr(HFLayerSource, "token_inputs", lambda self, ids: [own(self, ids.roll(1, dims=1))[0]] * self.n_layers)
    assert report_diff(diagnose(str(path), DiagnoseOptions(**OPTS, stream=True)), in_memory) > 3 * TOL


def test_per_token_inputs_are_computed_again_after_a_resume(tmp_path_factory):
    """A sweep resumed after its embedding step has no kept per-token inputs: the layer call computes them again from
    the ids, the same as the embedding step kept, and block 2's output is the same."""
    from depthlab.targets.stream.open import open_streamed

    _, path = tiny("gemma4_text", tmp_path_factory)
    src = open_streamed(str(path)).source
    ids = IDS[:, :8]
    with src.embedding() as embed:
        h = embed(ids)
    kept = src.token_inputs(ids)[1]["per_layer_input"]
    call = src.layer_calls(8)[1]
    with src.layer(1) as layer:
        want = call(layer, h.repeat(2, 1, 1), ids)  # two streams of the batch stacked
    src._tokens.clear()
    with src.layer(1) as layer:
        got = call(layer, h.repeat(2, 1, 1), ids)
    torch.testing.assert_close(src.token_inputs(ids)[1]["per_layer_input"], kept, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got[:2], got[2:], rtol=0, atol=0)


class _Skip(nn.Module):
    """A removed block, written naively: it hands its input on (as a tuple when the block returns one)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, hidden_states, *args, **kwargs):
        out = self.block(hidden_states, *args, **kwargs)
        return (hidden_states, *out[1:]) if isinstance(out, tuple) else hidden_states


def _skipping(model: nn.Module, block: int) -> torch.Tensor:
    """Logits of ``model`` with block ``block`` (1-based) passing its input on, on the probe ids."""
    layers = get_path(model, family_of(model.config.model_type).layers)
    saved = layers[block - 1]
    layers[block - 1] = _Skip(saved)
    try:
        with torch.no_grad():
            return model(input_ids=IDS, use_cache=False).logits
    finally:
        layers[block - 1] = saved


IDS = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))


def _check_export(out, model: nn.Module, removed: int) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    cfg, ref = loaded.config, model.config
    assert cfg.num_hidden_layers == 3 and len(get_path(loaded, family_of(cfg.model_type).layers)) == 3
    for name in LAYER_LISTS:  # every per-layer list cut at the removed block
        values = getattr(ref, name, None)
        if isinstance(values, list) and len(values) == 4:
            assert getattr(cfg, name) == values[:removed - 1] + values[removed:], name
    with torch.no_grad():
        got = loaded(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, _skipping(model, removed), atol=2e-5, rtol=1e-4)
    prompt = IDS[:1, :6]
    kw = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(loaded.generate(prompt, use_cache=True, **kw), loaded.generate(prompt, use_cache=False, **kw))


@pytest.mark.parametrize("model_type", PRUNE)
def test_prune_exports_reload_with_transformers_and_match_the_removal(model_type, tmp_path_factory, tmp_path):
    model, path = tiny(model_type, tmp_path_factory)
    write_hf(drop_layers(model, [2]), tmp_path / "memory")
    _check_export(tmp_path / "memory", model, 2)
    written = write_pruned_shards(path, [2], tmp_path / "shards")
    assert len(written["files"]) > 1 and written["n_layers"] == 3
    _check_export(tmp_path / "shards", model, 2)


class _Scaled(nn.Module):
    def __init__(self, norm: nn.Module, scale: float) -> None:
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x):
        return self.norm(x) * self.scale


@pytest.mark.parametrize("model_type", READ)
def test_lns_equals_a_naive_scaling_of_the_pre_norms_and_folds(model_type, tmp_path_factory):
    import copy

    model, _ = tiny(model_type, tmp_path_factory)
    fam = FAMILIES[model_type]
    if fam.why_not("lns"):
        with pytest.raises(DepthlabError, match="no pre-norm"):
            apply_layernorm_scaling(copy.deepcopy(model))
        return
    naive = copy.deepcopy(model)
    for l, block in enumerate(get_path(naive, fam.layers), start=1):
        for name in fam.pre_norms:
            setattr(block, name, _Scaled(getattr(block, name), 1 / math.sqrt(l)))
    hooked = apply_layernorm_scaling(copy.deepcopy(model))
    with torch.no_grad():
        want = naive(input_ids=IDS, use_cache=False).logits
        got = hooked(input_ids=IDS, use_cache=False).logits
        folded = fold_layernorm_scaling(hooked)(input_ids=IDS, use_cache=False).logits
        plain = model(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(folded, want, atol=2e-5, rtol=1e-4)
    assert (plain - want).abs().max() > 1e-3  # the scaling changes the function


@pytest.mark.parametrize("model_type", [t for t in PRUNE if FAMILIES[t].why_not("lns") is None])
def test_an_lns_checkpoint_pruned_shard_by_shard_folds_each_kept_blocks_scale(model_type, tmp_path_factory, tmp_path):
    """The marker-carrying checkpoint cut file by file: each kept block's pre-norms (weight, bias; Gemma's 1 + w)
    carry its original depth's 1/sqrt(l); plain transformers then computes the LNS model with block 2 skipped."""
    import copy

    model, _ = tiny(model_type, tmp_path_factory)
    lns = apply_layernorm_scaling(copy.deepcopy(model))
    lns.save_pretrained(tmp_path / "lns")
    write_pruned_shards(tmp_path / "lns", [2], tmp_path / "pruned")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "pruned")).eval()
    assert getattr(loaded.config, "layernorm_scaling", None) is None
    with torch.no_grad():
        got = loaded(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, _skipping(lns, 2), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("model_type", "which"), [("qwen3_moe", {"remove": 1}), ("gpt2", {"remove": 1}),
                                                   ("deepseek_v4", {"remove": 1}), ("gemma4_text", {"blocks": [2]})])
def test_prune_target_streamed_gives_the_in_memory_choice(model_type, which, tmp_path_factory, tmp_path):
    """The whole streamed prune (survey, greedy sweeps, shard cut, check) on a MoE family, a tied GPT-2, DeepSeek-V4's
    streams and Gemma 4's per-layer embeddings (a given block: its greedy choice, the last block, cannot go)."""
    from depthlab.prune import PruneOptions, prune_target

    _, path = tiny(model_type, tmp_path_factory)
    opts = dict(method="removal", **which, data="builtin", tokens=64, seq_len=16, batch_size=2, progress=False,
                latency_tokens=2)
    streamed = prune_target(str(path), PruneOptions(**opts, stream=True), tmp_path / "s")
    in_memory = prune_target(load_target(str(path)), PruneOptions(**opts), tmp_path / "m")
    assert (streamed["engine"]["name"], in_memory["engine"]["name"]) == ("streamed", "in-memory")
    assert streamed["removed_blocks"] == in_memory["removed_blocks"]
    assert streamed["loss"]["pruned"] == pytest.approx(in_memory["loss"]["pruned"], abs=1e-5)
    assert streamed["export"]["generate_cache_matches_no_cache"] is True
    assert streamed["export"]["max_abs_logit_diff"] <= 1e-4
    assert streamed["cost"]["original"]["params"] == in_memory["cost"]["original"]["params"]


def test_a_multi_stream_state_is_measured_whole(tmp_path_factory):
    """DeepSeek-V4 passes (B, T, n, D) between blocks: the capture measures the whole (B, T, n·D) state, as depthlab's
    mhc scheme does (its streams travel as one (B, T, n·D) tensor), and its replay hands the blocks their own shape."""
    from depthlab.analysis.diagnostics.capture import ResidualCapture

    model, _ = tiny("deepseek_v4", tmp_path_factory)
    seen = []
    hook = get_path(model, "model.layers")[1].register_forward_pre_hook(
        lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).clone()) and None, with_kwargs=True)
    try:
        cap = ResidualCapture(model, find_layers(model), lambda ids: model(input_ids=ids, use_cache=False).logits)
        _, states = cap.run(IDS)
    finally:
        hook.remove()
    n, d = seen[0].shape[2:]
    assert n > 1 and states[1].shape == (*IDS.shape, n * d)
    torch.testing.assert_close(states[1], seen[0].flatten(2))
    torch.testing.assert_close(cap.run_skipping(IDS, states, {2}), _skipping(model, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", READ)
def test_monitor_finds_the_blocks_without_layers(model_type, tmp_path_factory):
    model, _ = tiny(model_type, tmp_path_factory)
    assert find_layers(model) is get_path(model, FAMILIES[model_type].layers)
    monitor = DepthMonitor(model, IDS, every=1, removal=False)
    assert monitor.n_layers == 4
    series = monitor.probe()
    assert len(series["layer_angular"]) == 4 and all(math.isfinite(v) for v in series["layer_angular"])


def test_refused_capabilities_say_why_in_one_line(tmp_path_factory):
    with pytest.raises(DepthlabError, match="not a family it knows; supported: llama, mistral"):
        family_of("bert", "prune")
    with pytest.raises(DepthlabError, match="no pre-norm"):
        family_of("olmo2", "lns")


def test_gemma4_pruned_keeps_each_blocks_per_layer_embeddings_and_config(tmp_path_factory, tmp_path):
    """Block 2 of 4 removed: the per-layer embedding table and projection keep the other blocks' slices (in their
    order), the full-attention block's per-layer head_dim moves with it, in memory and shard by shard."""
    from transformers import AutoModelForCausalLM

    model, path = tiny("gemma4_text", tmp_path_factory)
    P, keep = model.config.hidden_size_per_layer_input, [0, 2, 3]
    cols = torch.tensor([i * P + k for i in keep for k in range(P)])
    write_hf(drop_layers(model, [2]), tmp_path / "memory")
    write_pruned_shards(path, [2], tmp_path / "shards")
    for out in ("memory", "shards"):
        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / out))
        torch.testing.assert_close(loaded.model.embed_tokens_per_layer.weight,
                                   model.model.embed_tokens_per_layer.weight[:, cols], rtol=0, atol=0)
        torch.testing.assert_close(loaded.model.per_layer_model_projection.weight,
                                   model.model.per_layer_model_projection.weight[cols], rtol=0, atol=0)
        heads = [loaded.config.per_layer_config[i].head_dim for i in range(3)]
        assert heads == [model.config.per_layer_config[i].head_dim for i in keep] and heads[-1] != heads[0]


def _kv_shared(tmp_path):
    """Gemma 4 whose blocks 3 and 4 reuse the keys and values of blocks 1 (sliding) and 2 (full attention)."""
    model = tiny_model("gemma4_text", **GEMMA4_KV)
    return model, save_tiny(model, tmp_path / "kv")


def test_gemma4_kv_sharing_refuses_what_it_cannot_express_and_prunes_the_rest(tmp_path):
    model, path = _kv_shared(tmp_path)
    with pytest.raises(DepthlabError, match=r"blocks 3\.\.4 reuse the keys and values") as err:
        load_target(str(path), stream=True)
    assert "\n" not in str(err.value)
    for removed, named in (([1], r"blocks \[1\] cannot go"), ([2, 3], r"blocks \[2\] cannot go")):
        with pytest.raises(DepthlabError, match=named):
            drop_layers(model, removed)
        with pytest.raises(DepthlabError, match=named):
            write_pruned_shards(path, removed, tmp_path / "refused")
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    write_hf(drop_layers(model, [3]), tmp_path / "memory")  # a block that reuses: it can go
    _check_export(tmp_path / "memory", model, 3)
    write_pruned_shards(path, [3], tmp_path / "shards")
    _check_export(tmp_path / "shards", model, 3)


def test_gemma4_last_block_must_stay_full_attention(tmp_path_factory, tmp_path, monkeypatch):
    """Refused in one line naming the blocks, by the surgery and by prune_target before any pass over data."""
    from depthlab.prune import PruneOptions, pipeline, prune_target
    from depthlab.prune import streamed as streamed_prune

    model, path = tiny("gemma4_text", tmp_path_factory)
    refusal = r"blocks \[4\] cannot all go: block 3 \(sliding_attention\) would become the last"
    with pytest.raises(DepthlabError, match=refusal):
        drop_layers(model, [4])
    for module in (pipeline, streamed_prune):
        monkeypatch.setattr(module, "held_out_batches", lambda *a: pytest.fail("data read before the refusal"))
    for stream in (False, True):
        opts = PruneOptions(blocks=[4], data="builtin", tokens=64, seq_len=16, batch_size=2, progress=False, stream=stream)
        with pytest.raises(DepthlabError, match=refusal):
            prune_target(str(path), opts, tmp_path / f"out-{stream}")
        assert not (tmp_path / f"out-{stream}").exists()


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap over the experts: no batching rule, a loop
def test_deepseek_v4_block_jacobian_is_the_whole_multi_stream_states(tmp_path_factory):
    """The in-memory Jacobian path on DeepSeek-V4: block 2's Jacobian is that of its whole (n·D) state at token t, equal
    to autograd's on the block called here as the model calls it (a pre-hook records its arguments: the hash router's
    ids, masks, rotary tables), with the (n, D) state unflattened by hand; and diagnose --jacobian reports it."""
    from depthlab.analysis.diagnostics.capture import ResidualCapture
    from depthlab.analysis.diagnostics.jacobian import block_jacobians

    model, path = tiny("deepseek_v4", tmp_path_factory)
    ids, t, l = IDS[:1, :7], 6, 2
    block = get_path(model, "model.layers")[l - 1]
    seen = {}
    hook = block.register_forward_pre_hook(lambda m, a, k: seen.update(a=a, k=k) and None, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    h0 = seen["a"][0] if seen["a"] else seen["k"]["hidden_states"]
    kwargs = {k: v for k, v in seen["k"].items() if k != "hidden_states"}
    n, d = h0.shape[2:]

    def f(v):
        h = h0.clone()
        h[0, t] = v.view(n, d)
        return block(h, *seen["a"][1:], **kwargs)[0, t].flatten()

    ref = torch.autograd.functional.jacobian(f, h0[0, t].flatten())
    cap = ResidualCapture(model, find_layers(model), lambda x: model(input_ids=x, use_cache=False).logits)
    out = block_jacobians(cap, [ids[0]], [t], layers=[l], keep=[l])
    assert ref.shape == (n * d, n * d)
    torch.testing.assert_close(out["matrices"][l], ref, rtol=1e-4, atol=1e-5)
    report = diagnose(load_target(str(path)), DiagnoseOptions(**{**OPTS, "jacobian": True}))
    assert [math.isfinite(b["rel_dist_identity"]) for b in report["jacobian"]["per_layer"]] == [True] * 4
