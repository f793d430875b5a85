"""Pruned checkpoints load in plain transformers with the logits of the model with those blocks skipped."""

import copy

import pytest
import torch
from tiny_models import tiny_hf

import depthlab as d
from depthlab.analysis.diagnostics import ResidualCapture, find_layers
from depthlab.prune import drop_layers, prune_model, verify_export, write_hf
from depthlab.prune.export import hf_model_of, lm_logits


def _skipped(model, ids, removed):
    """Logits of ``model`` with ``removed`` blocks skipped (the diagnostics' replay, no surgery)."""
    return ResidualCapture(model, find_layers(model), lambda x: lm_logits(model, x)).run_without(ids, set(removed))


def _transformers_deleted(hf, removed):
    """transformers' own model with those layers deleted (no renumbering: used without a cache)."""
    cut = copy.deepcopy(hf)
    for l in sorted(removed, reverse=True):
        del cut.model.layers[l - 1]
    cut.config.num_hidden_layers -= len(removed)
    return cut


@pytest.mark.parametrize("kind, tie", [("llama", False), ("qwen2", True), ("llama", True)])
def test_export_equals_skipping_and_transformers_deletion(tmp_path, kind, tie):
    from transformers import AutoModelForCausalLM

    hf = tiny_hf(kind, 6, tie_word_embeddings=tie)
    removed = [2, 5]
    pruned = drop_layers(hf, removed)
    assert len(find_layers(hf)) == 6  # the original is untouched
    write_hf(pruned, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert loaded.config.num_hidden_layers == 4 and type(loaded).__name__ == type(hf).__name__
    assert [layer.self_attn.layer_idx for layer in loaded.model.layers] == [0, 1, 2, 3]
    if tie:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 300, (2, 24))
    with torch.no_grad():
        got = loaded(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(got, _skipped(hf, ids, removed), rtol=1e-5, atol=1e-5)
        ref = _transformers_deleted(hf, removed)(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(loaded.generate(ids[:1, :5], use_cache=True, **kw),
                           loaded.generate(ids[:1, :5], use_cache=False, **kw))
    check = verify_export(tmp_path / "out", pruned, ids)
    assert check["max_abs_logit_diff"] < 1e-5 and check["generate_cache_matches_no_cache"]


def test_per_layer_config_lists_are_sliced(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=3)
    hf = Qwen2ForCausalLM(cfg).eval()
    assert hf.config.layer_types == ["full_attention"] * 3 + ["sliding_attention"] * 3
    pruned = drop_layers(hf, [1, 6])
    assert pruned.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert pruned.config.max_window_layers == 2
    write_hf(pruned, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 300, (1, 12))  # longer than the window: the sliding layers matter
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, _skipped(hf, ids, [1, 6]), rtol=1e-5, atol=1e-5)


def _lns_model():
    torch.manual_seed(0)
    model = d.build_model(d.from_preset("tiny", scheme="lns", n_layers=6, d_model=32, n_heads=4, n_kv_heads=2,
                                        d_ff=64, vocab_size=300)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def test_lns_depthlab_model_keeps_each_blocks_original_scale(tmp_path):
    from transformers import AutoModelForCausalLM

    model = _lns_model()
    removed = [2, 3]
    pruned = prune_model(model, removed)
    assert pruned.cfg.block_depths == [1, 4, 5, 6] and prune_model(pruned, [2]).cfg.block_depths == [1, 5, 6]
    write_hf(hf_model_of(pruned), tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    kept = [1, 4, 5, 6]
    for layer, l in zip(loaded.model.layers, kept):  # folded at the ORIGINAL depth l, not the new position
        torch.testing.assert_close(layer.input_layernorm.weight, model.blocks[l - 1].attn_norm.weight / l**0.5)
        torch.testing.assert_close(layer.post_attention_layernorm.weight, model.blocks[l - 1].ffn_norm.weight / l**0.5)
    ids = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        want = _skipped(model, ids, removed)
        torch.testing.assert_close(lm_logits(pruned, ids), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_hf_model_with_lns_hooks_is_folded_at_original_depths(tmp_path):
    from depthlab.hf import apply_layernorm_scaling

    hf = apply_layernorm_scaling(tiny_hf("llama", 6))
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        want = _skipped(hf, ids, [1, 4])
    pruned = drop_layers(hf, [1, 4])
    write_hf(pruned, tmp_path)
    check = verify_export(tmp_path, pruned, ids)
    assert check["max_abs_logit_diff"] < 1e-5
    with torch.no_grad():
        torch.testing.assert_close(lm_logits(pruned, ids), want, rtol=1e-5, atol=1e-5)
