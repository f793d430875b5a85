"""An adversarial re-run of issue 49's attack on the image-text wrappers (both towers) and the inferred-layout path
(decoder families outside the table): tiny random checkpoints saved with ``save_pretrained``, then damaged, each
given to the ``depthlab`` command in a real interpreter as a new user would.

    python benchmarks/attack_wrappers_inferred.py --out benchmarks/results        # every case; the committed result
    python benchmarks/attack_wrappers_inferred.py --only llava-,arcee-kill9       # the cases whose name starts so

Each case is (name, model directory, damage, command line, what is promised). The promise is one of

- **refuse**: exit 2, one line on stderr starting ``depthlab COMMAND: error:`` (holding ``needle`` when given), no
  traceback, nothing on stdout (no work logged before the refusal), and nothing written under ``--out``;
- **ok**: exit 0 and the output written (a valid input or a damage the command need not care about);
- **exact**: ``prune`` exits 0 and its export, reloaded in plain transformers, gives the logits of the original with
  the removed blocks passing their input on (forward hooks, not depthlab's own check), or it is refused in one line
  with nothing written;
- **agree**: ``diagnose`` in both engines exits 0 with reports whose numbers agree (an input transformers itself
  reads one defined way);
- **kill9:FIELD**: a streamed run killed (SIGKILL) mid-pass, config.json's FIELD edited, the rerun's report equal to a
  clean run's on the edited config (no layer resumed).

A case *behaves* when what happened is what was promised. Writes ``attack_wrappers_inferred_cpu.json``
(bench_out.result_path: ``--out``): every case with its promise, exit code, stderr's last line, seconds, and the
counts, the machine and the command. A shared 2-core machine: the seconds are noisy and only say what a case cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_out import OUT_HELP, result_path  # noqa: E402 - a sibling module
from families_stream import machine, max_diff  # noqa: E402 - a sibling module

#: The tiny models every case starts from: name -> (builder, its argument, shards).
BASES = {"llava": ("wrapper", "llava", None), "llava_sh": ("wrapper", "llava", "40KB"),
         "qwen3_vl": ("wrapper", "qwen3_vl", None), "gemma3": ("wrapper", "gemma3", None),
         "llama4": ("wrapper", "llama4", None),
         "afmoe": ("decoder", "afmoe", None), "apertus": ("decoder", "apertus", None),
         "arcee": ("decoder", "arcee", None), "arcee_sh": ("decoder", "arcee", "40KB")}

DIAG = ["--tokens", "64", "--seq-len", "16", "--batch-size", "2", "--no-jacobian", "--no-joint-check", "--no-swap",
        "--no-progress", "--device", "cpu"]
PRUNE = ["--tokens", "64", "--seq-len", "16", "--batch-size", "2", "--no-progress", "--device", "cpu",
         "--latency-tokens", "2"]
VISION = ["--tower", "vision", "--images", "3"]


# ---------------------------------------------------------------------------------------------- the damage
def _weights(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def _edit_tensors(path: Path, edit: Callable[[dict], None]) -> None:
    """Every safetensors file of ``path`` read, ``edit`` applied to the union of their tensors, written back as one
    file (the index, if any, removed): a checkpoint as a user's own script would save it."""
    from safetensors.torch import load_file, save_file

    tensors: dict = {}
    for f in _weights(path):
        tensors.update(load_file(str(f)))
        f.unlink()
    (path / "model.safetensors.index.json").unlink(missing_ok=True)
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _key(tensors: dict, pattern: str) -> str:
    return next(k for k in sorted(tensors) if re.search(pattern, k))


def drop(pattern: str) -> Callable[[Path], None]:
    return lambda p: _edit_tensors(p, lambda t: t.pop(_key(t, pattern)))


def extra(pattern: str, new: str) -> Callable[[Path], None]:
    """A copy of the first tensor matching ``pattern`` stored again under ``new`` (``{}`` = the matched key)."""
    def edit(t: dict) -> None:
        k = _key(t, pattern)
        t[new.format(k) if "{}" in new else re.sub(pattern, new, k)] = t[k].clone()
    return lambda p: _edit_tensors(p, edit)


def reshape(pattern: str) -> Callable[[Path], None]:
    def edit(t: dict) -> None:
        k = _key(t, pattern)
        t[k] = t[k][:-1].clone()
    return lambda p: _edit_tensors(p, edit)


def nan(pattern: str) -> Callable[[Path], None]:
    def edit(t: dict) -> None:
        k = _key(t, pattern)
        t[k] = t[k].clone()
        t[k].view(-1)[0] = float("nan")
    return lambda p: _edit_tensors(p, edit)


def config(edit: Callable[[dict], Any]) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        c = json.loads((p / "config.json").read_text())
        edit(c)
        (p / "config.json").write_text(json.dumps(c, indent=1))
    return apply


def truncate(p: Path) -> None:
    f = _weights(p)[-1]
    f.write_bytes(f.read_bytes()[:-100])


def swap_weights(other: str) -> Callable[[Path], None]:
    """The weights (and index) replaced by those of base ``other``, config.json kept."""
    def apply(p: Path) -> None:
        for f in [*_weights(p), p / "model.safetensors.index.json"]:
            f.unlink(missing_ok=True)
        for f in _weights(p.parent.parent / "bases" / other):
            shutil.copy(f, p / f.name)
    return apply


def swap_config(other: str) -> Callable[[Path], None]:
    return lambda p: shutil.copy(p.parent.parent / "bases" / other / "config.json", p / "config.json")


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """config.json's ``a.b`` set to ``value`` (None: removed)."""
    def edit(c: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            c = c[p]
        if value is None:
            c.pop(last, None)
        else:
            c[last] = value
    return edit


def _promote_text(c: dict) -> None:
    """A wrapper's config.json made its text decoder's (its weights stay the wrapper's)."""
    text = c.pop("text_config")
    c.clear()
    c.update(text)


def _plain_decoder(t: dict) -> None:
    """A wrapper's tensors made a plain decoder's (the vision tower and projector gone, the text keys unprefixed)."""
    for k in list(t):
        v = t.pop(k)
        if k.startswith("language_model."):
            t[k[len("language_model."):]] = v


# ---------------------------------------------------------------------------------------------- the cases
D, P = ["diagnose"], ["prune"]
S, M = ["--stream"], ["--no-stream"]
LV = r"vision_tower\.encoder\.layers\.1\.mlp\.fc1\.weight"
QV = r"visual\.blocks\.1\.mlp\.linear_fc1\.weight"
L2 = r"layers\.2\.mlp\.down_proj\.weight"

#: name -> (base, damage, argv after the command's own flags, promise, needle). ``{m}`` is the model directory,
#: ``{w}`` the workspace; a promise "refuse" / "ok" / "any" (either one, cleanly) / "exact" / "agree" / "kill9:FIELD".
CASES: dict[str, tuple[str, Callable[[Path], None] | None, list[str], str, str]] = {
    # the image-text wrappers: LLaVA (legacy layout, untied head), both towers, both engines
    "llava-ok-diag-lang-stream": ("llava", None, D + S, "ok", ""),
    "llava-ok-diag-vision-stream": ("llava", None, D + S + VISION, "ok", ""),
    "llava-ok-prune-vision-memory": ("llava", None, P + M + VISION + ["--remove", "1"], "ok", ""),
    "llava-ok-prune-lang-stream": ("llava", None, P + S + ["--remove", "1"], "ok", ""),
    "llava-vision-tensor-missing-diag-lang-stream": ("llava", drop(LV), D + S, "refuse", "fc1"),
    "llava-vision-tensor-missing-diag-lang-memory": ("llava", drop(LV), D + M, "refuse", "fc1"),
    "llava-vision-tensor-missing-prune-vision-stream": ("llava", drop(LV), P + S + VISION + ["--remove", "1"],
                                                        "refuse", "fc1"),
    "llava-projector-missing-diag-lang-stream": ("llava", drop(r"projector\.linear_2\.weight"), D + S, "refuse",
                                                 "linear_2"),
    "llava-projector-missing-prune-lang-memory": ("llava", drop(r"projector\.linear_2\.weight"),
                                                  P + M + ["--remove", "1"], "refuse", "linear_2"),
    "llava-head-missing-diag-lang-stream": ("llava", drop(r"lm_head"), D + S, "refuse", "lm_head"),
    "llava-head-missing-prune-lang-stream": ("llava", drop(r"lm_head"), P + S + ["--remove", "1"], "refuse",
                                             "lm_head"),
    "llava-head-missing-diag-vision-memory": ("llava", drop(r"lm_head"), D + M + VISION, "refuse", "lm_head"),
    "llava-vision-layer-extra-diag-vision-stream": ("llava", extra(r"encoder\.layers\.2\.", "encoder.layers.3."),
                                                    D + S + VISION, "refuse", ""),
    "llava-vision-layer-extra-diag-lang-memory": ("llava", extra(r"encoder\.layers\.2\.", "encoder.layers.3."),
                                                  D + M, "refuse", ""),
    "llava-junk-tensor-prune-lang-stream": ("llava", extra(r"projector\.linear_1\.bias", "junk.{}"),
                                            P + S + ["--remove", "1"], "refuse", "junk"),
    "llava-vision-shape-diag-vision-stream": ("llava", reshape(LV), D + S + VISION, "refuse", "fc1"),
    "llava-vision-shape-diag-lang-stream": ("llava", reshape(LV), D + S, "refuse", "fc1"),
    "llava-projector-shape-prune-vision-stream": ("llava", reshape(r"projector\.linear_1\.weight"),
                                                  P + S + VISION + ["--remove", "1"], "refuse", "linear_1"),
    "llava-vision-config-fewer-diag-vision-stream": ("llava", config(_set("vision_config.num_hidden_layers", 2)),
                                                     D + S + VISION, "refuse", ""),
    "llava-vision-config-fewer-diag-vision-memory": ("llava", config(_set("vision_config.num_hidden_layers", 2)),
                                                     D + M + VISION, "refuse", ""),
    "llava-vision-config-more-diag-vision-stream": ("llava", config(_set("vision_config.num_hidden_layers", 4)),
                                                    D + S + VISION, "refuse", ""),
    "llava-vision-config-more-prune-vision-memory": ("llava", config(_set("vision_config.num_hidden_layers", 4)),
                                                     P + M + VISION + ["--remove", "1"], "refuse", ""),
    "llava-text-config-fewer-diag-lang-stream": ("llava", config(_set("text_config.num_hidden_layers", 3)), D + S,
                                                 "refuse", "3 layers"),
    "llava-text-config-fewer-prune-vision-stream": ("llava", config(_set("text_config.num_hidden_layers", 3)),
                                                    P + S + VISION + ["--remove", "1"], "refuse", "3 layers"),
    "llava-text-config-more-diag-lang-memory": ("llava", config(_set("text_config.num_hidden_layers", 5)), D + M,
                                                "refuse", "lack"),
    "llava-nan-vision-diag-lang-stream": ("llava", nan(LV), D + S, "refuse", "NaN"),
    "llava-nan-vision-diag-vision-memory": ("llava", nan(LV), D + M + VISION, "refuse", "NaN"),
    "llava-nan-projector-prune-vision-stream": ("llava", nan(r"projector\.linear_1\.weight"),
                                                P + S + VISION + ["--remove", "1"], "refuse", "NaN"),
    "llava-tower-unknown": ("llava", None, D + ["--tower", "visoin"], "refuse", "visoin"),
    "llava-tower-empty-prune": ("llava", None, P + ["--tower", "", "--remove", "1"], "refuse", "--tower"),
    "llava-no-text-config": ("llava", config(_set("text_config", None)), D + S, "refuse", ""),
    "llava-no-vision-config": ("llava", config(_set("vision_config", None)), D + S + VISION, "refuse", ""),
    "llava-text-type-unknown": ("llava", config(_set("text_config.model_type", "nosuch")), D + S, "refuse",
                                "nosuch"),
    "llava-text-type-other-family": ("llava", config(_set("text_config.model_type", "arcee")), D + S, "refuse", ""),
    "llava-feature-layer-beyond": ("llava", config(_set("vision_feature_layer", 7)), D + S + VISION, "refuse",
                                   "vision_feature_layer"),
    "llava-image-token-beyond-vocab": ("llava", config(_set("image_token_index", 5000)), D + M + VISION, "refuse",
                                       "image_token_index=5000"),
    "llava-image-token-negative-prune-lang": ("llava", config(_set("image_token_index", -1)),
                                              P + S + ["--remove", "1"], "refuse", "image_token_index=-1"),
    "llava-feature-layer-list-beyond": ("llava", config(_set("vision_feature_layer", [-2, 9])), P + M + VISION
                                        + ["--remove", "1"], "refuse", "vision_feature_layer"),
    "llava-truncated-shard-diag-lang-stream": ("llava_sh", truncate, D + S, "refuse", "safetensors"),
    "llava-truncated-shard-diag-vision-memory": ("llava_sh", truncate, D + M + VISION, "refuse", "safetensors"),
    "llava-out-proc": ("llava", None, D + S + VISION + ["--out", "/proc/depthlab-x"], "refuse", "/proc"),
    "llava-out-is-file": ("llava", None, P + S + VISION + ["--remove", "1", "--out", "{w}/afile"], "refuse",
                          "afile"),
    "llava-config-conflict-tuned-lens": ("llava", None, D + VISION + ["--config", "{w}/stream_tuned.yaml"],
                                         "refuse", "--tuned-lens"),
    "llava-config-tower-unknown": ("llava", None, D + ["--config", "{w}/tower.yaml"], "refuse", "eyes"),
    "llava-prune-vision-every-block": ("llava", None, P + S + VISION + ["--remove", "3"], "refuse", "remove"),
    "llava-prune-vision-block-beyond": ("llava", None, P + M + VISION + ["--blocks", "4"], "refuse", "4"),
    "llava-prune-vision-unit-attn-stream": ("llava", None, P + S + VISION + ["--unit", "attn", "--remove", "1"],
                                            "any", ""),
    "llava-weights-plain-decoder": ("llava", lambda p: _edit_tensors(p, _plain_decoder), D + S, "refuse", ""),
    "llava-weights-plain-decoder-memory": ("llava", lambda p: _edit_tensors(p, _plain_decoder), D + M, "refuse", ""),
    "llava-config-of-its-text-decoder-stream": ("llava", config(_promote_text), D + S, "refuse", ""),
    "llava-config-of-its-text-decoder-memory": ("llava", config(_promote_text), P + M + ["--remove", "1"],
                                                "refuse", ""),
    "llava-kill9-edit-text-config": ("llava", None, D + S, "kill9:text_config.rope_theta", ""),
    "llava-kill9-edit-vision-config": ("llava", None, D + S + VISION, "kill9:vision_config.layer_norm_eps", ""),
    # Qwen3-VL: the vision tower's count under "depth", deepstack
    "qwen3vl-ok-diag-vision-stream": ("qwen3_vl", None, D + S + VISION, "ok", ""),
    "qwen3vl-depth-fewer": ("qwen3_vl", config(_set("vision_config.depth", 2)), D + S + VISION, "refuse", ""),
    "qwen3vl-depth-more-memory": ("qwen3_vl", config(_set("vision_config.depth", 4)), D + M, "refuse", ""),
    "qwen3vl-deepstack-beyond": ("qwen3_vl", config(_set("vision_config.deepstack_visual_indexes", [0, 5])),
                                 D + S + VISION, "refuse", "deepstack"),
    "qwen3vl-deepstack-beyond-memory": ("qwen3_vl", config(_set("vision_config.deepstack_visual_indexes", [0, 5])),
                                        D + M, "refuse", "deepstack"),
    "qwen3vl-prune-deepstack-block": ("qwen3_vl", None, P + S + VISION + ["--blocks", "1"], "refuse", "deepstack"),
    "qwen3vl-deepstack-merger-missing": ("qwen3_vl", drop(r"deepstack_merger_list\.1\.linear_fc1\.weight"), D + S,
                                         "refuse", "deepstack_merger"),
    "qwen3vl-nan-merger": ("qwen3_vl", nan(r"visual\.merger\.linear_fc1\.weight"), D + S, "refuse", "NaN"),
    "qwen3vl-head-missing": ("qwen3_vl", drop(r"lm_head"), D + S, "refuse", "lm_head"),
    "qwen3vl-vision-shape": ("qwen3_vl", reshape(QV), P + S + ["--remove", "1"], "refuse", "linear_fc1"),
    "qwen3vl-text-config-fewer": ("qwen3_vl", config(_set("text_config.num_hidden_layers", 3)),
                                  P + S + ["--remove", "1"], "refuse", "3 layers"),
    "qwen3vl-depth-huge": ("qwen3_vl", config(_set("vision_config.depth", 10 ** 9)), D + S + VISION, "refuse",
                           "depth=1000000000"),
    "llava-vision-layers-zero": ("llava", config(_set("vision_config.num_hidden_layers", 0)), D + M + VISION,
                                 "refuse", "num_hidden_layers=0"),
    # Llama 4: its vision tower refused by the registry (its forward raises in this transformers)
    "llama4-vision-refused": ("llama4", None, D + S + VISION, "refuse", "Llama 4"),
    "llama4-ok-diag-lang-memory": ("llama4", None, D + M, "ok", ""),
    # Gemma 3: a tied head, the legacy layout
    "gemma3-ok-prune-lang-stream": ("gemma3", None, P + S + ["--remove", "1"], "ok", ""),
    "gemma3-untied-without-head": ("gemma3", config(lambda c: (_set("tie_word_embeddings", False)(c),
                                                               _set("text_config.tie_word_embeddings", False)(c))),
                                   D + S, "refuse", "lm_head"),
    "gemma3-vision-head-missing": ("gemma3", drop(r"vision_tower\.head\.probe"), D + S, "refuse", "probe"),
    # the inferred layout: Arcee, AFMoE, Apertus (not rows of the table)
    "arcee-ok-diag-stream": ("arcee", None, D + S, "ok", ""),
    "arcee-ok-prune-memory": ("arcee", None, P + M + ["--remove", "1"], "ok", ""),
    "arcee-head-missing-diag-stream": ("arcee", drop(r"lm_head"), D + S, "refuse", "lm_head"),
    "arcee-head-missing-prune-memory": ("arcee", drop(r"lm_head"), P + M + ["--remove", "1"], "refuse", "lm_head"),
    "arcee-layer-tensor-missing": ("arcee", drop(L2), D + S, "refuse", "down_proj"),
    "arcee-layer-extra-prune-stream": ("arcee", extra(r"layers\.3\.", "layers.4."), P + S + ["--remove", "1"],
                                       "refuse", "[4]"),
    "arcee-config-fewer-stream": ("arcee", config(_set("num_hidden_layers", 3)), D + S, "refuse", "3 layers"),
    "arcee-config-more-memory": ("arcee", config(_set("num_hidden_layers", 5)), D + M, "refuse", "5 layers"),
    "arcee-shape": ("arcee", reshape(L2), D + S, "refuse", "down_proj"),
    "arcee-nan-prune-stream": ("arcee", nan(L2), P + S + ["--remove", "1"], "refuse", "NaN"),
    "arcee-truncated-shard": ("arcee_sh", truncate, D + S, "refuse", "safetensors"),
    "arcee-tower-vision": ("arcee", None, D + ["--tower", "vision"], "refuse", "text-only"),
    "arcee-weights-of-apertus": ("arcee", swap_weights("apertus"), D + S, "refuse", ""),
    # tied in config.json, a head stored: transformers uses the stored head; both engines must agree with it
    "arcee-tied-config-untied-head": ("arcee", config(_set("tie_word_embeddings", True)), D, "agree", ""),
    "arcee-out-proc": ("arcee", None, P + S + ["--remove", "1", "--out", "/proc/depthlab-x"], "refuse", "/proc"),
    "arcee-config-conflict-heal-attn": ("arcee", None, P + ["--config", "{w}/heal_attn.json"], "refuse",
                                        "in memory"),
    "arcee-kill9-edit-config": ("arcee", None, D + S, "kill9:rope_theta", ""),
    "afmoe-ok-prune-stream": ("afmoe", None, P + S + ["--remove", "1"], "ok", ""),
    # blocks whose position the config encodes (afmoe: num_dense_layers, a global-attention layer every 4th):
    # either an export equal to the original with them skipped, or a refusal
    "afmoe-prune-dense-block-stream": ("afmoe", None, P + S + ["--blocks", "1"], "exact", ""),
    "afmoe-prune-dense-block-memory": ("afmoe", None, P + M + ["--blocks", "1"], "exact", ""),
    "afmoe-prune-global-block-stream": ("afmoe", None, P + S + ["--blocks", "4"], "exact", ""),
    "apertus-prune-block-2-stream": ("apertus", None, P + S + ["--blocks", "2"], "exact", ""),
    "arcee-prune-block-3-memory": ("arcee", None, P + M + ["--blocks", "3"], "exact", ""),
    "llava-prune-lang-block-2-stream": ("llava", None, P + S + ["--blocks", "2"], "exact", ""),
    "qwen3vl-prune-lang-block-4-memory": ("qwen3_vl", None, P + M + ["--blocks", "4"], "exact", ""),
    "afmoe-expert-missing": ("afmoe", drop(r"layers\.2\.mlp\.experts\.1\.up_proj"), D + S, "refuse", "experts"),
    "afmoe-layer-types-long": ("afmoe", config(_set("layer_types", ["sliding_attention"] * 5)), D + S, "refuse",
                               "layer_types"),
    "afmoe-dense-layers-beyond": ("afmoe", config(_set("num_dense_layers", 9)), D + S, "refuse", ""),
    "afmoe-nan-router": ("afmoe", nan(r"layers\.2\.mlp\.router\.gate\.weight"), D + M, "refuse", "NaN"),
    "apertus-ok-prune-stream": ("apertus", None, P + S + ["--remove", "1"], "ok", ""),
    "apertus-act-param-missing": ("apertus", drop(r"layers\.1\.mlp\.act_fn\.alpha_p"), D + S, "refuse", "alpha_p"),
    "apertus-nan-act-param": ("apertus", nan(r"layers\.1\.mlp\.act_fn\.beta"), P + S + ["--remove", "1"], "refuse",
                              "NaN"),
    "apertus-norm-shape": ("apertus", reshape(r"layers\.1\.feedforward_layernorm"), D + M, "refuse",
                           "feedforward_layernorm"),
    "decoder-model-type-unknown": ("arcee", config(_set("model_type", "nosuchmodel")), D + S, "refuse",
                                   "nosuchmodel"),
    "decoder-layers-zero": ("arcee", config(_set("num_hidden_layers", 0)), P + M + ["--remove", "1"], "refuse",
                            "num_hidden_layers=0"),
    "apertus-config-of-arcee": ("apertus", swap_config("arcee"), D + S, "refuse", ""),
}


# ---------------------------------------------------------------------------------------------- the workspace
def build(ws: Path) -> None:
    """The tiny models of :data:`BASES` under ``ws/bases`` and the files some cases name."""
    from depthlab.hf.tiny import save_tiny, save_tiny_wrapper

    for name, (kind, model_type, shards) in BASES.items():
        out = ws / "bases" / name
        if not out.exists():
            (save_tiny_wrapper if kind == "wrapper" else save_tiny)(model_type, out, max_shard_size=shards)
    (ws / "stream_tuned.yaml").write_text("stream: true\ntuned_lens: true\n")
    (ws / "tower.yaml").write_text("tower: eyes\n")
    (ws / "heal_attn.json").write_text(json.dumps({"stream": True, "unit": "attn", "remove": 1, "heal_steps": 2}))
    (ws / "afile").write_text("not a directory")


def _model(ws: Path, name: str, base: str, damage: Callable[[Path], None] | None) -> Path:
    if damage is None:
        return ws / "bases" / base
    path = ws / "models" / name
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(ws / "bases" / base, path)
    damage(path)
    return path


def _argv(ws: Path, model: Path, out: Path, argv: list[str]) -> list[str]:
    common = DIAG if argv[0] == "diagnose" else PRUNE
    args = [a.replace("{w}", str(ws)) for a in argv[1:]]
    tail = [] if "--out" in args else ["--out", str(out)]
    return [argv[0], str(model), *args, *common, *tail]


def _run(ws: Path, argv: list[str], timeout: float = 600) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "DEPTHLAB_CACHE": str(ws / "cache")}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "depthlab", *argv], capture_output=True, text=True, env=env,
                              cwd=ws, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", "timed out"
    return {"rc": rc, "stdout": out, "stderr": err, "seconds": round(time.perf_counter() - start, 1)}


def _written(out: Path) -> list[str]:
    """What a command left under --out or as a hidden sibling of it (its resume state included)."""
    if not out.parent.exists():
        return []
    return sorted(p.name for p in out.parent.iterdir() if p.name == out.name or p.name.startswith(f".{out.name}"))


def judge(promise: str, needle: str, cmd: str, res: dict[str, Any], written: list[str]) -> tuple[bool, str]:
    """(whether the outcome is what ``promise`` says, why not)."""
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    refused = (res["rc"] == 2 and len(lines) == 1 and lines[0].startswith(f"depthlab {cmd}: error:")
               and "Traceback" not in res["stderr"])
    if "Traceback" in res["stderr"] + res["stdout"]:
        return False, "traceback"
    if promise in ("refuse", "any") and refused:
        if needle and needle not in lines[0]:
            return False, f"refused, but the line does not name {needle!r}"
        if res["stdout"].strip():
            return False, "refused after work (stdout not empty)"
        if written:
            return False, f"refused, but left {written}"
        return True, ""
    if promise in ("ok", "any") and res["rc"] == 0:
        return (True, "") if written else (False, "exit 0 without an output")
    if res["rc"] == 0:
        return False, "a result written from a damaged input" if written else "exit 0 without refusing"
    return False, f"exit {res['rc']}, {len(lines)} stderr lines"


def kill9(ws: Path, name: str, base: str, argv: list[str], field: str) -> dict[str, Any]:
    """A streamed diagnose killed (SIGKILL) once its resume state holds a layer, config.json's ``field`` edited, the
    command run again: it must start over and give the numbers of a clean run on the edited config."""
    from depthlab.targets.stream.resume import state_dir

    model, clean = _model(ws, name, base, lambda p: None), _model(ws, name + "-clean", base, lambda p: None)
    out, ref_out = ws / "out" / name, ws / "out" / (name + "-clean")

    def args(path: Path, where: Path) -> list[str]:
        a = _argv(ws, path, where, argv)
        a[a.index("--tokens") + 1] = "4096"  # long enough to be killed mid-pass
        return a

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "DEPTHLAB_CACHE": str(ws / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *args(model, out)], cwd=ws, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, killed = time.time() + 300, False
    while time.time() < deadline and proc.poll() is None:
        if any(state_dir(out).rglob("*.pt")):
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.02)
    proc.wait()
    if not killed:
        return {"promise": f"kill9:{field}", "behaved": None, "why": "finished before it could be killed"}
    for path in (model, clean):
        config(lambda c: _set(field, _bump(c, field))(c))(path)
    return _compare_kill9(field, _run(ws, args(model, out)), _run(ws, args(clean, ref_out)), out, ref_out)


def agree(ws: Path, model: Path, out: Path, argv: list[str]) -> dict[str, Any]:
    """``argv`` (a diagnose) in both engines: each exits 0, and their reports' numbers agree."""
    outs = [out.with_name(out.name + "-stream"), out.with_name(out.name + "-memory")]
    runs = [_run(ws, _argv(ws, model, o, [*argv, flag])) for o, flag in zip(outs, ("--stream", "--no-stream"))]
    row = {"promise": "agree", "rc": [r["rc"] for r in runs], "seconds": sum(r["seconds"] for r in runs)}
    if any(r["rc"] != 0 for r in runs):
        return {**row, "behaved": False, "why": "an engine did not finish",
                "stderr_last": " / ".join(r["stderr"].strip().splitlines()[-1:][0] if r["stderr"].strip() else ""
                                          for r in runs)}
    diff = max_diff(*(json.loads((o / "report.json").read_text()) for o in outs))
    return {**row, "behaved": diff <= 1e-5, "max_diff_between_engines": diff,
            "why": "" if diff <= 1e-5 else f"the engines differ by {diff:.3g}"}


def exact(ws: Path, model: Path, out: Path, argv: list[str]) -> dict[str, Any]:
    """``argv`` (a prune of the language tower) exits 0, and its export, loaded in plain transformers, gives the logits
    of the original with the removed blocks passing their input on (forward hooks: independent of depthlab's own
    check) on a text batch."""
    res = _run(ws, _argv(ws, model, out, argv))
    row = {"promise": "exact", "rc": res["rc"], "seconds": res["seconds"],
           "stderr_last": (res["stderr"].strip().splitlines() or [""])[-1].replace(str(ws), "WS")[:400]}
    if res["rc"] != 0:  # a refusal is kept too: nothing written, one line
        behaved, why = judge("refuse", "", argv[0], {**res, "stdout": ""}, _written(out))
        return {**row, "behaved": behaved, "why": why or "refused after the work (the export's own check)"}
    removed = json.loads((out / "prune.json").read_text())["removed_blocks"]
    diff = export_diff(model, out, removed)
    ok = diff <= 1e-4
    return {**row, "behaved": ok, "removed_blocks": removed, "max_abs_logit_diff": diff,
            "why": "" if ok else f"the export's logits differ from the original with {removed} skipped by {diff:.3g}"}


def export_diff(original: Path, export: Path, removed: list[int]) -> float:
    """max |delta logit| between the export and the original whose 1-based language blocks ``removed`` hand their
    input on, relative to max(1, max |logit|)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from depthlab.hf.wrappers import find_tower, text_forward, wrapper_of

    def load(path: Path) -> Any:
        cfg = json.loads((path / "config.json").read_text())
        auto = AutoModelForImageTextToText if wrapper_of(cfg) is not None else AutoModelForCausalLM
        return auto.from_pretrained(str(path), dtype=torch.float32).eval()

    def skip(_m: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        h = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs["hidden_states"]
        return (h, *output[1:]) if isinstance(output, tuple) else h

    ref, got = load(original), load(export)
    blocks = find_tower(ref, "language")
    for b in removed:
        blocks[b - 1].register_forward_hook(skip, with_kwargs=True)
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = text_forward(ref)(ids).float(), text_forward(got)(ids).float()
    return float((a - b).abs().max()) / max(1.0, float(a.abs().max())) if a.shape == b.shape else float("inf")


def _bump(c: dict, field: str) -> Any:
    for p in field.split("."):
        c = c.get(p, {}) if isinstance(c, dict) else {}
    return (c if isinstance(c, (int, float)) and c else 1e4) * 7


def _compare_kill9(field: str, res: dict, ref: dict, out: Path, clean: Path) -> dict[str, Any]:
    row = {"promise": f"kill9:{field}", "rc": res["rc"], "seconds": res["seconds"],
           "stderr": res["stderr"].strip().splitlines()[-1:]}
    if res["rc"] != 0 or ref["rc"] != 0:
        return {**row, "behaved": False, "why": f"rerun exit {res['rc']}, clean run exit {ref['rc']}"}
    a, b = (json.loads((p / "report.json").read_text()) for p in (out, clean))
    diff, resumed = max_diff(a, b), a.get("engine", {}).get("resumed")
    ok = diff <= 1e-5 and not resumed
    return {**row, "behaved": ok, "max_diff_to_clean_run": diff, "resumed": resumed,
            "why": "" if ok else f"resumed {resumed}, max |delta| to a clean run {diff:.3g}"}


# ---------------------------------------------------------------------------------------------- the run
def run_case(ws: Path, name: str) -> dict[str, Any]:
    base, damage, argv, promise, needle = CASES[name]
    if promise.startswith("kill9:"):
        return {"name": name, "command": argv[0], **kill9(ws, name, base, argv, promise.split(":", 1)[1])}
    model = _model(ws, name, base, damage)
    out = ws / "out" / name
    if promise in ("agree", "exact"):
        check = agree if promise == "agree" else exact
        return {"name": name, "command": " ".join(argv), **check(ws, model, out, argv)}
    full = _argv(ws, model, out, argv)
    target = Path(full[full.index("--out") + 1])
    res = _run(ws, full)
    written = _written(target) if target.parent != ws else []  # {w}/afile: the workspace itself
    behaved, why = judge(promise, needle, argv[0], res, written)
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    return {"name": name, "command": " ".join(shlex.quote(a) for a in full).replace(str(ws), "WS"),
            "promise": promise, "needle": needle, "rc": res["rc"], "seconds": res["seconds"],
            "stderr_last": (lines[-1] if lines else "").replace(str(ws), "WS")[:400], "stderr_lines": len(lines),
            "written": written, "behaved": behaved, "why": why}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="run the cases whose name starts with one of these (comma-separated)")
    p.add_argument("--work", help="workspace folder (default: a temporary one, removed)")
    p.add_argument("--out", help=OUT_HELP)
    args = p.parse_args()
    ws = Path(args.work or tempfile.mkdtemp(prefix="attack-")).resolve()
    ws.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ws / "out", ignore_errors=True)  # a report of an earlier run would refuse a rerun's --out
    (ws / "out").mkdir()
    build(ws)
    rows = []
    for name in [n for n in CASES if n.startswith(tuple(args.only.split(",")))]:
        row = run_case(ws, name)
        rows.append(row)
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[row["behaved"]]
        print(f"{mark} {name} ({row.get('seconds', '-')} s) {row.get('why', '')} | {row.get('stderr_last', '')[:160]}",
              flush=True)
    counts = {"cases": len(rows), "behaved": sum(r["behaved"] is True for r in rows),
              "failed": sum(r["behaved"] is False for r in rows), "not_judged": sum(r["behaved"] is None for r in rows)}
    result = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), **machine(),
              "note": "shared 2-core machine (other agents ran tests): seconds are noisy", "counts": counts,
              "cases": rows}
    path = result_path("attack_wrappers_inferred_cpu.json", args.out)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(counts), "->", path)
    if not args.work:
        shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    main()
