"""Image-text-to-text wrappers, one test each generated from the registry's list (every model type transformers
builds here): diagnose of both towers, the two engines giving the same numbers; prune of each tower by both engines,
the export reloaded in plain transformers, its logits those of the original with the removed blocks bypassed by a
forward hook (independent of depthlab's capture), generating from text and from an image plus text; LayerNorm
Scaling (against an explicit multiply) and the DepthMonitor on the language tower.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from tiny_models import report_diff

from depthlab.base.errors import DepthlabError
from depthlab.hf.wrappers import TOWERS, WRAPPERS, text_forward, tower_family

pytestmark = pytest.mark.filterwarnings("ignore")

TYPES = list(WRAPPERS)
#: Run on every test pass: LLaVA's two towers (the projector's feature layer), Qwen3-VL's vision tower (deepstack,
#: the Qwen image expansion), Llama 4's (its language model run alone, its vision tower refused); every other
#: (wrapper, tower) of diagnose and prune is slow (about 10 s of CPU each on 2 cores), LNS and the monitor are not.
FAST = {("llava", "language"), ("llava", "vision"), ("qwen3_vl", "vision"), ("llama4", "language"), ("llama4", "vision")}
HEAVY = [pytest.param(t, tower, marks=() if (t, tower) in FAST else pytest.mark.slow, id=f"{t}-{tower}")
         for t in TYPES for tower in TOWERS]
DIAG = {"tokens": 64, "seq_len": 16, "batch_size": 2, "jacobian": False, "joint_check": False, "progress": False,
        "images": 3}
PRUNE = {"method": "removal", "remove": 1, "data": "builtin", "tokens": 64, "seq_len": 16, "batch_size": 2,
         "images": 3, "progress": False}
IDS = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """model type -> its tiny wrapper saved in 40 KB shards (with its tokenizer and processor), built once."""
    from depthlab.hf.tiny import save_tiny_wrapper

    paths: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in paths:
            paths[model_type] = save_tiny_wrapper(model_type, tmp_path_factory.mktemp(model_type),
                                                  max_shard_size="40KB")
        return paths[model_type]
    return get


def refused(model_type: str, tower: str) -> str | None:
    return WRAPPERS[model_type].refused.get("vision") if tower == "vision" else None


# ---------------------------------------------------------------------------------------------- diagnose
@pytest.mark.parametrize("model_type, tower", HEAVY)
def test_diagnose_both_engines_same_numbers(model_type, tower, saved):
    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.targets import load_target

    path = saved(model_type)
    if refused(model_type, tower):
        for stream in (False, True):
            with pytest.raises(DepthlabError, match=f"vision tower of {WRAPPERS[model_type].name}"):
                diagnose(str(path), DiagnoseOptions(**DIAG, tower=tower, stream=stream))
        return
    a = diagnose(load_target(str(path), tower=tower), DiagnoseOptions(**DIAG, tower=tower))
    b = diagnose(str(path), DiagnoseOptions(**DIAG, tower=tower, stream=True))
    n = 4 if tower == "language" else 3
    assert a["model"]["n_layers"] == b["model"]["n_layers"] == n
    assert len(a["removal"]["delta_loss"]) == n and all(math.isfinite(v) for v in a["angular"]["adjacent"])
    assert report_diff(a, b) < 1e-4


# ---------------------------------------------------------------------------------------------- prune
def _bypass(block: torch.nn.Module):
    """A forward hook making ``block`` the identity on its residual stream (its output replaced by its input)."""
    def hook(module, args, kwargs, out):
        x = args[0] if args else kwargs["hidden_states"]
        return x if isinstance(out, torch.Tensor) else (x, *out[1:])
    return block.register_forward_hook(hook, with_kwargs=True)


def _probes(model_type: str, path: Path):
    from depthlab.analysis.evaluate.image_scoring import answer_inputs
    from depthlab.data.shapes import shapes_items
    from depthlab.hf.processors import wrapper_processor

    if refused(model_type, "vision"):
        return None
    inputs, _ = answer_inputs(wrapper_processor(path, WRAPPERS[model_type].expand), shapes_items(1, seed=5)[0],
                              model_type)
    return inputs


@torch.no_grad()
def _logits(model, inputs):
    out = [text_forward(model)(IDS)]
    if inputs is not None:
        out.append(model(**inputs, use_cache=False).logits)
    return out


def _tensors(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("model_type, tower", HEAVY)
def test_prune_each_tower_both_engines_reloads_and_generates(model_type, tower, saved, tmp_path):
    from transformers import AutoModelForImageTextToText

    from depthlab.prune import PruneOptions, prune_target
    from depthlab.targets.layers import find_layers

    path = saved(model_type)
    if refused(model_type, tower):
        with pytest.raises(DepthlabError, match=f"vision tower of {WRAPPERS[model_type].name}"):
            prune_target(str(path), PruneOptions(**PRUNE, tower=tower), tmp_path / "x")
        assert not (tmp_path / "x").exists()
        return
    reports = {s: prune_target(str(path), PruneOptions(**PRUNE, tower=tower, stream=s), tmp_path / str(s))
               for s in (False, True)}
    removed = reports[False]["removed_blocks"]
    assert reports[True]["removed_blocks"] == removed and len(removed) == 1
    memory, streamed = _tensors(tmp_path / "False"), _tensors(tmp_path / "True")
    assert memory.keys() == streamed.keys() and all(torch.equal(memory[k], streamed[k]) for k in memory)
    original = AutoModelForImageTextToText.from_pretrained(str(path)).eval()
    inputs = _probes(model_type, path)
    hooks = [_bypass(find_layers(original, tower)[b - 1]) for b in removed]
    expected = _logits(original, inputs)
    for h in hooks:
        h.remove()
    loaded = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "True")).eval()  # = the in-memory export
    assert len(find_layers(loaded, tower)) == len(find_layers(original, tower)) - 1
    for got, want in zip(_logits(loaded, inputs), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    exports = [report["export"] for report in reports.values()]
    if WRAPPERS[model_type].refused.get("generate"):
        assert all(e["generate_refused"] and e["generated_tokens"] is None for e in exports)
        return
    for export in exports:
        assert export["generate_cache_matches_no_cache"] is True
        assert [len(v) for v in export["generated_tokens"].values()] == [4, 4]  # text, image + text
    with torch.no_grad():
        gen = loaded.generate(**inputs, max_new_tokens=1, do_sample=False, pad_token_id=0)
    assert gen[0, -1] == expected[1][0, -1].argmax()


# ---------------------------------------------------------------------------------------------- LNS, monitor
class _Scaled(torch.nn.Module):
    """The norm followed by an explicit multiply: LNS written out (test-only reference)."""

    def __init__(self, norm: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x):
        return self.norm(x) * self.scale


@pytest.mark.parametrize("model_type", TYPES)
def test_lns_and_monitor_on_the_language_tower(model_type):
    from depthlab.analysis.monitor import DepthMonitor
    from depthlab.hf.families import get_path
    from depthlab.hf.lns import apply_layernorm_scaling, fold_layernorm_scaling
    from depthlab.hf.tiny import tiny_wrapper

    model, _ = tiny_wrapper(model_type)
    fam = tower_family(model.config, "language")
    ref = copy.deepcopy(model)
    for l, block in enumerate(get_path(ref, fam.layers), start=1):
        for name in fam.pre_norms:
            setattr(block, name, _Scaled(getattr(block, name), 1 / math.sqrt(l)))
    vision = get_path(model, WRAPPERS[model_type].vision.layers)
    vanilla = _logits(model, None)[0]
    apply_layernorm_scaling(model)
    assert not any(m._forward_hooks for m in vision.modules())  # the vision tower is never scaled
    scaled, want = _logits(model, None)[0], _logits(ref, None)[0]
    torch.testing.assert_close(scaled, want, atol=1e-5, rtol=1e-5)
    assert (scaled - vanilla).abs().max() > 1e-3
    torch.testing.assert_close(_logits(fold_layernorm_scaling(model), None)[0], scaled, atol=1e-5, rtol=1e-5)
    with pytest.raises(DepthlabError, match="tower"):
        tower_family(model.config, "vision", "lns")
    monitor = DepthMonitor(model, torch.cat([IDS, IDS[:, :1]], dim=1), every=1, removal=True)
    assert monitor.n_layers == 4
    series = monitor.probe()
    assert len(series["layer_angular"]) == 4 and all(math.isfinite(v) for v in series["layer_angular"])
