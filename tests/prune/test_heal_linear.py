"""``prune --heal linear``: the folded export is the original with each removed span replaced by the map a naive
ridge least-squares fit gives (computed here from transformers' own hidden states and an MLP hook); streamed = in
memory; what cannot be folded is refused in one line, exit 2, before any work."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import hf_dir

from depthlab.analysis.diagnostics import load_target
from depthlab.cli import main
from depthlab.prune import PruneOptions, prune_target
from depthlab.prune.heal_linear import RIDGE, calibration, spans
from depthlab.prune.options import HealOptions
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2)
FAST = ["--tokens", "96", "--seq-len", "32", "--batch-size", "2", "--no-progress"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _opts(blocks, form="full", **heal):
    return PruneOptions(**OPTS, blocks=blocks, heal=HealOptions(mode="linear", linear=form, calib_tokens=160,
                                                                progress=False, **heal))


def _naive_maps(model, batches, removed, form):
    """Per span (a, b): T minimising ‖M T − R‖² + λ‖T − I‖², M = block a−1's MLP output (a hook), R = x^{b+1} − x^a + M
    (transformers' hidden states), by lstsq on the stacked rows (full) or per coordinate (diagonal)."""
    layers, maps = model.model.layers, []
    for a, b in spans(removed):
        mlp_out, rows_m, rows_r = [], [], []
        h = layers[a - 2].mlp.register_forward_hook(lambda _m, _a, out, keep=mlp_out: keep.append(out))
        try:
            for x, _ in batches:
                with torch.no_grad():
                    hs = model(input_ids=x, output_hidden_states=True).hidden_states
                M = mlp_out.pop().double().reshape(-1, hs[0].shape[-1])
                rows_m.append(M)
                rows_r.append((hs[b] - hs[a - 1]).double().reshape(M.shape) + M)
        finally:
            h.remove()
        M, R = torch.cat(rows_m), torch.cat(rows_r)
        d = M.shape[1]
        lam = RIDGE * float((M * M).sum(0).mean()) + 1e-12
        if form == "diagonal":
            maps.append(torch.diag(((M * R).sum(0) + lam) / ((M * M).sum(0) + lam)))
            continue
        eye = torch.eye(d, dtype=torch.float64)  # ridge toward I: rows sqrt(λ)·I on both sides
        maps.append(torch.linalg.lstsq(torch.cat([M, lam ** 0.5 * eye]), torch.cat([R, lam ** 0.5 * eye])).solution)
    return maps


class _Replaced(torch.nn.Module):
    """The original with span (a, b) skipped and block a−1's MLP output multiplied by T."""

    def __init__(self, model, removed, maps):
        super().__init__()
        self.model = model
        self.hooks = [model.model.layers[a - 2].mlp.register_forward_hook(
            lambda _m, _a, out, T=T: (out.double() @ T).to(out.dtype)) for (a, _), T in zip(spans(removed), maps)]
        self.removed = removed

    def forward(self, ids):
        layers = self.model.model.layers
        keep = torch.nn.ModuleList([m for i, m in enumerate(layers, start=1) if i not in self.removed])
        self.model.model.layers = keep
        try:
            with torch.no_grad():
                return self.model(input_ids=ids, use_cache=False).logits
        finally:
            self.model.model.layers = layers


@pytest.mark.parametrize("kind, removed, form", [("llama", [3, 4], "full"), ("qwen2-tied", [2, 5, 6], "diagonal")])
def test_linear_heal_export_is_the_original_with_each_span_replaced_by_the_naive_fit(tmp_path, kind, removed, form):
    from transformers import AutoModelForCausalLM

    path = hf_dir(tmp_path, kind, 7)
    opts = _opts(removed, form)
    target = load_target(str(path))
    batches = calibration(target, opts.heal, opts.seq_len, opts.batch_size)
    rep = prune_target(target, opts, tmp_path / "out")
    original = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    maps = _naive_maps(original, batches, removed, form)
    healed = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = healed(input_ids=ids).logits
    want = _Replaced(original, removed, maps)(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    heal = rep["heal"]
    assert heal["mode"] == "linear" and heal["spans"] == [list(s) for s in spans(removed)]
    assert heal["calibration_tokens"] == sum(x.numel() for x, _ in batches) == 160  # 5 rows of 32: the last batch cut to 1 row
    assert all(0 <= e <= i + 1e-9 for e, i in zip(heal["relative_error"], heal["identity_error"]))  # T = I is a candidate
    assert rep["loss"]["healed"] is not None and rep["n_layers"]["pruned"] == 7 - len(removed)
    assert rep["export"]["max_abs_logit_diff"] < 1e-5


def test_streamed_linear_heal_equals_in_memory(tmp_path):
    from transformers import AutoModelForCausalLM

    path = hf_dir(tmp_path, "llama", 6)
    opts = _opts([2, 4, 5], "lowrank", linear_rank=4)
    mem = prune_target(load_target(str(path)), opts, tmp_path / "mem")
    streamed = prune_target(open_streamed(str(path)), opts, tmp_path / "streamed")
    for k in ("relative_error", "identity_error"):
        assert streamed["heal"][k] == pytest.approx(mem["heal"][k], abs=1e-6)
    assert streamed["heal"]["calibration_tokens"] == mem["heal"]["calibration_tokens"]
    for stage in ("original", "pruned", "healed"):
        assert streamed["loss"][stage] == pytest.approx(mem["loss"][stage], abs=1e-5)
    exp = streamed["export"]
    assert exp["max_abs_logit_diff"] < 1e-5 and exp["generate_cache_matches_no_cache"]
    a, b = (AutoModelForCausalLM.from_pretrained(str(tmp_path / d)).eval() for d in ("mem", "streamed"))
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(b(input_ids=ids).logits, a(input_ids=ids).logits, rtol=0, atol=1e-5)
    for d in ("mem", "streamed"):
        assert json.loads((tmp_path / d / "config.json").read_text())["depthlab"]["healed"] == "linear"


@pytest.mark.parametrize("engine", ["memory", "streamed"])
def test_selection_under_a_linear_heal_keeps_block_1(tmp_path, engine):
    """--remove chooses among sets that keep block 1 (its span would have no block to fold into), on both engines."""
    path = hf_dir(tmp_path, "llama", 4)
    target = load_target(str(path)) if engine == "memory" else open_streamed(str(path))
    free = prune_target(target, PruneOptions(**OPTS, remove=2, method="influence"), tmp_path / "free")
    assert free["removed_blocks"] == [1, 4]  # this model's unconstrained choice takes block 1
    target = load_target(str(path)) if engine == "memory" else open_streamed(str(path))
    rep = prune_target(target, PruneOptions(**OPTS, remove=2, method="influence",
                                            heal=HealOptions(mode="linear", calib_tokens=64, progress=False)),
                       tmp_path / "out")
    assert 1 not in rep["removed_blocks"] and len(rep["removed_blocks"]) == 2
    assert rep["heal"]["fold"] == [a - 1 for a, _ in spans(rep["removed_blocks"])]


def _exit_2(argv, capsys, *needles):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("extra, needles", [
    (["--blocks", "1,2"], ("span 1..2 starts at block 1", "keep block 1")),
    (["--blocks", "3", "--heal-steps", "5"], ("no training steps", "--heal-steps 5")),
    (["--blocks", "3", "--heal-linear", "cubic"], ("--heal-linear", "cubic", "diagonal")),
    (["--blocks", "3", "--unit", "mlp"], ("--unit mlp removes no block",)),
])
@pytest.mark.parametrize("stream", ["--no-stream", "--stream"])
def test_linear_heal_refuses_what_it_cannot_fold_before_any_work(tmp_path, capsys, extra, needles, stream):
    path = hf_dir(tmp_path, "llama", 4)
    out = tmp_path / "out"
    capsys.readouterr()  # what writing the fixture printed (transformers' shard bar)
    _exit_2(["prune", str(path), "--heal", "linear", *extra, stream, "--out", str(out), *FAST], capsys, *needles)
    assert not out.exists()


@pytest.mark.parametrize("kind, needles", [("gemma2", ("post_feedforward_layernorm", "use --heal lora")),
                                           ("qwen2_moe", ("no single MLP down projection", "use --heal lora"))])
def test_linear_heal_refuses_blocks_it_cannot_fold_into(tmp_path, capsys, kind, needles):
    path = hf_dir(tmp_path, kind, 3)
    out = tmp_path / "out"
    capsys.readouterr()  # what writing the fixture printed (transformers' shard bar)
    _exit_2(["prune", str(path), "--heal", "linear", "--blocks", "2", "--out", str(out), *FAST], capsys, *needles)
    assert not out.exists()
