"""Healing within memory: the stored checkpoint loaded into place (no second copy) and written back, the LM-head
loss in chunks, LoRA over frozen bf16 weights, the streamed engine's heal of the kept blocks, no model copies."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_models import hf_dir

from depthlab.data.tokenizers import model_tokenizer
from depthlab.models.decoder import IGNORE_INDEX
from depthlab.prune import HealOptions, PruneOptions, prune_target
from depthlab.prune.heal import chunked_lm_loss, heal
from depthlab.prune.heal_stored import load_stored, write_stored
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2)
HEAL = dict(steps=3, mode="lora", lr=1e-2, batch_size=2, seq_len=32, lora_rank=2, progress=False)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _from_pretrained(path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **kw).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2-tied"])
def test_load_stored_equals_transformers_loading(tmp_path, kind):
    path = hf_dir(tmp_path, kind, 3, dtype=torch.bfloat16, max_shard_size="20KB")
    got, ref = load_stored(path), _from_pretrained(path, dtype=torch.bfloat16)
    assert next(got.parameters()).dtype == torch.bfloat16  # the stored dtype, no upcast
    ref_state = ref.state_dict()
    for name, t in got.state_dict().items():
        assert torch.equal(t, ref_state[name]), name
    if ref.config.tie_word_embeddings:
        assert got.get_output_embeddings().weight is got.get_input_embeddings().weight
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(got(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_write_stored_writes_the_models_tensors_under_the_same_header(tmp_path):
    path = hf_dir(tmp_path, "qwen2-tied", 2, max_shard_size="20KB")
    model = load_stored(path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.5 if "q_proj" in name else 0.0)
    write_stored(model, path)
    back = _from_pretrained(path)
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name


def test_chunked_lm_loss_equals_the_whole_cross_entropy_and_its_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(2, 7, 8, requires_grad=True)
    y = torch.randint(0, 11, (2, 7))
    y[0, :2] = IGNORE_INDEX
    ref = F.cross_entropy(head(hidden).flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
    g_ref = torch.autograd.grad(ref, [hidden, head.weight])
    got = chunked_lm_loss(hidden, head, y, rows=3)
    g_got = torch.autograd.grad(got, [hidden, head.weight])
    torch.testing.assert_close(got, ref)
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b)


def test_lora_keeps_the_base_frozen_in_bf16_and_trains_fp32_adapters(tmp_path, monkeypatch):
    path = hf_dir(tmp_path, "llama", 2, dtype=torch.bfloat16)
    model = _from_pretrained(path, dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = {}
    real = torch.optim.AdamW

    def spy(params, **kw):
        params = list(params)
        seen["dtypes"] = {p.dtype for p in params}
        seen["n"] = sum(p.numel() for p in params)
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    healed, info = heal(model, model_tokenizer(path), HealOptions(**HEAL))
    assert seen["dtypes"] == {torch.float32} and seen["n"] == info["trained_params"]
    assert seen["n"] < sum(v.numel() for v in before.values()) / 4  # adapters only
    after = healed.state_dict()
    assert all(t.dtype == torch.bfloat16 for t in after.values()) and info["weights_dtype"] == "bfloat16"
    assert not any("lora" in k for k in after)
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert not torch.equal(after["model.layers.1.self_attn.q_proj.weight"], before["model.layers.1.self_attn.q_proj.weight"])


def test_activation_checkpointing_trains_the_same_steps(tmp_path):
    path = hf_dir(tmp_path, "llama", 2)
    curves = []
    for checkpoint in (False, True):
        _, info = heal(_from_pretrained(path), model_tokenizer(path), HealOptions(**HEAL, checkpoint=checkpoint))
        assert info["activation_checkpointing"] is checkpoint
        curves.append(info["train_loss"])
    assert curves[0] == pytest.approx(curves[1], abs=1e-5)


def test_streamed_prune_heals_the_kept_blocks_as_in_memory_healing_does(tmp_path):
    """The streamed engine's heal (kept blocks loaded from the written checkpoint, healed, written back) gives the
    weights that healing the pruned checkpoint loaded by transformers gives, and checks its own export."""
    path = hf_dir(tmp_path, "llama", 4)
    plain = prune_target(open_streamed(str(path)), PruneOptions(**OPTS, blocks=[3]), tmp_path / "plain")
    healed = prune_target(open_streamed(str(path)), PruneOptions(**OPTS, blocks=[3], heal=HealOptions(**HEAL)),
                            tmp_path / "healed")
    assert healed["heal"]["mode"] == "lora" and len(healed["heal"]["train_loss"]) == 3
    assert healed["loss"]["pruned"] == pytest.approx(plain["loss"]["pruned"], abs=1e-6)
    assert healed["loss"]["healed"] is not None and healed["loss"]["healed"] != healed["loss"]["pruned"]
    assert healed["export"]["max_abs_logit_diff"] <= 1e-4  # the healed files vs the healed model in memory
    assert healed["export"]["pruned_cut"]["max_abs_logit_diff_vs_skipping_in_original"] <= 1e-4
    ref, _ = heal(_from_pretrained(tmp_path / "plain"), open_streamed(str(path)).tokenizer, HealOptions(**HEAL))
    got = _from_pretrained(tmp_path / "healed")
    ref_state = ref.state_dict()
    for name, t in got.state_dict().items():
        torch.testing.assert_close(t, ref_state[name], rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(got.state_dict()["model.layers.0.mlp.up_proj.weight"],
                           _from_pretrained(tmp_path / "plain").state_dict()["model.layers.0.mlp.up_proj.weight"])


def test_in_memory_prune_keeps_no_copy_of_the_model(tmp_path, monkeypatch):
    import depthlab.prune.export as export
    from depthlab.prune import prune_target
    from depthlab.targets import load_target

    path = hf_dir(tmp_path, "llama", 3)
    target = load_target(str(path))

    real = copy.deepcopy

    def no_copy(obj, *args, **kwargs):
        if isinstance(obj, torch.nn.Module):
            raise AssertionError("the model was deep-copied")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(export.copy, "deepcopy", no_copy)
    report = prune_target(target, PruneOptions(**OPTS, blocks=[2]), tmp_path / "out")
    assert report["export"]["max_abs_logit_diff_vs_skipping_in_original"] <= 1e-5
    assert report["latency"]["original"]["seconds"] > 0 and report["latency"]["pruned"]["seconds"] > 0
    assert target.model.config.num_hidden_layers == 2  # pruned in place


def test_checkpointing_is_on_where_activations_would_set_the_peak(tmp_path):
    """The default: on when the activations outweigh the weights (a small model on long batches), off when the
    model outweighs them (an 8B model on 256 tokens), and checkpointing never changes the losses."""
    from depthlab.prune.heal import activation_bytes, checkpoint_pays, weight_bytes

    path = hf_dir(tmp_path, "llama", 2)
    model = _from_pretrained(path)
    weights = weight_bytes(model)
    assert weights == sum(p.numel() * 4 for p in model.parameters())  # fp32, nothing tied in this one
    small, large = activation_bytes(model, 2, 2), activation_bytes(model, 64 * 32, 32)
    assert small < weights < large  # a check that the two cases below are what they claim
    assert not checkpoint_pays(small, weights, free=None) and checkpoint_pays(large, weights, free=None)
    assert checkpoint_pays(small, weights, free=2 * small)  # short of memory: on however small the batch
    _, on = heal(model, model_tokenizer(path), HealOptions(**{**HEAL, "batch_size": 64, "steps": 1}))
    assert on["activation_checkpointing"] is True
    _, off = heal(_from_pretrained(path), model_tokenizer(path), HealOptions(**{**HEAL, "batch_size": 1, "seq_len": 2,
                                                                                     "steps": 1}))
    assert off["activation_checkpointing"] is False
