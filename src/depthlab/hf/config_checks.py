"""An HF model directory's config.json checked before anything is built from it, the same way for every family.

    check_model_dir(Path("hf-dir"))     # one-line DepthlabError naming config.json and the field, else nothing

Both engines call it before building (the plan of :func:`depthlab.targets.load.plan_target`, and
:func:`depthlab.hf.loading.load_pretrained` for every in-memory load), so what config.json alone decides is refused
before any weight is read, whichever family, engine or command:

* **sizes first, from the raw JSON**: the layer count, under whatever name the family gives it (GPT-2's ``n_layer``:
  the config class's ``attribute_map``; an image-text wrapper's ``text_config`` too), an integer in
  1..:data:`~depthlab.models.config.MAX_LAYERS`, and the width within :data:`~depthlab.models.config.MAX_WIDTH`.
  ``num_hidden_layers: 1e9`` used to grow a config (and a model) in memory for minutes;
* **transformers' own validation** (its strict config dataclasses: ``hidden_size`` a multiple of the heads, ...),
  its error put in depthlab's sentence (never a raw ``StrictDataclassClassValidationError``);
* **depthlab's rules**, which transformers checks for some families only: one entry per layer in every per-layer list
  (``layer_types``, ...: DeepSeek-V4's were not checked), and :data:`LAYER_COUNT_LIMITS` (Gemma 4 sharing keys and
  values in every layer has no layer to share them from);
* **each tower's fields that point at its blocks** (:func:`check_tower_fields`): lists of layer indices within the
  block count (Qwen3-VL's ``deepstack_visual_indexes=[0, 5]`` on 3 vision blocks was measured with one deepstack
  feature silently dropped), a wrapper's fields that name a vision state (``vision_feature_layer``), its image token
  ids within the text vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, first_line

#: Config fields counting layers, and the most each may be given ``n`` layers (with why): what transformers accepts
#: and then fails on mid-run.
LAYER_COUNT_LIMITS: dict[str, tuple[int, str]] = {
    "num_kv_shared_layers": (-1, "the layers that reuse keys and values need an earlier layer that makes them"),
}

#: A wrapper's config fields holding the token ids its image (video) features are scattered into: each must be a token
#: of the text vocabulary (or, where the wrapper pads one beyond it, ``Wrapper.image_token_oov``, non-negative), else
#: transformers' forward fails mid-run (an IndexError in the embedding, "image features and image tokens do not match").
MEDIA_TOKEN_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")

#: Width fields of the raw config.json checked against MAX_WIDTH (under their names in the family's config class).
WIDTH_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads")


def check_model_dir(path: str | Path) -> None:
    """config.json of the HF model directory ``path`` (nothing when it has none: a hub id, a GGUF directory): its sizes,
    then transformers' validation, then depthlab's rules; one line naming the file and the field when one fails."""
    path = Path(path).expanduser()
    file = path / "config.json"
    if not file.is_file():
        return
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise DepthlabError(f"cannot read {str(file)!r}: {first_line(err)[:160]}") from None
    if not isinstance(raw, dict):
        raise DepthlabError(f"{str(file)!r} is not a JSON object")
    for part in _config_parts(raw):
        check_sizes(part, file)
    config = _transformers_config(path, file)
    if config is not None:
        check_layer_fields(config, file)
        check_tower_fields(config, file)


def _config_parts(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The raw config and the sub-configs with a model type of their own (an image-text wrapper's ``text_config``)."""
    subs = [v for k, v in raw.items() if k.endswith("_config") and isinstance(v, dict) and "model_type" in v]
    return [raw, *subs]


def _field_names(model_type: Any) -> dict[str, str]:
    """The family's names of the generic fields (``num_hidden_layers`` is GPT-2's ``n_layer``), from its config
    class's ``attribute_map``; {} for a model type transformers does not know."""
    if not isinstance(model_type, str):
        return {}
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        return dict(getattr(CONFIG_MAPPING[model_type], "attribute_map", None) or {})
    except (KeyError, ImportError):
        return {}


def check_sizes(raw: dict[str, Any], file: Path) -> None:
    """The layer count (an integer in 1..MAX_LAYERS), the per-layer lists (one entry per layer) and the widths (at
    most MAX_WIDTH) of one raw config dict, under the family's own field names."""
    from depthlab.models.config import MAX_LAYERS, MAX_WIDTH

    names = _field_names(raw.get("model_type"))
    layers = names.get("num_hidden_layers", "num_hidden_layers")
    if layers in raw:
        _check_count(raw[layers], layers, 1, MAX_LAYERS, file)
        _check_lists(raw, int(raw[layers]), file)  # as written: transformers cuts some lists to the count silently
    for generic in WIDTH_FIELDS:
        name = names.get(generic, generic)
        if isinstance(raw.get(name), (int, float)) and not isinstance(raw[name], bool):
            _check_count(raw[name], name, 0, MAX_WIDTH, file)


def _check_lists(config: Any, n: int, file: Path | str) -> None:
    """One entry per layer in every per-layer list of ``config`` (a raw dict or a transformers config) of ``n``
    layers: :data:`~depthlab.hf.families.LAYER_LISTS` and the family's own."""
    from depthlab.hf.families import LAYER_LISTS, known_family

    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    fam = known_family(get("model_type"))
    for name in (*LAYER_LISTS, *(fam.layer_lists if fam is not None else ())):
        values = get(name)
        if isinstance(values, (list, tuple)) and len(values) != n:
            raise DepthlabError(f"{str(file)!r}: {name} holds {len(values)} entries for {n} layers; give one per "
                                "layer")


def _check_count(value: Any, name: str, lo: int, hi: int, file: Path) -> None:
    shown = f"{value:g}" if isinstance(value, float) else repr(value)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value <= hi:
        whole = True  # 4.0: transformers reads it as 4
    if not whole or not lo <= value <= hi:
        raise DepthlabError(f"{str(file)!r}: {name}={shown} is not a size depthlab builds (give an integer in "
                            f"{lo}..{hi}); refusing before building anything")


def _transformers_config(path: Path, file: Path) -> Any:
    """transformers' config of ``path`` (its own validation run), its refusal in depthlab's sentence; None when
    transformers does not know the model type (the loaders say so in their own words)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - strict-dataclass validation, a ValueError, a KeyError of a field, ...
        text = first_line(err)
        if "does not recognize this architecture" in text or "Unrecognized model" in text or "model_type" in text:
            return None
        why = text.split("ValueError: ", 1)[-1] if "validation error" in text else text
        raise DepthlabError(f"{str(file)!r} is not a valid config: {why[:240]}") from None


def _text_config(config: Any, file: Path | str) -> Any:
    """The text decoder's config of ``config`` (itself for a text model); one line when it has several text configs
    (MusicGen's text_encoder and decoder), where transformers raises a ValueError."""
    try:
        return config.get_text_config() if hasattr(config, "get_text_config") else config
    except ValueError as err:
        raise DepthlabError(f"{str(file)!r}: depthlab reads a model with one text decoder; "
                            f"{first_line(err)[:160]}") from None


def check_layer_fields(config: Any, file: Path | str = "config.json") -> None:
    """depthlab's rules on a transformers config (its text config for a wrapper): one entry per layer in every
    per-layer list, :data:`LAYER_COUNT_LIMITS`."""
    text = _text_config(config, file)
    n = getattr(text, "num_hidden_layers", None)
    if not isinstance(n, int):
        return
    _check_lists(text, n, file)
    for name, (slack, why) in LAYER_COUNT_LIMITS.items():
        value = getattr(text, name, None)
        if isinstance(value, int) and value > n + slack:
            raise DepthlabError(f"{str(file)!r}: {name}={value} with num_hidden_layers={n}: {why}; give at most "
                                f"{n + slack}")


def _index_lists(config: Any, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` and every field the inferred layout reads as a list of layer indices (:data:`~depthlab.hf.inferred.
    INDEX_LIST`), that ``config`` holds."""
    import re

    from depthlab.hf.inferred import INDEX_LIST

    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    found = [k for k, v in values.items() if isinstance(v, (list, tuple)) and re.search(INDEX_LIST, k)]
    return tuple(dict.fromkeys((*names, *found)))


def _check_indices(config: Any, n: int, names: tuple[str, ...], prefix: str, tower: str, file: Path | str) -> None:
    """Every list of layer indices of ``config`` (``names`` and what the inferred layout renumbers) within 0..n-1."""
    for name in _index_lists(config, names):
        values = getattr(config, name, None)
        if not isinstance(values, (list, tuple)):
            continue
        bad = [v for v in values if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n)]
        if bad:
            raise DepthlabError(f"{str(file)!r}: {prefix}{name}={list(values)} names block(s) {bad}, but {tower} "
                                f"has {n} blocks; give indices in 0..{n - 1}")


def check_tower_fields(config: Any, file: Path | str = "config.json") -> None:
    """The fields of a transformers config that point at blocks, held against each tower's block count: lists of layer
    indices (the family's ``index_lists``, the vision tower's, and what the inferred layout renumbers), a wrapper's
    :data:`~depthlab.hf.family_rules.WRAPPER_RANGES` fields, and its :data:`MEDIA_TOKEN_FIELDS` against the text
    vocabulary. A field out of range is dropped or fails mid-run in transformers; here it is one line."""
    from depthlab.hf.families import known_family
    from depthlab.hf.family_rules import WRAPPER_RANGES, config_field
    from depthlab.hf.wrappers import WRAPPERS, sub_config

    wrapper = WRAPPERS.get(config_field(config, "model_type"))
    text = _text_config(config, file)
    n = getattr(text, "num_hidden_layers", None)
    fam = known_family(getattr(text, "model_type", None))
    if isinstance(n, int):
        _check_indices(text, n, fam.index_lists if fam is not None else (), "text_config." if wrapper else "",
                       "the language tower" if wrapper else "the model", file)
    if wrapper is None:
        return
    vision = sub_config(config, "vision_config")
    depth = config_field(vision, wrapper.vision.count) if vision is not None else None
    if isinstance(depth, int):
        _check_indices(vision, depth, wrapper.vision.index_lists, "vision_config.", "the vision tower", file)
        for name in wrapper.vision_rules:
            why = WRAPPER_RANGES[name](config, depth)
            if why is not None:
                raise DepthlabError(f"{str(file)!r}: {why}")
    vocab, values = getattr(text, "vocab_size", None), config.to_dict()
    if not isinstance(vocab, int):
        return
    top = float("inf") if wrapper.image_token_oov else vocab  # Gemma 3, PaliGemma: an id beyond it is padded
    for name in (n for n in MEDIA_TOKEN_FIELDS if n in values):  # under config.json's own name
        token = values[name]
        if isinstance(token, int) and not isinstance(token, bool) and not 0 <= token < top:
            give = "a non-negative id" if wrapper.image_token_oov else f"an id in 0..{vocab - 1}"
            raise DepthlabError(f"{str(file)!r}: {name}={token} is not a token of the text vocabulary "
                                f"(text_config.vocab_size={vocab}); give {give}")
