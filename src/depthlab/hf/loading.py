"""Loading a Hugging Face checkpoint that is what its config says, or a one-line refusal.

    model = load_pretrained("path/to/hf-dir")            # AutoModelForCausalLM by default; GGUF via gguf_file=

``from_pretrained`` on its own initialises, with a log line nobody reads, every weight its config names and
the checkpoint lacks (a config.json claiming 6 layers over 4 layers of weights trains two random layers),
raises a multi-line "look at the above report" on a size mismatch, and loads NaN weights. Here each of those
is a :class:`~depthlab.base.errors.DepthlabError` naming the file and what differs, before anything runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.store.integrity import first_nonfinite


def _layers_of(keys: list[str]) -> list[int]:
    return sorted({int(m.group(1)) for k in keys if (m := re.search(r"\.layers\.(\d+)\.", k))})


def _missing_message(where: str, model: Any, missing: list[str]) -> str:
    layers = _layers_of(missing)
    n = getattr(model.config, "num_hidden_layers", None)
    if layers and n is not None:
        return (f"{where}: config.json says {n} layers, but the weights lack layer(s) {layers[:6]}"
                f"{' ...' if len(layers) > 6 else ''} (missing {missing[0]!r}); fix num_hidden_layers or the weights")
    return f"{where}: the weights lack {len(missing)} tensor(s) the config needs, e.g. {missing[0]!r}"


@contextlib.contextmanager
def third_party_output(show: bool | None = None) -> Iterator[None]:
    """Loading bars of transformers and its GGUF reader: shown only on a terminal (``show=None``) or when
    asked; otherwise off and their stderr swallowed, so a piped log or a one-line error stays clean
    (depthlab's own stages log their progress). Errors still surface as exceptions."""
    if show is None:
        show = sys.stderr.isatty()
    if show:
        yield
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        yield


def load_pretrained(path: str | Path, auto_class: Any = None, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, **kwargs)`` (``AutoModelForCausalLM`` by default, no remote code),
    refused in one line when weights are missing, unexpected, of another shape than the config, or not finite."""
    if auto_class is None:
        from transformers import AutoModelForCausalLM as auto_class  # noqa: N813
    where = str(Path(path) / kwargs["gguf_file"]) if kwargs.get("gguf_file") else str(path)
    refuse = f"cannot load a Hugging Face model from {where!r}"
    if str(path).startswith((".", "/", "~")) and not Path(path).expanduser().exists():
        raise DepthlabError(f"{refuse}: no such directory")
    if Path(path).expanduser().is_dir() and not kwargs.get("gguf_file"):
        from depthlab.hf.config_checks import check_model_dir

        check_model_dir(path)  # config.json's sizes and rules, before transformers builds anything
    try:
        with third_party_output():  # transformers' loading bars: on a terminal only (a refusal stays one line)
            model, info = auto_class.from_pretrained(str(path), **{"trust_remote_code": False, **kwargs},
                                                     output_loading_info=True, ignore_mismatched_sizes=True)
    except (RuntimeError, ValueError, OSError) as err:
        text = str(err)
        size = next((ln.strip() for ln in text.splitlines() if "size mismatch" in ln or "shape" in ln.lower()), None)
        raise DepthlabError(f"{refuse}: {size or first_line(err)}"[:400]) from None
    missing = [k for k in info.get("missing_keys", []) if not k.endswith("lm_head.weight")
               or not getattr(model.config, "tie_word_embeddings", False)]
    if missing:
        raise DepthlabError(_missing_message(refuse, model, sorted(missing)))
    unexpected = sorted(info.get("unexpected_keys", []))
    if unexpected:
        layers = _layers_of(unexpected)
        more = f" (layer(s) {layers[:6]} beyond num_hidden_layers)" if layers else ""
        raise DepthlabError(f"{refuse}: the weights hold tensors the config has no place for{more}, "
                            f"e.g. {unexpected[0]!r}")
    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        first = mismatched[0]
        detail = (f"{first[0]} is {list(first[1])} in the weights, {list(first[2])} by the config"
                  if isinstance(first, (tuple, list)) and len(first) == 3 else str(first))
        raise DepthlabError(f"{refuse}: {len(mismatched)} weight(s) of another shape than config.json "
                            f"says ({detail})")
    bad = first_nonfinite(("weights", dict(model.state_dict())))
    if bad is not None:
        raise DepthlabError(f"cannot use {where!r}: it holds NaN/inf weights ({bad.removeprefix('weights.')})")
    return model
