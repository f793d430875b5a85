"""LayerNorm Scaling on Hugging Face models (depthlab.hf.lns): parity, fold, save/load, Trainer."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from depthlab.hf.lns import (  # noqa: E402
    CONFIG_KEY,
    apply_layernorm_scaling,
    fold_layernorm_scaling,
    is_layernorm_scaled,
    load,
    remove_layernorm_scaling,
)
from depthlab.hf.tiny import tiny_model  # noqa: E402

VOCAB, LAYERS = 96, 3


def tiny(model_type: str = "llama", seed: int = 0) -> nn.Module:
    """A random HF model with non-trivial norm weights (so a wrong scale placement shows), no sliding window."""
    return tiny_model(model_type, seed=seed, vocab_size=VOCAB, num_hidden_layers=LAYERS, max_position_embeddings=64,
                      initializer_range=0.1, rms_norm_eps=1e-6, sliding_window=None)


def tokens(seed: int = 1, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out[0]


class _Scaled(nn.Module):
    """Independent reference for LNS: the norm followed by an explicit multiply (test-only)."""

    def __init__(self, norm: nn.Module, scale: float) -> None:
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x):
        return self.norm(x) * self.scale


def reference_lns(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    for l, layer in enumerate(ref.model.layers, start=1):
        layer.input_layernorm = _Scaled(layer.input_layernorm, 1 / math.sqrt(l))
        layer.post_attention_layernorm = _Scaled(layer.post_attention_layernorm, 1 / math.sqrt(l))
    return ref


# ---------------------------------------------------------------------- parity
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_matches_depthlab_lns_model(model_type):
    from_hf = pytest.importorskip("depthlab.hf.convert").from_hf
    hf = tiny(model_type)
    ids = tokens()
    vanilla = logits(hf, ids)
    ours = from_hf(hf, scheme="lns")  # depthlab's own LNS blocks, same weights (before patching)
    assert ours.cfg.scheme == "lns"
    apply_layernorm_scaling(hf)
    patched = logits(hf, ids)
    torch.testing.assert_close(patched, ours(ids).logits.detach(), rtol=1e-4, atol=1e-4)
    assert (patched - vanilla).abs().max() > 1e-2, "LNS must change the function of a 3-layer model"


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_matches_explicit_reference_and_leaves_qk_norm_alone(model_type):
    hf = tiny(model_type)
    ids = tokens()
    ref = logits(reference_lns(hf), ids)
    apply_layernorm_scaling(hf)
    torch.testing.assert_close(logits(hf, ids), ref, rtol=1e-5, atol=1e-5)
    hooked = [name for name, m in hf.named_modules() if m._forward_hooks]
    assert len(hooked) == 2 * LAYERS and all(n.endswith(("input_layernorm", "post_attention_layernorm")) for n in hooked)
    assert not hf.model.norm._forward_hooks  # the final norm is never scaled


def test_first_layer_is_plain_pre_ln():
    hf = tiny()
    apply_layernorm_scaling(hf)
    hooks = [list(layer.input_layernorm._forward_hooks.values())[0] for layer in hf.model.layers]
    assert [h.scale for h in hooks] == pytest.approx([1.0, 1 / math.sqrt(2), 1 / math.sqrt(3)])


# ---------------------------------------------------------------------- apply / remove
def test_apply_twice_raises_and_remove_restores():
    hf = tiny()
    ids = tokens()
    vanilla = logits(hf, ids)
    assert apply_layernorm_scaling(hf) is hf
    patched = logits(hf, ids)
    with pytest.raises(ValueError, match="already applied"):
        apply_layernorm_scaling(hf)
    torch.testing.assert_close(logits(hf, ids), patched)  # the failed call changed nothing
    remove_layernorm_scaling(hf)
    assert not is_layernorm_scaled(hf) and getattr(hf.config, CONFIG_KEY, None) is None
    torch.testing.assert_close(logits(hf, ids), vanilla)
    with pytest.raises(ValueError, match="not applied"):
        remove_layernorm_scaling(hf)


def test_unknown_marker_version_is_an_error_not_overwritten():
    hf = tiny()
    setattr(hf.config, CONFIG_KEY, {"position": "after-norm", "version": 99})
    with pytest.raises(ValueError, match="version 1"):
        apply_layernorm_scaling(hf)
    assert not is_layernorm_scaled(hf)


def test_state_dict_keys_unchanged():
    hf = tiny()
    keys = list(hf.state_dict())
    apply_layernorm_scaling(hf)
    assert list(hf.state_dict()) == keys


def test_an_architecture_without_pre_norms_is_refused_saying_why():
    """OPT is not a row: its pre-norms are probed. Post-LN OPT (do_layer_norm_before=False, OPT-350m) has none: its
    norms sit on the residual stream after each branch, so there is nothing for LNS to scale."""
    cfg = transformers.OPTConfig(num_hidden_layers=2, hidden_size=16, ffn_dim=32, num_attention_heads=2,
                                 vocab_size=VOCAB, max_position_embeddings=32, word_embed_proj_dim=16,
                                 do_layer_norm_before=False)
    opt = AutoModelForCausalLM.from_config(cfg)  # a decoder family the registry does not hold
    with pytest.raises(ValueError, match="cannot apply LayerNorm Scaling to opt .*'opt'.*no pre-norm") as err:
        apply_layernorm_scaling(opt)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not a Hugging Face"):
        apply_layernorm_scaling(nn.Linear(2, 2))


# ---------------------------------------------------------------------- fold
def test_fold_same_logits_and_plain_transformers_reload(tmp_path):
    hf = apply_layernorm_scaling(tiny())
    ids = tokens()
    patched = logits(hf, ids)
    folded = fold_layernorm_scaling(hf)
    assert is_layernorm_scaled(hf), "fold returns a copy; the original stays LNS"
    assert not is_layernorm_scaled(folded) and getattr(folded.config, CONFIG_KEY, None) is None
    assert not any(m._forward_hooks for m in folded.modules())
    torch.testing.assert_close(logits(folded, ids), patched, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(folded.model.layers[1].input_layernorm.weight,
                               hf.model.layers[1].input_layernorm.weight / math.sqrt(2))
    folded.save_pretrained(tmp_path)
    assert CONFIG_KEY not in json.loads((tmp_path / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded, ids), patched, rtol=1e-5, atol=1e-5)


def test_generate_with_kv_cache_matches_folded_model():
    hf = apply_layernorm_scaling(tiny())
    folded = fold_layernorm_scaling(hf)
    prompt = tokens(batch=1, length=4)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(hf.generate(prompt, **kw), folded.generate(prompt, **kw))


def test_fold_refuses_unpatched_model():
    with pytest.raises(ValueError, match="nothing to fold"):
        fold_layernorm_scaling(tiny())


# ---------------------------------------------------------------------- save / load
def test_save_pretrained_then_load_restores_lns(tmp_path):
    hf = apply_layernorm_scaling(tiny("qwen2"))
    ids = tokens()
    patched = logits(hf, ids)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[CONFIG_KEY]["position"] == "after-norm"
    back = load(tmp_path).eval()
    assert is_layernorm_scaled(back)
    torch.testing.assert_close(logits(back, ids), patched)
    # what the docs warn about: plain from_pretrained builds the vanilla (different) network
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not is_layernorm_scaled(plain)
    assert (logits(plain, ids) - patched).abs().max() > 1e-2
    # ... and the marker lets apply_layernorm_scaling restore it
    torch.testing.assert_close(logits(apply_layernorm_scaling(plain), ids), patched)


def test_from_hf_reads_lns_checkpoint_as_lns(tmp_path):
    convert = pytest.importorskip("depthlab.hf.convert")
    hf = apply_layernorm_scaling(tiny())
    ids = tokens()
    hf.save_pretrained(tmp_path)
    ours = convert.from_hf(str(tmp_path))
    assert ours.cfg.scheme == "lns"
    torch.testing.assert_close(ours(ids).logits.detach(), logits(hf, ids), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="LayerNorm Scaling"):
        convert.from_hf(str(tmp_path), scheme="pre")


# ---------------------------------------------------------------------- training
def test_gradient_checkpointing_gives_same_gradients():
    ids = tokens(length=10)
    grads = []
    for checkpointing in (False, True):
        hf = apply_layernorm_scaling(tiny())
        hf.train()
        if checkpointing:
            # transformers 5 renamed gradient -> activation checkpointing; 4.x has only the old name
            enable = getattr(hf, "activation_checkpointing_enable", None) or hf.gradient_checkpointing_enable
            enable()
        hf(ids, labels=ids).loss.backward()
        grads.append(hf.model.layers[2].input_layernorm.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    # the gradient reflects the scale: compare with the explicit reference
    ref = reference_lns(tiny()).train()
    ref(ids, labels=ids).loss.backward()
    torch.testing.assert_close(grads[0], ref.model.layers[2].input_layernorm.norm.weight.grad)


def test_torch_compile_keeps_scaling():
    hf = apply_layernorm_scaling(tiny())
    ids = tokens()
    eager = logits(hf, ids)
    compiled = torch.compile(hf, backend="aot_eager", fullgraph=False)
    torch.testing.assert_close(logits(compiled, ids), eager, rtol=1e-5, atol=1e-5)


def test_one_trainer_step_changes_weights(tmp_path):
    from transformers import Trainer, TrainingArguments

    hf = apply_layernorm_scaling(tiny())
    before = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    data = [{"input_ids": row, "labels": row} for row in tokens(batch=4, length=16)]
    fields = TrainingArguments.__dataclass_fields__
    ckpt = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, learning_rate=1e-2,
        report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no", **{ckpt: True},
    )
    trainer = Trainer(model=hf, args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.global_step == 1
    after = hf.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.layers.2.input_layernorm.weight" in changed and len(changed) > len(before) // 2
    assert is_layernorm_scaled(hf)
