"""The committed table of :mod:`depthlab.hf.structure` built from the installed transformers: every model type of its
causal-LM and base-model mappings outside the family registry, each class built on the meta device at two depths.

    python -m depthlab.hf.structure_build --out src/depthlab/hf/layouts   # the committed table (about 30 s)
    python -m depthlab.hf.structure_build                                # a newer transformers': into $DEPTHLAB_CACHE
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from depthlab.hf.structure import DEPTHS, table_dirs, table_name, transformers_version


def _seen(model: Any, n: int, causal: bool) -> dict[str, Any]:
    """What one model built on the meta device shows (the fields of the module docstring)."""
    from depthlab.hf.inferred import block_list, search_layers

    seen: dict[str, Any] = {"class": type(model).__name__, "layer_paths": search_layers(model) is not None}
    if causal:
        found = block_list(model, n)
        seen.update({"refused": found} if isinstance(found, str) else {"blocks": found[0]})
        seen["is_decoder"] = getattr(model.config, "is_decoder", None)  # the class's default, for a config.json without it
    return seen


def build_entry(model_type: str) -> dict[str, Any] | None:
    """The entry of ``model_type`` from the installed transformers (torch and its modeling code imported): each class
    built on the meta device at :data:`DEPTHS`, kept where both depths agree; None when nothing is kept."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    from depthlab.hf.inferred import wrapper_reason
    from depthlab.hf.shrink import tiny_overrides

    try:
        default = AutoConfig.for_model(model_type)
    except Exception:  # noqa: BLE001 - a config transformers cannot make: nothing to record
        return None
    if wrapper_reason(default) is not None or not isinstance(getattr(default, "num_hidden_layers", None), int):
        return None  # decided from config.json's fields (a wrapper, no block count), not the class
    entry: dict[str, Any] = {}
    for kind, names, auto in (("causal", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, AutoModelForCausalLM),
                              ("base", MODEL_MAPPING_NAMES, AutoModel)):
        if model_type not in names:
            continue
        seen = []
        for n in DEPTHS:
            try:
                config = type(default).from_dict({**default.to_dict(), **tiny_overrides(default, n)})
                if getattr(config, "num_hidden_layers", None) != n:  # shallower by default: set its depth
                    config = type(default).from_dict({**config.to_dict(), "num_hidden_layers": n})
                if getattr(config, "num_hidden_layers", None) != n:
                    break  # its depth cannot be set: the structure cannot be told from a size
                with torch.device("meta"):
                    model = auto.from_config(config, trust_remote_code=False)
            except Exception:  # noqa: BLE001 - a class transformers cannot build at this size: not recorded
                break
            if kind == "base" and hasattr(model, "generate"):
                break  # find_layers reads a generating model's layout, which its config may decide: not recorded
            seen.append(_seen(model, n, kind == "causal"))
        if len(seen) == len(DEPTHS) and all(s == seen[0] for s in seen):
            entry[kind] = seen[0]
    return entry or None


def build_table(model_types: list[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """The table of the installed transformers: every model type of its causal-LM and base-model mappings that is
    not a registry family (or ``model_types``)."""
    import sys
    import time

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    from depthlab.hf.families import FAMILIES

    types = model_types or sorted((set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_MAPPING_NAMES)) - set(FAMILIES))
    start, table = time.monotonic(), {}
    for i, model_type in enumerate(types, 1):
        entry = build_entry(model_type)
        if entry is not None:
            table[model_type] = entry
        if progress and (i % 25 == 0 or i == len(types)):
            spent = time.monotonic() - start
            print(f"structure: {i}/{len(types)} model types, {spent:.0f}s, ETA {spent / i * (len(types) - i):.0f}s",
                  file=sys.stderr, flush=True)
    return table


def main(argv: list[str] | None = None) -> int:
    import argparse
    import platform
    import sys

    from depthlab.base.fileio import write_text_atomic

    p = argparse.ArgumentParser(prog="python -m depthlab.hf.structure_build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="directory of the tables (default: $DEPTHLAB_CACHE/structure, read after the committed ones)")
    p.add_argument("--model-types", nargs="*", default=None, help="only these (default: every one)")
    args = p.parse_args(argv)
    version = transformers_version()
    table = build_table(args.model_types)
    doc = {"transformers": version, "python": platform.python_version(), "depths": list(DEPTHS),
           "command": "python -m depthlab.hf.structure_build " + " ".join(sys.argv[1:] if argv is None else argv),
           "model_types": table}
    out = (args.out or table_dirs()[-1]) / table_name(str(version))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(table)} model types")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
