"""The contract every registered scheme keeps, run over the registry itself (no hand-kept name list):
it builds, trains through the real trainer, checkpoints and resumes exactly, is diagnosed from its run
directory, counts its parameters from its modules, round-trips its state dict, builds on the meta
device, compiles in one graph to the eager loss and gradients, and either exports to a vanilla HF
checkpoint with the same logits or is refused in one clear line."""

import math
import shutil

import pytest
import torch

import depthlab as d
from depthlab.base.errors import ConfigError, DepthlabError
from depthlab.hf import exportable_schemes, to_hf_model

SCHEMES = sorted(d.SCHEMES)


def small(scheme, **kw):
    return d.from_preset("llama-9m", scheme=scheme, **{"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ff": 48,
                                                         "vocab_size": 61, **kw})


@pytest.mark.parametrize("scheme", SCHEMES)
def test_forward_backward_finite_and_every_parameter_gets_a_gradient(scheme):
    model = d.build_model(small(scheme))
    ids = torch.randint(0, 61, (2, 9))
    out = model(ids, labels=ids.roll(-1, 1))
    assert out.logits.shape == (2, 9, 61) and torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def _records(into):
    return lambda rec: into.append((rec["step"], rec["loss"]))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_trains_checkpoints_resumes_exactly_and_diagnoses(scheme, tmp_path, tmp_path_factory, monkeypatch, one_thread):
    """4 steps through ``depthlab.train.train`` (checkpoints at 2 and 4); a copy of the run cut back to
    its step-2 checkpoint resumes to the same losses and bit-identical step-4 weights and optimizer
    state; ``diagnose`` reads the run directory and reports finite numbers for all L+1 states."""
    from safetensors.torch import load_file

    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target
    from depthlab.train import TrainConfig, list_checkpoints, train

    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path_factory.getbasetemp() / "depthlab-cache"))  # shared tokens
    cfg = d.from_preset("tiny", scheme=scheme, n_layers=2, d_model=16, n_heads=2, d_ff=32)
    tc = TrainConfig(data="builtin", tokenizer="bytes", steps=4, batch_size=2, seq_len=16, eval_tokens=64,
                     eval_every=4, variance_every=2, ckpt_every=2, keep_last=2, lr=3e-3, device="cpu")
    straight, resumed = [], []
    train(cfg, tc, tmp_path / "a", quiet=True, progress=_records(straight))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(list_checkpoints(tmp_path / "b")[-1])  # back to the step-2 checkpoint
    train(cfg, tc, tmp_path / "b", resume=True, quiet=True, progress=_records(resumed))
    assert resumed == straight[2:] and [s for s, _ in straight] == [1, 2, 3, 4]
    assert all(math.isfinite(loss) for _, loss in straight)
    a, b = (list_checkpoints(tmp_path / r)[-1] for r in "ab")
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = (torch.load(c / "optimizer.pt", weights_only=True) for c in (a, b))
    def groups(o):  # a resumed optimizer holds its betas as the list the checkpoint stored
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in o["param_groups"]]

    assert groups(oa) == groups(ob)
    assert all(torch.equal(x, y) for k in oa["state"] for x, y in zip(oa["state"][k].values(), ob["state"][k].values()))
    report = diagnose(load_target(str(tmp_path / "a")), DiagnoseOptions(tokens=64, seq_len=16, batch_size=2,
                                                                         jac_samples=1, jac_context=4, progress=False))
    variance, angular = report["variance"]["variance"], report["angular"]["adjacent"]
    assert len(variance) == cfg.n_layers + 1 and len(angular) == cfg.n_layers
    assert all(math.isfinite(v) for v in variance + angular + report["removal"]["delta_loss"])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_parameter_count_is_the_meta_build_and_at_least_pre_ln(scheme):
    cfg = small(scheme)
    V, D, F, L = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.n_layers
    assert d.num_params(cfg) == d.build_model(cfg).num_params()
    assert d.num_params(cfg) >= 2 * V * D + L * (4 * D * D + 3 * D * F)  # every scheme has Llama's matmuls
    assert d.num_params(cfg, include_embeddings=False) == d.num_params(cfg) - 2 * V * D


@pytest.mark.parametrize("scheme", SCHEMES)
def test_state_dict_round_trip_gives_the_same_logits(scheme):
    cfg = small(scheme)
    a, b = d.build_model(cfg).eval(), d.build_model(cfg).eval()
    with torch.no_grad():  # b starts elsewhere (random gains too), then takes a's state
        for p in b.parameters():
            p.uniform_(-1, 1)
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 61, (1, 7))
    torch.testing.assert_close(b(ids).logits, a(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_meta_build_materialises_into_the_same_structure(scheme):
    cfg = small(scheme)
    meta = d.build_model(cfg, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    ref = d.build_model(cfg)
    def structure(model):  # module types and constant scales (LNS 1/sqrt(l), DeepNorm alpha), by name
        return [(n, type(m).__name__, getattr(m, "scale", None)) for n, m in model.named_modules()]

    assert structure(meta) == structure(ref)
    assert all(torch.isfinite(p).all() for p in meta.parameters())
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_exports_with_the_same_logits_or_is_refused_in_one_line(scheme):
    model = d.build_model(small(scheme)).eval()
    ids = torch.randint(0, 61, (1, 7))
    if scheme in exportable_schemes():
        hf = to_hf_model(model)
        with torch.no_grad():
            torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(DepthlabError) as err:
            to_hf_model(model)
        msg = str(err.value)
        assert "\n" not in msg and repr(scheme) in msg and "exportable: pre" in msg


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiles_without_graph_breaks_to_the_eager_loss_and_gradients(scheme):
    """One graph (``fullgraph=True``: no Python control flow on tensor values), the same loss and gradients.
    ``aot_eager`` runs dynamo and AOT autograd without generating C++ (the trainer's inductor is tested on LNS in
    tests/train/test_fast_path.py)."""
    torch._dynamo.reset()  # each scheme compiles DecoderLM.forward anew: stay under dynamo's recompile limit
    model = d.build_model(small(scheme, n_layers=2))  # dynamo unrolls the blocks: two keep the trace short
    with torch.no_grad():  # off the init: zero-initialised gains, gates and queries matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(0, 61, (2, 8))

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    eager_loss = model(ids, labels=ids.roll(-1, 1)).loss
    eager = grads(eager_loss)
    loss = torch.compile(model, backend="aot_eager", fullgraph=True)(ids, labels=ids.roll(-1, 1)).loss
    assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-6)
    for name, g in grads(loss).items():
        torch.testing.assert_close(g, eager[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_options_have_valid_defaults_and_bad_values_are_named(scheme):
    s = d.get_scheme(scheme)
    assert s.summary and s.source
    assert s.resolve({}) == {o.name: o.default for o in s.options}
    for opt in s.options:
        with pytest.raises(ConfigError) as err:
            d.from_preset("tiny", scheme=scheme, **{opt.name: "no-such-value"})
        assert "'no-such-value'" in str(err.value)
    with pytest.raises(ConfigError, match="'bogus_option'"):
        d.from_preset("tiny", scheme=scheme, bogus_option=1)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_qk_norm_works_with_every_scheme(scheme):
    if d.get_scheme(scheme).extras.get("own_qk_norm"):  # normalises q and k itself: the flag is refused, by name
        with pytest.raises(ConfigError, match="qk_norm") as err:
            small(scheme, qk_norm=True)
        assert "\n" not in str(err.value) and scheme in str(err.value)
        return
    cfg = small(scheme, qk_norm=True)
    model = d.build_model(cfg)
    assert d.num_params(cfg) == d.num_params(small(scheme)) + cfg.n_layers * 2 * cfg.dim_head
    out = model(torch.randint(0, 61, (1, 5)), labels=torch.randint(0, 61, (1, 5)))
    assert torch.isfinite(out.loss)


def test_block_depths_keep_the_original_lns_scales():
    cfg = small("lns", n_layers=3, block_depths=[1, 3, 4])
    model = d.build_model(cfg)
    assert [b.attn_norm.scale for b in model.blocks] == pytest.approx([1, 1 / math.sqrt(3), 0.5])
    with pytest.raises(ConfigError, match="block_depths"):
        small("lns", n_layers=3, block_depths=[1, 1, 2])


def test_saved_configs_from_before_the_registry_still_load():
    old = {**d.ModelConfig().to_dict(), "scheme": "lns", "lns_position": "after-branch", "mix_alpha": 0.25,
           "norm_groups": 4, "layerscale_init": None}
    for key in ("scheme_options", "qk_norm", "block_depths"):
        old.pop(key)
    cfg = d.ModelConfig.from_dict(old)
    assert cfg.scheme_options == {"lns_position": "after-branch"}
    assert d.scheme_option(cfg, "position") == "after-branch"
    from depthlab.models.nn import Scale

    block = d.build_model(cfg.replace(n_layers=2, d_model=32, n_heads=2, d_ff=48, vocab_size=61)).blocks[1]
    assert isinstance(block.attn_out, Scale) and block.attn_out.scale == pytest.approx(2 ** -0.5)  # LNS after the branch


def test_readme_scheme_table_is_generated_from_the_registry():
    from pathlib import Path

    from depthlab.models.schemes import scheme_table

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    assert scheme_table() in readme, "README's scheme table is stale: paste depthlab.models.schemes.scheme_table()"
