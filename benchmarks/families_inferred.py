"""Every decoder family transformers lists as a causal LM that is not a row of depthlab's table, through the generic
path (the layout inferred from the model itself, :mod:`depthlab.hf.inferred`).

    python benchmarks/families_inferred.py --out benchmarks/results          # every family; the committed result
    python benchmarks/families_inferred.py --families stablelm olmo           # a few, into ~/.cache/depthlab/bench-results

The list is transformers' own ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` less the table's rows (not hand-picked). For each
model type: its config (``AutoConfig.for_model``) made tiny from its own field names (:mod:`depthlab.hf.shrink`,
4 blocks, width 32, vocabulary 300), a random model, norms jittered, saved in shards of 40 KB. Then:

- **refused**: a one-line DepthlabError (``family_of(config, "stream")`` / ``"prune"`` before any weight is read, or
  the streamed engine's agreement check, :mod:`depthlab.targets.stream.agree`);
- **pass**: ``diagnose`` streamed equals in memory (angular matrix, variance, loss, removal Δloss; max |Δ| <= 1e-4),
  and block 2 pruned in memory (``drop_layers`` + ``write_hf``) and shard by shard (``write_pruned_shards``) both
  reload in plain transformers with logits equal to the original's with block 2 passing its input on (max |Δ| <=
  1e-4) and cached ``generate`` equal to uncached;
- **refused** too: an export whose logits or cached generate do not match (prune's own check,
  :func:`depthlab.prune.export.require_exact`, compares the same logits and writes nothing);
- **fail**: anything else (the step and the first line of the error); **no fixture**: no tiny model could be built
  from the shrunk config; **not built**: transformers cannot build a model of its own default config (not counted).

The decoder share: passes over the families built less those refused as not decoder-only (an encoder, an
encoder-decoder, a wrapper of several towers: ``NOT_DECODER``).

Writes ``families_inferred_cpu.json`` (bench_out.result_path: ``--out``): counts, every family's outcome, the
machine, versions and the command. A shared 2-core machine: the seconds are noisy and only say what a family cost.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_out import result_path  # noqa: E402 - a sibling module
from families_stream import machine, max_diff  # noqa: E402 - a sibling module

OPTS = dict(tokens=64, seq_len=16, batch_size=2, jacobian=False, joint_check=False, progress=False)
TOL = 1e-4
#: Refusal lines that say the model is not a decoder-only LM (an encoder, an encoder-decoder, a multi-tower wrapper).
NOT_DECODER = r"an encoder|a wrapper of several towers"
IDS = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))


def candidates() -> list[str]:
    """transformers' causal-LM model types whose config is not a row of the table (GPT-SW3's is GPT-2's), sorted."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from depthlab.hf.families import FAMILIES

    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if CONFIG_MAPPING[t].model_type not in FAMILIES)


def skipping(model: torch.nn.Module, layers_path: str, block: int) -> torch.Tensor:
    """Logits of ``model`` on IDS with block ``block`` (1-based) handing its input on (computed, then discarded)."""
    from depthlab.hf.families import get_path

    layers = get_path(model, layers_path)
    handle = layers[block - 1].register_forward_hook(
        lambda m, a, k, out: type(out)((a[0] if a else k["hidden_states"], *out[1:]))
        if isinstance(out, (tuple, list)) else (a[0] if a else k["hidden_states"]), with_kwargs=True)  # GPT-1: a list
    try:
        with torch.no_grad():
            return model(input_ids=IDS, use_cache=False).logits
    finally:
        handle.remove()


def check_export(out: Path, ref: torch.Tensor) -> str | None:
    """Why the export in ``out`` is wrong (logits, cached generate), or None."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        diff = float((loaded(input_ids=IDS, use_cache=False).logits - ref).abs().max())
    if not diff <= TOL:
        return f"logits differ from skipping the block in the original by {diff:.2e}"
    kw = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    prompt = IDS[:1, :6]
    if not torch.equal(loaded.generate(prompt, use_cache=True, **kw), loaded.generate(prompt, use_cache=False, **kw)):
        return "cached generate differs from uncached"
    return None


def one(model_type: str, tmp: Path) -> dict:
    """The outcome of one family: pass / refused / fail / no fixture, with the step and line."""
    from transformers import AutoConfig

    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.base.errors import DepthlabError, first_line
    from depthlab.hf.families import family_of, family_of_model
    from depthlab.hf.inferred import meta_model, wrapper_reason
    from depthlab.hf.tiny import save_tiny, tiny_model
    from depthlab.prune.export import drop_layers, write_hf
    from depthlab.prune.shards import write_pruned_shards
    from depthlab.targets import load_target

    try:
        default = AutoConfig.for_model(model_type)
        if wrapper_reason(default) is None:
            meta_model(default)
    except Exception as err:  # noqa: BLE001 - transformers cannot build its own default: not counted
        return {"outcome": "not built", "step": "default config", "line": f"{type(err).__name__}: {first_line(err)[:200]}"}
    step = "refusal"
    try:
        for capability in ("stream", "prune"):  # on the family's default config, as a user's config.json would be
            family_of(AutoConfig.for_model(model_type), capability)
        step = "fixture"
        model = tiny_model(model_type).float()
        path = save_tiny(model, tmp / "model", max_shard_size="40KB")
        step = "refusal"
        for capability in ("stream", "prune"):
            family_of(model.config, capability)
        layers = family_of_model(model, "prune").layers
        step = "diagnose"
        diff = max_diff(diagnose(str(path), DiagnoseOptions(**OPTS, stream=True)),
                        diagnose(load_target(str(path)), DiagnoseOptions(**OPTS)))
        if not diff <= TOL:
            return {"outcome": "fail", "step": step, "line": f"streamed differs from in memory by {diff:.2e}"}
        ref = skipping(model, layers, 2)
        step = "prune in memory"
        write_hf(drop_layers(model, [2]), tmp / "memory")
        why = check_export(tmp / "memory", ref)
        step = "prune shard by shard"
        if why is None:
            write_pruned_shards(path, [2], tmp / "shards")
            why = check_export(tmp / "shards", ref)
        if why is None:
            return {"outcome": "pass", "diagnose_max_diff": diff}
        # prune's own export check (prune.export.require_exact) compares the same logits and refuses, writing nothing
        return {"outcome": "refused", "step": f"export check ({step})", "line": why}
    except DepthlabError as err:
        return {"outcome": "refused", "step": step, "line": first_line(err)[:300]}  # one line, whatever the step
    except Exception as err:  # noqa: BLE001 - a family may fail in any way; the sweep records it and goes on
        outcome = "no fixture" if step == "fixture" else "fail"
        return {"outcome": outcome, "step": step, "line": f"{type(err).__name__}: {first_line(err)[:280]}"}


def _timeout(signum, frame):
    raise TimeoutError("over the time limit")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="*", help="model types (default: every candidate)")
    p.add_argument("--limit-s", type=int, default=180, help="seconds one family may take")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _timeout)
    results = {}
    for model_type in args.families or candidates():
        t0 = time.time()
        signal.alarm(args.limit_s)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                results[model_type] = one(model_type, Path(tmp))
        except TimeoutError as err:
            results[model_type] = {"outcome": "fail", "step": "time", "line": str(err)}
        finally:
            signal.alarm(0)
        results[model_type]["seconds"] = round(time.time() - t0, 1)
        print(model_type, results[model_type], flush=True)
    counts = {k: sum(r["outcome"] == k for r in results.values())
              for k in ("pass", "refused", "fail", "no fixture", "not built")}
    not_decoders = sorted(t for t, r in results.items() if r["outcome"] == "refused" and re.search(NOT_DECODER, r["line"]))
    built = counts["pass"] + counts["refused"] + counts["fail"]
    decoders = built - len(not_decoders)
    record = {"command": "python " + shlex.join(["benchmarks/families_inferred.py", *sys.argv[1:]]), **machine(),
              "note": "shared 2-core machine (other agents ran tests): seconds are noisy",
              "candidates": len(results), "counts": counts, "built": built,
              "pass_share_of_built": round(counts["pass"] / built, 3) if built else None,
              "not_decoders": not_decoders, "decoders_built": decoders,
              "pass_share_of_decoders": round(counts["pass"] / decoders, 3) if decoders else None,
              "passed": sorted(t for t, r in results.items() if r["outcome"] == "pass"), "families": results}
    path = result_path("families_inferred_cpu.json", args.out)
    import json

    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{counts} -> {path}")


if __name__ == "__main__":
    main()
