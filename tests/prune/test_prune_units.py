"""prune --unit attn|mlp: the choice against transformers with projections zeroed, the export loading in plain
transformers with the in-memory model's logits, depthlab's own model skipping the compute; --generate."""

import json

import torch

import depthlab as d
from depthlab.cli import main

FAST = ["--tokens", "96", "--seq-len", "32", "--batch-size", "3", "--no-progress", "--latency-tokens", "2"]


def _loss(model, batches):
    with torch.no_grad():
        return sum(float(model(input_ids=x, labels=x).loss) for x in batches) / len(batches)


def test_greedy_attention_removal_on_qwen2_equals_zeroed_projections_in_transformers(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from depthlab.analysis.diagnostics.runner import DiagnoseOptions, TextBatches
    from depthlab.targets import load_target

    src = hf_dir("qwen2", 4)
    out = tmp_path / "attn"
    assert main(["prune", str(src), "--unit", "attn", "--remove", "2", "--out", str(out), *FAST]) == 0
    rep = json.loads((out / "prune.json").read_text())
    assert rep["unit"] == "attn" and rep["method"] == "removal" and len(rep["removed_blocks"]) == 2
    # the held-out windows prune read, scored by transformers with each candidate's o_proj zeroed
    target = load_target(str(src))
    opts = DiagnoseOptions(data="builtin", split="val", tokens=96, seq_len=32, batch_size=3)
    windows = [torch.cat([x, y[:, -1:]], 1) for x, y in TextBatches(target, opts)]
    original = AutoModelForCausalLM.from_pretrained(src).eval()

    def zeroed(blocks):
        m = AutoModelForCausalLM.from_pretrained(src).eval()
        with torch.no_grad():
            for b in blocks:
                m.model.layers[b - 1].self_attn.o_proj.weight.zero_()
        return m

    first = {b: _loss(zeroed([b]), windows) for b in range(1, 5)}
    step1 = rep["selection"]["greedy_path"][0]
    assert {int(k): v for k, v in step1["candidates"].items()} == __import__("pytest").approx(first, abs=1e-5)
    assert step1["block"] == min(first, key=lambda b: (first[b], -b))
    assert abs(rep["loss"]["original"] - _loss(original, windows)) < 1e-5
    assert abs(rep["loss"]["pruned"] - _loss(zeroed(rep["removed_blocks"]), windows)) < 1e-5
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()  # plain transformers, same architecture and depth
    assert loaded.config.num_hidden_layers == 4 and rep["export"]["max_abs_logit_diff"] < 1e-5
    ids = torch.randint(0, 257, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, zeroed(rep["removed_blocks"])(input_ids=ids).logits)
    assert "export (transformers)" in rep["latency"]["models"] and (out / "report.html").is_file()


def test_depthlab_mlp_removal_skips_the_compute_and_scores_generation(tmp_path):
    from depthlab.prune.options import HealOptions, PruneOptions
    from depthlab.prune.units import prune_units_in_memory, skipping_model
    from depthlab.targets import load_target

    target = load_target("preset:tiny", scheme="lns")  # its tokenizer; a smaller model of the same vocabulary
    torch.manual_seed(0)
    target.model = d.build_model(target.model.cfg.replace(n_layers=4, d_model=32, n_heads=2, d_ff=64)).eval()
    opts = PruneOptions(unit="mlp", blocks=[2, 4], data="builtin", tokens=64, seq_len=32, batch_size=2, progress=False,
                        latency_tokens=2, generate="builtin-arith", generate_limit=2,
                        heal=HealOptions(steps=1, batch_size=2, seq_len=32, progress=False))
    rep = prune_units_in_memory(target, opts, tmp_path / "mlp")
    assert rep["removed_blocks"] == [2, 4] and set(rep["generate"]) == {"original", "pruned", "healed"}
    assert set(rep["loss"]) == {"original", "pruned", "healed"} and rep["heal"]["steps"] == 1
    assert rep["generate"]["original"]["n"] == 2 and "depthlab_speedup" in rep["latency"]
    assert rep["export"]["max_abs_logit_diff"] < 1e-4 and rep["export"]["max_abs_logit_diff_zeroed_vs_hooked"] < 1e-5
    ids = torch.randint(0, 200, (2, 12))
    skip = skipping_model(target.model, "mlp", [2, 4])
    with torch.no_grad():  # the skipping model by hand: blocks 2 and 4 add only their attention branch
        h = target.model.embed_norm(target.model.embed(ids))
        rope = target.model.rope(12, h.device)
        for l, b in enumerate(target.model.blocks, 1):
            h = b.resid_scale(h + b.attn_out(b.attn(b.attn_norm(b.attn_prescale(h)), rope))) if l in (2, 4) else b(h, rope)
        torch.testing.assert_close(skip(ids).logits, target.model.head(h))
    assert sum(p.numel() for p in skip.parameters()) < sum(p.numel() for p in target.model.parameters())


def test_streamed_unit_pruning_is_refused_in_one_line(hf_dir, tmp_path, capsys):
    code = main(["prune", str(hf_dir("llama", 4)), "--unit", "attn", "--remove", "1", "--stream", "--out",
                 str(tmp_path / "o"), *FAST])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--unit attn" in err
    code = main(["prune", str(hf_dir("llama", 4)), "--unit", "heads", "--remove", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "heads" in err and "attn" in err and not (tmp_path / "o").exists()


def test_every_supported_hf_family_zeroes_the_same_branch_it_measures():
    """For each family of the registry: zeroing the unit's output projection (the export) gives the logits of the
    branch's output zeroed (what diagnose and the selection measure)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from depthlab.analysis.diagnostics.sublayers import unit_modules, zeroed
    from depthlab.hf.architectures import SUPPORTED_MODEL_TYPES
    from depthlab.prune.units import zero_units
    from depthlab.targets.layers import find_layers

    ids = torch.randint(0, 100, (1, 9))
    for model_type in SUPPORTED_MODEL_TYPES:
        cfg = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        for unit in ("attn", "mlp"):
            with torch.no_grad(), zeroed(unit_modules(find_layers(model), unit)[1]):
                hooked = model(input_ids=ids).logits
            with torch.no_grad():
                cut = zero_units(model, unit, [2])(input_ids=ids).logits
                full = model(input_ids=ids).logits
            torch.testing.assert_close(cut, hooked, msg=f"{model_type} {unit}")
            assert not torch.allclose(cut, full)
