"""The class structure of every model type transformers builds, committed as data per transformers version, so a
model depthlab cannot read is refused from config.json alone, before torch or any modeling code is imported.

    entry = structure_of("xlm")      # {"causal": {"class": "XLMWithLMHeadModel", "refused": "4 ModuleLists ...",
                                      #  "layer_paths": False}, "base": {"class": "XLMModel", "layer_paths": False}}
    python -m depthlab.hf.structure_build --out src/depthlab/hf/layouts   # the committed table (installed transformers)
    python -m depthlab.hf.structure_build                                # a newer transformers': into $DEPTHLAB_CACHE

Building a model's class on the meta device to look for its blocks imports torch and the family's modeling code:
about 4 s on a 2-core machine before the first line could be said. The table holds, for every model type outside the
family registry that transformers builds as a causal LM (``AutoModelForCausalLM``) or a base model (``AutoModel``),
what that build shows, read by the same functions the slow path uses:

- ``refused`` / ``blocks``: the inferred layout's block list (:func:`depthlab.hf.inferred.block_list`): why there is
  none, or its path from the causal LM (causal classes only);
- ``layer_paths``: whether the generic search of :data:`LAYER_PATHS` finds a block list
  (:func:`depthlab.hf.inferred.search_layers`, :func:`~depthlab.targets.layers.find_layers`' fallback);
- ``class``: the class's name, for the line; ``is_decoder``: the config class's default (None where it has no such
  field), for a config.json that does not say.

Built by :mod:`depthlab.hf.structure_build`; each is kept only when the model built at two depths (2 and 3
blocks, the family's own sizes shrunk: :func:`depthlab.hf.shrink.tiny_overrides`) says the same: the structure, not
a size of the default config, decides it. What a config.json field decides (an encoder-decoder, a wrapper of
towers, ``is_decoder``) is read from the user's config.json with the same rules, the class's default standing in
for a field it does not have (:func:`depthlab.hf.inferred.structural_reason`). A model type, transformers version
or build the table does not have is left to the slow path, which refuses the same way (still before any weight is
read), only later: the table only ever makes a refusal earlier.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

#: Where models outside the family registry keep their block list, relative to ``model.base_model`` then the model
#: (tried in order; :func:`depthlab.targets.layers.find_layers`).
LAYER_PATHS: tuple[str, ...] = ("layers", "h", "blocks", "encoder.layer", "decoder.layers", "transformer.h",
                                "model.layers", "layer")

#: The committed tables, one JSON file per transformers version.
TABLES = Path(__file__).with_name("layouts")

#: The two depths every entry is built at; an entry is kept only where both agree.
DEPTHS = (2, 3)


def no_layer_list(class_name: str) -> str:
    """:func:`~depthlab.targets.layers.find_layers`' line for a model whose blocks cannot be found."""
    return (f"cannot find the layer list of {class_name}: the diagnostics need a model whose blocks sit in a "
            f"ModuleList at one of: {', '.join(LAYER_PATHS)} (depthlab models, HF Llama/Mistral/Qwen/GPT-2/BERT-style)")


@functools.lru_cache(maxsize=1)
def transformers_version() -> str | None:
    """The installed transformers' version, from its metadata (transformers is not imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def table_dirs() -> tuple[Path, ...]:
    """Where tables are read from: the committed ones, then the user's (``$DEPTHLAB_CACHE/structure``, written by
    ``python -m depthlab.hf.structure_build`` for a transformers version depthlab has none for)."""
    from depthlab.data.tokenizers import default_cache_dir

    return TABLES, default_cache_dir() / "structure"


def table_name(version: str) -> str:
    return f"transformers-{version}.json"


@functools.lru_cache(maxsize=4)
def _table(version: str | None, dirs: tuple[Path, ...]) -> dict[str, Any]:
    for folder in dirs if version is not None else ():
        path = folder / table_name(version)
        if path.is_file():
            try:
                return json.loads(path.read_text())["model_types"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a damaged table is not used: the slow path decides
    return {}


def structure_of(model_type: Any, version: str | None = None) -> dict[str, Any] | None:
    """The table's entry of ``model_type`` for transformers ``version`` (default: the installed one), or None when
    the table has none (no table for that version, a registry family, a wrapper, a type that did not build)."""
    if not isinstance(model_type, str):
        return None
    return _table(version or transformers_version(), table_dirs()).get(model_type)
