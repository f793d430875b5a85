"""The processor of an image-text-to-text model directory: what turns images and a prompt into the wrapper's inputs.

    processor = wrapper_processor("path/to/qwen2.5-vl")        # AutoProcessor, or an ExpandedProcessor (below)
    inputs = processor(text=["<|vision_start|><|image_pad|><|vision_end|>What is it?"], images=[[img]],
                       return_tensors="pt")

transformers' own processor (``AutoProcessor``) where it can be built. Several cannot be built without packages this
project cannot always install: the Qwen-VL / Qwen3.5 and Gemma 4 processors insist on a video processor (torchvision),
Mistral 3's Pixtral processor imports torchvision, SmolVLM's needs ``num2words``. For those an
:class:`ExpandedProcessor` makes the same inputs from the wrapper's image processor (its PIL backend, which
``AutoImageProcessor`` picks when torchvision is missing) and tokenizer: each image marker in the prompt is expanded
into the image's tokens exactly as the processor's ``replace_image_token`` does (the code each rule follows is named
in :data:`EXPANSIONS`), and Qwen's ``mm_token_type_ids`` are added. SmolVLM's images are not split into tiles (its
processor's ``do_image_splitting``), so a real SmolVLM sees the global image only: the inputs are valid, the numbers
those of unsplit images. The wrapper entry names its rule (``Wrapper.expand``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError, first_line
from depthlab.hf.family_rules import config_field

log = logging.getLogger(__name__)


def _qwen(p: ExpandedProcessor, pix: dict, k: int) -> str:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL ``replace_image_token``: one pad per merged patch of the image's grid."""
    merge = int(getattr(p.image_processor, "merge_size", 2))
    return p.image_token * int(pix["image_grid_thw"][k].prod() // merge ** 2)


def _pixtral(p: ExpandedProcessor, pix: dict, k: int) -> str:
    """Pixtral's ``replace_image_token``: rows of [IMG] per merged patch, [IMG_BREAK] after each, the last [IMG_END]."""
    size = getattr(p.image_processor, "patch_size", 16)
    patch = int(size["height"] if isinstance(size, dict) else size) * int(config_field(p.config, "spatial_merge_size", 1))
    height, width = (int(x) for x in pix["image_sizes"][k])
    tokens = ([p.image_token] * (width // patch) + ["[IMG_BREAK]"]) * (height // patch)
    tokens[-1] = "[IMG_END]"
    return "".join(tokens)


def _idefics(p: ExpandedProcessor, pix: dict, k: int) -> str:
    """Idefics3 / SmolVLM's ``replace_image_token`` for an image that is not split: the global image's tokens."""
    vision = config_field(p.config, "vision_config") or {}
    side = int(config_field(vision, "image_size")) // int(config_field(vision, "patch_size"))
    seq = side * side // int(config_field(p.config, "scale_factor", 2)) ** 2
    return "<fake_token_around_image><global-img>" + p.image_token * seq + "<fake_token_around_image>"


def _gemma4(p: ExpandedProcessor, pix: dict, k: int) -> str:
    """Gemma 4's ``replace_image_token``: begin-of-image, one token per soft token, end-of-image."""
    return "<|image>" + p.image_token * int(pix["num_soft_tokens_per_image"][k]) + "<image|>"


#: Expansion rule -> (the marker the prompt holds for one image, the function expanding the k-th image's marker).
EXPANSIONS: dict[str, tuple[str, Callable[[Any, dict, int], str]]] = {
    "qwen": ("<|image_pad|>", _qwen), "pixtral": ("[IMG]", _pixtral), "idefics": ("<image>", _idefics),
    "gemma4": ("<|image|>", _gemma4)}
#: Image-processor outputs the model does not take.
_DROPPED = ("num_soft_tokens_per_image", "rows", "cols")


class ExpandedProcessor:
    """A processor call made from an image processor and a tokenizer (see the module docstring)."""

    def __init__(self, image_processor: Any, tokenizer: Any, expand: str, config: dict[str, Any]) -> None:
        self.image_processor, self.tokenizer, self.config = image_processor, tokenizer, config
        self.image_token, self._expand = EXPANSIONS[expand]
        self.rule = expand
        self.chat_template = getattr(tokenizer, "chat_template", None)
        if expand == "idefics":
            image_processor.do_image_splitting = False

    def __call__(self, text: str | list[str], images: Any = None, return_tensors: str = "pt", **kwargs: Any) -> dict:
        import torch

        texts = [text] if isinstance(text, str) else list(text)
        flat = [im for group in (images or []) for im in (group if isinstance(group, (list, tuple)) else [group])]
        pix = dict(self.image_processor(flat, return_tensors="pt")) if flat else {}
        expanded, k = [], 0
        for t in texts:
            head, *rest = t.split(self.image_token)
            for piece in rest:
                head += self._expand(self, pix, k) + piece
                k += 1
            expanded.append(head)
        if k != len(flat):
            raise DepthlabError(f"the prompt names {k} images ({self.image_token}) but {len(flat)} were given")
        enc = self.tokenizer(expanded, return_tensors="pt", padding=len(expanded) > 1)
        out = {**dict(enc), **{n: v for n, v in pix.items() if n not in _DROPPED}}
        if self.rule == "qwen":
            image_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
            out["mm_token_type_ids"] = (out["input_ids"] == image_id).to(torch.int64)
        return out

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def save_pretrained(self, out: str | Path) -> None:
        self.image_processor.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))


def wrapper_processor(path: str | Path, expand: str = "") -> Any:
    """The processor of the model directory ``path``: transformers' own, else (``expand``: the wrapper entry's rule)
    an :class:`ExpandedProcessor`; one line naming why when neither can be made."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    from depthlab.hf.loading import third_party_output

    try:
        with third_party_output(False):
            return AutoProcessor.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - ImportError (torchvision, num2words), AttributeError, OSError...
        why = first_line(err)[:200] or type(err).__name__
        if not expand:
            raise DepthlabError(f"cannot build the processor of {str(path)!r} ({type(err).__name__}: {why}); it makes "
                                "the model's image inputs") from None
    try:
        with third_party_output(False):
            image_processor = AutoImageProcessor.from_pretrained(str(path))
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        config = json.loads((Path(path) / "config.json").read_text())
    except Exception as err:  # noqa: BLE001
        raise DepthlabError(f"cannot build the processor of {str(path)!r}, nor its image processor and tokenizer: "
                            f"{first_line(err)[:200]}") from None
    log.info("%s: transformers' processor cannot be built here (%s); its inputs are made from %s and the tokenizer "
             "(image tokens expanded as the processor does)", path, why, type(image_processor).__name__)
    return ExpandedProcessor(image_processor, tokenizer, expand, config)


# ---------------------------------------------------------------------------------------------- the image token
#: Fields of config.json naming the id the wrapper's forward looks for where an image's features go.
IMAGE_TOKEN_FIELDS = ("image_token_index", "image_token_id")


def processor_image_token(path: str | Path) -> tuple[str, int] | None:
    """(the image token the model directory's processor writes, its id in tokenizer.json), read from the saved files
    alone (processor_config.json's ``image_token``, else tokenizer_config.json's); None where they do not say."""
    path = Path(path)

    def read(name: str) -> dict[str, Any]:
        try:
            data = json.loads((path / name).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    text = read("processor_config.json").get("image_token") or read("tokenizer_config.json").get("image_token")
    tokenizer = read("tokenizer.json")
    if not isinstance(text, str) or not tokenizer:
        return None
    for added in tokenizer.get("added_tokens") or ():
        if isinstance(added, dict) and added.get("content") == text and isinstance(added.get("id"), int):
            return text, added["id"]
    vocab = (tokenizer.get("model") or {}).get("vocab")
    token = vocab.get(text) if isinstance(vocab, dict) else None
    return (text, token) if isinstance(token, int) else None


def check_image_token(path: str | Path) -> None:
    """A wrapper whose config.json names another image token id than the one its processor writes, refused in one line
    before the load: its forward would find no image token in the processor's inputs and fail mid-run ("Image features
    and image tokens do not match"). Nothing to say where the files do not name the processor's token."""
    path = Path(path).expanduser()
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return
    found = processor_image_token(path) if isinstance(config, dict) else None
    if found is None:
        return
    text, want = found
    for name in IMAGE_TOKEN_FIELDS:
        token = config.get(name)
        if isinstance(token, int) and not isinstance(token, bool) and token != want:
            raise DepthlabError(f"{str(path / 'config.json')!r}: {name}={token} is not the image token its processor "
                                f"writes ({text!r}, id {want} in tokenizer.json); give {want}")
