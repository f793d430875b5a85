"""prune --unit attn|mlp: the choice against transformers with projections zeroed, the export loading in plain
transformers with the in-memory model's logits, depthlab's own model skipping the compute; --generate."""

import json

import pytest
import torch

import depthlab as d
from depthlab.cli import main

FAST = ["--tokens", "96", "--seq-len", "32", "--batch-size", "3", "--no-progress", "--latency-tokens", "2"]


def _loss(model, batches):
    with torch.no_grad():
        return sum(float(model(input_ids=x, labels=x).loss) for x in batches) / len(batches)


def test_greedy_attention_removal_on_qwen2_equals_zeroed_projections_in_transformers(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from depthlab.analysis.diagnostics import DiagnoseOptions
    from depthlab.analysis.diagnostics.heldout import TextBatches
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


def test_unknown_unit_is_refused_in_one_line(hf_dir, tmp_path, capsys):
    code = main(["prune", str(hf_dir("llama", 4)), "--unit", "heads", "--remove", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "heads" in err and "attn" in err and not (tmp_path / "o").exists()


def test_registry_families_measure_units_where_their_blocks_have_them_and_say_why_not_elsewhere():
    """Every family of the registry: its tiny model either has an attention and an MLP branch for every block, and
    zeroing a unit's output projection equals zeroing the branch (where a single projection exists), or diagnose goes
    on without units (a one-line DepthlabError from check_sublayers says why)."""
    from depthlab.base.errors import DepthlabError
    from depthlab.hf.families import FAMILIES
    from depthlab.hf.tiny import tiny_model
    from depthlab.prune.units import zero_units
    from depthlab.targets.branches import check_sublayers, unit_modules, zeroed
    from depthlab.targets.layers import find_layers

    ids, covered = torch.randint(0, 100, (1, 7)), []
    for model_type in (t for t, f in FAMILIES.items() if not f.wrapped):  # wrapped: built inside their wrapper only
        model = tiny_model(model_type, jitter=False)
        layers = find_layers(model)
        try:
            check_sublayers(layers)
        except DepthlabError as err:
            assert len(str(err).splitlines()) == 1
            continue
        covered.append(model_type)
        for unit in ("attn", "mlp"):
            try:
                cut = zero_units(model, unit, [2])
            except DepthlabError:  # no single output projection (MoE experts): measured, not exported
                continue
            with torch.no_grad(), zeroed(unit_modules(layers, unit)[1]):
                hooked = model(input_ids=ids).logits
            with torch.no_grad():
                torch.testing.assert_close(cut(input_ids=ids).logits, hooked, msg=f"{model_type} {unit}")
    assert {"llama", "mistral", "qwen2", "qwen3"} <= set(covered)


def test_the_remove_range_of_sublayers_counts_sublayers_not_blocks():
    """Issue 49, also seen: ``--unit attn --remove 4`` on 4 blocks said "remove 1..3" (the blocks' range: one block
    must stay), though every attention sublayer may go (``check_units``' own range)."""
    from depthlab.base.errors import DepthlabError
    from depthlab.prune.options import PruneOptions

    PruneOptions(remove=4, unit="attn").validate(4)  # all four attention sublayers: allowed, as check_units allows
    with pytest.raises(DepthlabError, match=r"--remove 5 is out of range: the model has 4 mlp sublayers "
                                            r"\(--unit mlp\), so remove 1\.\.4"):
        PruneOptions(remove=5, unit="mlp").validate(4)
    with pytest.raises(DepthlabError, match=r"the model has 4 blocks, so remove 1\.\.3"):
        PruneOptions(remove=4).validate(4)
