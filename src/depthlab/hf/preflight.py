"""What a command refuses for a Hugging Face checkpoint directory from its config.json alone, before torch, transformers
or any weight is read: the first thing ``diagnose``, ``evaluate``, ``prune`` and ``finetune`` do with their target.

    preflight.check("path/to/model", "prune", stream=True)   # DepthlabError in one line, or nothing to say yet

Each line is the one the command's later checks would say (the same functions make it): the family registry's
refusals (:func:`depthlab.hf.families.family_of`), an image-text wrapper's (:func:`depthlab.hf.wrappers.tower_family`),
a model type ``finetune`` cannot convert (:func:`depthlab.hf.families.conversion_of`), and for a model type outside
the registry the class structure of :mod:`depthlab.hf.structure` with config.json's own fields
(:func:`depthlab.hf.inferred.structural_reason`). What it cannot decide
from these it leaves to those checks (still before any weight is read): it never accepts what they would refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError
from depthlab.base.paths import model_dir_config

#: The capabilities a command asks of its target (``diagnose`` and ``evaluate`` ask "diagnose"; ``export`` takes
#: depthlab runs only).
COMMAND_CAPABILITIES = ("diagnose", "prune", "finetune", "export")


def is_encoder_dir(path: Path, config: dict[str, Any] | None = None) -> bool:
    """Whether the loader reads the directory as an encoder (``AutoModel``): a sentence-transformers model, or one
    whose config.json names no causal-LM architecture and is not a decoder."""
    if (path / "modules.json").is_file():
        return True
    if config is None:
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return False
    archs = config.get("architectures") or [] if isinstance(config, dict) else []
    return bool(archs) and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs) \
        and not config.get("is_decoder")


def refusal(target: Any, capability: str, *, stream: bool | None = None, tower: str = "language") -> str | None:
    """The line the command asking ``capability`` (:data:`COMMAND_CAPABILITIES`) of ``target`` will refuse it with,
    decided from config.json and the committed tables alone; None when there is none, or it cannot be told yet.
    ``stream``: the engine asked (True: streaming is refused where the family cannot stream)."""
    from depthlab.hf.families import FAMILIES, cannot_line, conversion_of, family_of
    from depthlab.hf.inferred import structural_reason
    from depthlab.hf.structure import no_layer_list, structure_of
    from depthlab.hf.wrappers import is_image_text, tower_family

    config = model_dir_config(target)
    if config is None:
        return None
    model_type = config["model_type"]
    if capability == "export":
        return (f"{str(target)!r} is a Hugging Face model directory (config.json, model type {model_type!r}), not a "
                "depthlab run: export writes a depthlab run as a Hugging Face checkpoint")
    try:
        if is_image_text(config) or tower != "language":
            if capability != "finetune":  # a wrapper's towers: config.json's own refusals (check_wrapper_dir's)
                tower_family(config, tower)
            return None
        if capability == "finetune":
            conversion_of(model_type)
            return None
        if model_type in FAMILIES:
            if capability == "prune":
                family_of(config, "prune")
            if stream:
                try:
                    family_of(config, "stream")
                except DepthlabError as err:
                    return stream_line(target, str(err).splitlines()[0])
            return None
    except DepthlabError as err:
        return str(err).splitlines()[0]
    why = structural_reason(config)
    if why is None:
        return None
    if capability == "diagnose":  # find_layers' generic search may find blocks where the layout cannot be told
        kind = "base" if is_encoder_dir(Path(target).expanduser(), config) else "causal"
        seen = (structure_of(model_type) or {}).get(kind)
        if seen is not None and not seen["layer_paths"]:
            return no_layer_list(seen["class"])
        if seen is None or not stream:
            return None
        return stream_line(target, cannot_line(model_type, "stream", why))
    return cannot_line(model_type, capability, why)


def stream_line(target: Any, why: str) -> str:
    """The engine's refusal of ``--stream`` (:func:`depthlab.targets.engine.plan_engine`)."""
    return f"--stream: cannot stream {str(target)!r}: {why}"


def check(target: Any, capability: str, *, stream: bool | None = None, tower: str = "language") -> None:
    """:func:`refusal` raised as a one-line DepthlabError."""
    why = refusal(target, capability, stream=stream, tower=tower)
    if why is not None:
        raise DepthlabError(why)
