"""``prune --unit expert``: both engines remove the same routed experts and write the same checkpoint, which plain
transformers loads with the expert count cut and the logits of the original with those experts masked; REAP removes
the lowest-saliency experts; LoRA heals after it; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch
from tiny_models import hf_dir

from depthlab.analysis.diagnostics import load_target
from depthlab.cli import main
from depthlab.hf.families import known_family
from depthlab.prune import PruneOptions, prune_target
from depthlab.prune.options import HealOptions
from depthlab.targets.stream.open import open_streamed

OPTS = dict(data="builtin", tokens=96, seq_len=32, batch_size=2, progress=False, latency_tokens=2, unit="expert")
FAST = ["--tokens", "96", "--seq-len", "32", "--batch-size", "2", "--no-progress"]
SLOW = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.mark.parametrize("kind, n_layers", [("mixtral", 3), ("qwen2_moe", 3), ("deepseek_v3", 3), ("gpt_oss", 3),
                                            pytest.param("qwen3_moe", 3, marks=SLOW),
                                            pytest.param("olmoe", 3, marks=SLOW),
                                            pytest.param("llama4_text", 3, marks=SLOW),
                                            pytest.param("qwen3_next", 4, marks=SLOW),
                                            pytest.param("qwen3_5_moe_text", 4, marks=SLOW)])
def test_streamed_expert_prune_equals_in_memory_and_reloads_in_transformers(tmp_path, kind, n_layers):
    from transformers import AutoModelForCausalLM

    path = hf_dir(tmp_path, kind, n_layers)
    opts = PruneOptions(**OPTS, remove=1)
    mem = prune_target(load_target(str(path)), opts, tmp_path / "mem")
    streamed = prune_target(open_streamed(str(path)), opts, tmp_path / "streamed")
    assert streamed["removed_experts"] == mem["removed_experts"] and len(mem["removed_experts"]) >= 1
    for b, gone in mem["removed_experts"].items():  # REAP: the lowest saliency of the block goes
        reap = mem["scores"]["blocks"][b]["reap"]
        assert gone == [min(range(len(reap)), key=reap.__getitem__)]
    assert streamed["loss"]["pruned"] == pytest.approx(mem["loss"]["pruned"], abs=1e-5)
    exp = mem["export"]
    assert exp["max_abs_logit_diff"] < 1e-5 and exp["max_abs_logit_diff_vs_removed_in_original"] < 1e-5
    assert exp["generate_cache_matches_no_cache"] and streamed["export"]["generate_cache_matches_no_cache"]
    count = known_family(kind).experts.count
    from transformers import AutoConfig

    original = getattr(AutoConfig.from_pretrained(str(path)), count)  # config.json omits a value left at its default
    a, b = (AutoModelForCausalLM.from_pretrained(str(tmp_path / d)).eval() for d in ("mem", "streamed"))
    assert getattr(a.config, count) == getattr(b.config, count) == original - 1 == mem["experts"]["pruned"]
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(b(input_ids=ids).logits, a(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_lora_heals_after_expert_removal(tmp_path):
    pytest.importorskip("peft")
    path = hf_dir(tmp_path, "qwen2_moe", 2)
    heal = HealOptions(mode="lora", steps=2, batch_size=2, seq_len=32, progress=False)
    rep = prune_target(load_target(str(path)), PruneOptions(**{**OPTS, "method": "frequency"}, remove=1, heal=heal),
                       tmp_path / "out")
    assert rep["heal"]["steps"] == 2 and rep["loss"]["healed"] is not None
    assert rep["export"]["max_abs_logit_diff"] < 1e-5


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


@pytest.mark.parametrize("kind, extra, needles", [
    ("llama", ["--remove", "1"], ("needs an MoE model", "'llama'", "qwen2_moe")),
    ("qwen2_moe", ["--remove", "4"], ("--remove 4", "4 routed experts", "at most 2")),  # all of them
    ("qwen2_moe", ["--remove", "9"], ("--remove 9", "4 routed experts", "at most 2")),  # more than exist
    ("qwen2_moe", ["--fraction", "1"], ("--fraction 1", "every routed expert")),
    ("qwen2_moe", ["--experts", "1:shared"], ("1:shared", "shared expert is never removed")),
    ("qwen2_moe", ["--experts", "1:4"], ("--experts 1:4", "experts 0..3")),
    ("qwen2_moe", ["--experts", "9:0"], ("block 9", "MoE blocks are 1,2")),
    ("qwen2_moe", ["--remove", "1", "--heal", "linear"], ("--heal linear", "--unit expert")),
])
@pytest.mark.parametrize("stream", ["--no-stream", "--stream"])
def test_expert_prune_refuses_bad_input_before_any_work(tmp_path, capsys, kind, extra, needles, stream):
    path = hf_dir(tmp_path, kind, 2)
    out = tmp_path / "out"
    capsys.readouterr()  # what writing the fixture printed (transformers' shard bar)
    _exit_2(["prune", str(path), "--unit", "expert", *extra, stream, "--out", str(out), *FAST], capsys, *needles)
    assert not out.exists()


def _tensors(out):
    from safetensors.torch import load_file

    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_wrapper_language_tower_experts_prune_both_engines_reloads_in_image_text_to_text(tmp_path, capsys):
    """Qwen3.5-MoE's image-text wrapper: REAP removes one routed expert of every language block, in memory and
    streamed alike (the same experts, the same tensors); plain AutoModelForImageTextToText loads the whole wrapper
    with the count cut and gives, on a text and an image-text prompt, the original's logits with those experts
    masked, and generates (cached = uncached). The vision tower is refused in one line, exit 2, nothing written."""
    from transformers import AutoModelForImageTextToText

    from depthlab.hf.tiny import save_tiny_wrapper
    from depthlab.targets.layers import find_layers

    path = save_tiny_wrapper("qwen3_5_moe", tmp_path / "vlm")
    reps = {s: prune_target(str(path), PruneOptions(**OPTS, remove=1, stream=s), tmp_path / str(s)) for s in (False, True)}
    rep = reps[False]
    assert reps[True]["removed_experts"] == rep["removed_experts"]
    assert sorted(rep["removed_experts"]) == ["1", "2", "3", "4"] and rep["experts"] == {**rep["experts"], "pruned": 3}
    assert reps[True]["loss"]["pruned"] == pytest.approx(rep["loss"]["pruned"], abs=1e-5)
    memory, streamed = _tensors(tmp_path / "False"), _tensors(tmp_path / "True")
    assert memory.keys() == streamed.keys() and all(torch.equal(memory[k], streamed[k]) for k in memory)
    for exp in (r["export"] for r in reps.values()):
        assert exp["loaded_with"] == "transformers (AutoModelForImageTextToText)" and exp["max_abs_logit_diff"] < 1e-5
        assert exp["max_abs_logit_diff_vs_removed_in_original"] < 1e-5 and exp["generate_cache_matches_no_cache"]
        assert [len(v) for v in exp["generated_tokens"].values()] == [4, 4]  # text, image + text
    loaded = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "True"))
    assert loaded.config.get_text_config().num_experts == 3
    assert all(layer.mlp.gate.weight.shape[0] == 3 for layer in find_layers(loaded, "language"))
    capsys.readouterr()
    _exit_2(["prune", str(path), "--unit", "expert", "--remove", "1", "--tower", "vision", "--out",
             str(tmp_path / "bad"), *FAST], capsys, "--tower vision")
    assert not (tmp_path / "bad").exists()
