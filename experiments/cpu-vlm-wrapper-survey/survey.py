"""Where transformers puts the two towers of every image-text-to-text wrapper depthlab means to support.

For each wrapper ``model_type`` a tiny random model is built (``AutoConfig.for_model`` + ``from_config``; a byte-level
tokenizer of 300 ids whose special tokens are the wrapper's image tokens) and examined:

- the block lists (every ``ModuleList``), the text decoder's final norm and LM head, the vision tower's modules
  after its blocks, the projector; the key prefixes ``save_pretrained`` writes (what a streamed reader sees);
- the config fields of each tower that hold one entry per layer or list layer indices;
- a text-only forward, an image+text forward (inputs from the wrapper's processor where it builds here, else from its
  image processor with the image tokens expanded as the processor would), ``generate`` from both;
- which vision blocks the language model reads: each vision block is skipped in turn (a hook returns its input) and
  the image+text logits compared with the full model's. A block whose skipping changes nothing is unused (llava's
  ``vision_feature_layer=-2`` leaves the last CLIP layer unused). The same for each language block on a text-only
  input (all are used) and, for Qwen3-VL, the language blocks that receive deepstack features.

    python experiments/cpu-vlm-wrapper-survey/survey.py [MODEL_TYPE ...]   # writes survey.json + survey.md beside it

One thread; about a minute for all twelve on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent

#: The text tower's tiny config (depthlab's tiny family models: 4 layers of width 32, vocabulary 300).
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300, "max_position_embeddings": 256,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
#: A ViT-style vision tower: 3 blocks (not 4, so a per-layer list of either tower is told apart) of width 32.
VIS = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4}
QVIS = {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32, "patch_size": 4}
LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8}
QWEN_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
               "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
IDEFICS_TOKENS = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{i}_col_{j}>" for i in (1, 2) for j in (1, 2)]

#: model_type -> text / vision / wrapper overrides, and the special tokens (config field -> token; extra tokens).
WRAPPERS: dict[str, dict[str, Any]] = {
    "gemma3": {"vision": {**VIS, "image_size": 32, "patch_size": 8}, "top": {"mm_tokens_per_image": 4},
               "tokens": {"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                          "eoi_token_index": "<end_of_image>"},
               "named": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                         "eoi_token": "<end_of_image>"}},
    "gemma4": {"text": {"vocab_size_per_layer_input": 300, "hidden_size_per_layer_input": 8, "global_head_dim": 16},
               "vision": {**VIS, "num_key_value_heads": 4, "head_dim": 8, "patch_size": 4,
                          "position_embedding_size": 64},
               "tokens": {"image_token_id": "<|image|>", "boi_token_id": "<|image>", "eoi_token_id": "<image|>",
                          "video_token_id": "<|video|>", "audio_token_id": "<|audio|>", "boa_token_id": "<|audio>",
                          "eoa_token_index": "<audio|>"}},
    "llama4": {"text": {"num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 64,
                        "interleave_moe_layer_step": 2},
               "vision": {**VIS, "intermediate_size": 128, "image_size": 32, "patch_size": 8, "vision_output_dim": 32,
                          "projector_input_dim": 32, "projector_output_dim": 32},
               "tokens": {"image_token_index": "<|image|>", "boi_token_index": "<|image_start|>",
                          "eoi_token_index": "<|image_end|>"}},
    "qwen3_5": {"text": LINEAR, "vision": {**QVIS, "num_position_embeddings": 64}, "tokens": QWEN_TOKENS},
    "qwen3_5_moe": {"text": {**LINEAR, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                             "shared_expert_intermediate_size": 32},
                    "vision": {**QVIS, "num_position_embeddings": 64}, "tokens": QWEN_TOKENS},
    "qwen2_5_vl": {"text": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1],
                                                "rope_theta": 10000.0}},
                   "vision": {**QVIS, "fullatt_block_indexes": [1, 2], "window_size": 16}, "tokens": QWEN_TOKENS},
    "qwen3_vl": {"vision": {**QVIS, "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 64},
                 "tokens": QWEN_TOKENS},
    "mistral3": {"vision": {**VIS, "image_size": 32, "patch_size": 8, "head_dim": 8},
                 "tokens": {"image_token_index": "[IMG]"}, "extra": ["[IMG_BREAK]", "[IMG_END]"]},
    "llava": {"vision": {**VIS, "image_size": 32, "patch_size": 8, "projection_dim": 32},
              "top": {"image_seq_length": 16}, "tokens": {"image_token_index": "<image>"}},
    "idefics3": {"vision": {**VIS, "image_size": 32, "patch_size": 8}, "tokens": {"image_token_id": "<image>"},
                 "extra": IDEFICS_TOKENS},
    "smolvlm": {"vision": {**VIS, "image_size": 32, "patch_size": 8}, "tokens": {"image_token_id": "<image>"},
                "extra": IDEFICS_TOKENS},
    "paligemma": {"vision": {**VIS, "image_size": 32, "patch_size": 8, "projection_dim": 32},
                  "top": {"projection_dim": 32, "hidden_size": 32}, "tokens": {"image_token_index": "<image>"}},
}


#: Parameters a random init leaves at zero (Gemma 3's projector matrix): random here, else no image reaches the LM.
ZERO_INIT = ("mm_input_projection_weight",)


# ---------------------------------------------------------------------------------------------- building
def tiny_tokenizer(specials: list[str], named: dict[str, str] | None = None) -> Any:
    """A byte-level tokenizer without merges: 0..2 pad/bos/eos, 3..258 the bytes, then ``specials``; ``named`` gives
    some of them names the processors read (``tokenizer.boi_token``), saved with the tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = 3 + i
    for s in specials:
        vocab.setdefault(s, len(vocab))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<pad>", "<bos>", "<eos>", *specials])  # never split into bytes
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   **({"extra_special_tokens": named} if named else {}))


def build(model_type: str) -> tuple[Any, Any]:
    """(the tiny model, its tokenizer): the config's image token ids are the tokenizer's."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    spec = WRAPPERS[model_type]
    tok = tiny_tokenizer([*spec["tokens"].values(), *spec.get("extra", [])], spec.get("named"))
    ids = {field: tok.convert_tokens_to_ids(token) for field, token in spec["tokens"].items()}
    config = AutoConfig.for_model(model_type, text_config={**TEXT, **spec.get("text", {})},
                                  vision_config=spec.get("vision"), **spec.get("top", {}), **ids)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    with torch.no_grad():  # parameters transformers initialises to zeros, which would make the image invisible
        for name, p in model.named_parameters():
            if name.endswith(ZERO_INIT):
                p.normal_(0.0, 0.2)
    return model, tok


# ---------------------------------------------------------------------------------------------- inputs
def _image(seed: int, h: int = 32, w: int = 32) -> Any:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy())


def _ids(tok: Any, text: str) -> torch.Tensor:
    return torch.tensor([tok.encode(text)])


def image_inputs(model_type: str, tok: Any, seed: int = 1) -> tuple[dict[str, Any], str]:
    """Image+text inputs as the wrapper's processor makes them (its image processor, the image tokens expanded to
    the number of features), and how they were made. Processors that need torchvision (Qwen-VL, Qwen3.5, Pixtral,
    Llama 4, Gemma 4: their video processors) or num2words (SmolVLM) are not built; their layout is reproduced."""
    import transformers as tf

    img = _image(seed)
    if model_type in ("gemma3", "llava", "paligemma", "idefics3"):
        proc = _processor(model_type, tok)
        marker = {"gemma3": "<start_of_image>", "idefics3": "<image>", "llava": "<image>", "paligemma": "<image>"}
        out = proc(text=[f"A {marker[model_type]} picture of"], images=[img], return_tensors="pt")
        return dict(out), f"{type(proc).__name__}"
    if model_type == "smolvlm":
        ip = tf.SmolVLMImageProcessorPil(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                          do_image_splitting=False)
        pix = ip([img], return_tensors="pt")
        text = "A <fake_token_around_image><global-img>" + "<image>" * 4 + "<fake_token_around_image> picture of"
        return {"input_ids": _ids(tok, text), **pix}, "SmolVLMImageProcessorPil + tokens by hand (processor: num2words)"
    if model_type.startswith("qwen"):
        ip = tf.Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=4, merge_size=2)
        pix = ip([img], return_tensors="pt")
        n = int(pix["image_grid_thw"].prod()) // 4
        ids = _ids(tok, "A <|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|> picture of")
        types = (ids == tok.convert_tokens_to_ids("<|image_pad|>")).int()  # 1 image, 2 video: M-RoPE's positions
        how = "Qwen2VLImageProcessorPil + tokens by hand (processor: torchvision)"
        return {"input_ids": ids, "mm_token_type_ids": types, **pix}, how
    if model_type == "mistral3":
        ip = tf.PixtralImageProcessorPil(size={"longest_edge": 32}, patch_size=8)
        pix = ip([img], return_tensors="pt")
        rows = int(pix["image_sizes"][0][0]) // 16  # patch 8 x spatial merge 2
        cols = int(pix["image_sizes"][0][1]) // 16
        text = "A " + "[IMG_BREAK]".join("[IMG]" * cols for _ in range(rows)) + "[IMG_END] picture of"
        return {"input_ids": _ids(tok, text), **pix}, "PixtralImageProcessorPil + tokens by hand (processor: torchvision)"
    if model_type == "llama4":  # no PIL image processor: one 32x32 tile, normalised as Llama4ImageProcessor does
        x = torch.tensor(list(img.getdata()), dtype=torch.float32).view(1, 32, 32, 3).permute(0, 3, 1, 2) / 255
        text = "A <|image_start|>" + "<|image|>" * 4 + "<|image_end|> picture of"  # 16 patches, pixel shuffle 0.5
        return {"input_ids": _ids(tok, text), "pixel_values": (x - 0.5) / 0.5}, "pixels and tokens by hand (torchvision)"
    if model_type == "gemma4":
        ip = tf.Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3)
        pix = ip([_image(seed, 96, 96)], return_tensors="pt")
        n = int(pix["num_soft_tokens_per_image"][0]) if "num_soft_tokens_per_image" in pix else 70
        text = "A <|image>" + "<|image|>" * n + "<image|> picture of"
        pix = {k: v for k, v in pix.items() if k != "num_soft_tokens_per_image"}
        return {"input_ids": _ids(tok, text), **pix}, "Gemma4ImageProcessorPil + tokens by hand (processor: torchvision)"
    raise KeyError(model_type)


def _processor(model_type: str, tok: Any) -> Any:
    import transformers as tf

    if model_type == "gemma3":
        ip = tf.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
        return tf.Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=4)
    if model_type == "paligemma":
        ip = tf.SiglipImageProcessorPil(size={"height": 32, "width": 32})
        ip.image_seq_length = 16
        return tf.PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
    if model_type == "llava":
        ip = tf.LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return tf.LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                                num_additional_image_tokens=1)
    ip = tf.Idefics3ImageProcessorPil(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                      do_image_splitting=False)
    return tf.Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4)


# ---------------------------------------------------------------------------------------------- layout
def _path_of(model: Any, module: Any) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def layout(model: Any) -> dict[str, Any]:
    """Every block list (path, length, block class, its container's children in order), the LM head, and the
    children of the vision container and of the base model in order (what follows the blocks)."""
    lists = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and name.count(".") < 6:
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            lists.append({"path": name, "n": len(mod), "block": type(mod[0]).__name__,
                          "container": [n for n, _ in parent.named_children()]})
    head = model.get_output_embeddings()
    base = getattr(model, "model", model)
    return {"class": type(model).__name__, "lists": lists, "lm_head": _path_of(model, head),
            "tied": bool(head.weight is model.get_input_embeddings().weight),
            "base_children": [f"{n}: {type(m).__name__}" for n, m in base.named_children()]}


def layer_fields(config: Any) -> dict[str, dict[str, Any]]:
    """Per tower: config fields holding one entry per layer, fields listing layer indices, integers naming layers."""
    out = {}
    for tower in ("text_config", "vision_config"):
        sub = getattr(config, tower, None)
        if sub is None:
            continue
        d = sub.to_dict()
        n = d.get("num_hidden_layers", d.get("depth"))
        per, idx, scalar = {}, {}, {}
        for k, v in d.items():
            if isinstance(v, list) and len(v) == n:
                per[k] = v
            elif isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                idx[k] = v
            elif ("layers" in k or k.endswith(("layer_step", "layer_interval"))) and isinstance(v, int) \
                    and not isinstance(v, bool) and k != "num_hidden_layers":
                scalar[k] = v
        out[tower] = {"n_layers": n, "per_layer": per, "index_lists": idx, "layer_ints": scalar}
    top = {k: v for k, v in config.to_dict().items() if "layer" in k and not isinstance(v, dict)}
    out["wrapper"] = top
    return out


def saved_prefixes(model: Any, tok: Any) -> dict[str, Any]:
    """The key prefixes and files ``save_pretrained`` writes, and whether the directory reloads."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        tok.save_pretrained(d)
        keys = []
        for f in sorted(Path(d).glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                keys += list(st.keys())
        prefixes = sorted({k.split(".layers.")[0] + ".layers" if ".layers." in k else
                           k.split(".blocks.")[0] + ".blocks" if ".blocks." in k else k.rsplit(".", 1)[0] for k in keys})
        files = sorted(p.name for p in Path(d).iterdir())
        again = AutoModelForImageTextToText.from_pretrained(d)
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    return {"files": files, "key_prefixes": prefixes, "reload_equal": same}


# ---------------------------------------------------------------------------------------------- behaviour
@contextlib.contextmanager
def skipped(block: torch.nn.Module):
    """``block`` passes its input hidden state through unchanged while in the block."""
    def hook(mod: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = block.register_forward_hook(hook, with_kwargs=True, prepend=True)  # before transformers'
    # output-capturing hook, which would otherwise record the block's real output as hidden_states[i]
    try:
        yield
    finally:
        handle.remove()


def _logits(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits.float()


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - recorded: the survey's point is what fails
        return f"ERROR {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def block_use(model: Any, path: str, inputs: dict[str, Any]) -> list[float]:
    """Max |logit change| when each block of the list at ``path`` is skipped in turn (0.0: the block is unused)."""
    full = _logits(model, inputs)
    out = []
    for block in model.get_submodule(path):
        with skipped(block):
            out.append(float((_logits(model, inputs) - full).abs().max()))
    return out


def behaviour(model_type: str, model: Any, tok: Any) -> dict[str, Any]:
    """Text-only and image+text forward and generate; whether the image matters; which blocks are used."""
    text = {"input_ids": _ids(tok, "<bos>A small picture of")}
    img, how = image_inputs(model_type, tok, seed=1)
    other, _ = image_inputs(model_type, tok, seed=2)
    res: dict[str, Any] = {"image_inputs": how,
                           "input_shapes": {k: list(v.shape) for k, v in img.items() if hasattr(v, "shape")},
                           "n_image_tokens": int((img["input_ids"] == model.config.image_token_id).sum())
                           if getattr(model.config, "image_token_id", None) is not None else None}
    res["forward_text"] = _try(lambda: list(_logits(model, text).shape))
    res["forward_image"] = _try(lambda: list(_logits(model, img).shape))
    res["image_changes_logits"] = _try(lambda: float((_logits(model, img)[0, -1] - _logits(model, other)[0, -1])
                                                     .abs().max()))
    gen = {"max_new_tokens": 3, "do_sample": False}
    res["generate_text"] = _try(lambda: model.generate(**text, **gen)[0, -3:].tolist())
    res["generate_image"] = _try(lambda: model.generate(**img, **gen)[0, -3:].tolist())
    uses = {}
    for entry in layout(model)["lists"]:
        if entry["n"] > 1 and "merger" not in entry["path"]:
            uses[entry["path"]] = {"image+text": _try(lambda p=entry["path"]: block_use(model, p, img)),
                                   "text": _try(lambda p=entry["path"]: block_use(model, p, text))}
    res["block_use"] = uses
    if isinstance(res["forward_text"], str) and model_type == "llama4":
        res["parts_forward_image"] = _try(lambda: list(llama4_parts(model, img).shape))
    return res


def llama4_parts(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """Llama 4's image+text logits computed from its parts, as its ``forward`` would (transformers 5.24's
    ``Llama4ForConditionalGeneration.forward`` reads ``image_outputs`` off the language model's output and raises)."""
    with torch.no_grad():
        feats = model.get_image_features(pixel_values=inputs["pixel_values"], return_dict=True).last_hidden_state
        proj = model.multi_modal_projector(feats.view(-1, feats.size(-1)))
        emb = model.get_input_embeddings()(inputs["input_ids"])
        emb = emb.masked_scatter((inputs["input_ids"] == model.config.image_token_id)[..., None], proj)
        return model.language_model(inputs_embeds=emb).logits


def survey(model_type: str) -> dict[str, Any]:
    model, tok = build(model_type)
    return {"model_type": model_type, "parameters": sum(p.numel() for p in model.parameters()),
            "layout": layout(model), "config": layer_fields(model.config),
            "saved": _try(lambda: saved_prefixes(model, tok)), "behaviour": behaviour(model_type, model, tok)}


def main(argv: list[str]) -> int:
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    results = {}
    for model_type in argv or list(WRAPPERS):
        try:
            results[model_type] = survey(model_type)
        except Exception:  # noqa: BLE001 - a survey records every failure and goes on
            results[model_type] = {"model_type": model_type, "error": traceback.format_exc(limit=-3)}
        print(model_type, "done", file=sys.stderr)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    out = HERE / ("survey.json" if not argv else "survey-partial.json")
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(table(results))
    return 0



# ---------------------------------------------------------------------------------------------- the table
def _ok(value: Any) -> str:
    return "fails" if isinstance(value, str) and value.startswith("ERROR") else "ok"


def _towers(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the language block list, the vision block list) of a surveyed wrapper, told apart by their lengths."""
    lists = r["layout"]["lists"]
    lang = next(x for x in lists if x["n"] == r["config"]["text_config"]["n_layers"] and "embed_tokens" in x["container"])
    vis = next(x for x in lists if x["n"] == r["config"]["vision_config"]["n_layers"] and x is not lang)
    return lang, vis


def _fields(cfg: dict[str, Any]) -> str:
    names = [*cfg["per_layer"], *(f"{k} (indexes)" for k in cfg["index_lists"]), *cfg["layer_ints"]]
    return ", ".join(f"`{n}`" for n in names) or "–"


def _unused(r: dict[str, Any], path: str) -> str:
    use = r["behaviour"]["block_use"].get(path, {}).get("image+text")
    if not isinstance(use, list):
        return "n/a"
    idle = [str(i) for i, d in enumerate(use) if d == 0.0]
    return ", ".join(idle) or "none"


def table(results: dict[str, dict[str, Any]]) -> str:
    """The survey as a markdown table: one row per wrapper."""
    rows = ["| model_type | class | language blocks | vision blocks | checkpoint prefixes (language; vision) "
            "| per-layer config: text | per-layer config: vision, wrapper | text fwd/gen | image fwd/gen "
            "| vision blocks unused |", "|" + "---|" * 10]
    for t, r in results.items():
        if "error" in r:
            rows.append(f"| {t} | build fails | | | | | | | | |")
            continue
        lang, vis = _towers(r)
        pre = [p for p in r["saved"]["key_prefixes"] if p.endswith((".layers", ".blocks"))] \
            if isinstance(r["saved"], dict) else []
        b = r["behaviour"]
        wrap = ", ".join(f"`{k}={v}`" for k, v in r["config"]["wrapper"].items())
        vfields = "; ".join(x for x in (_fields(r["config"]["vision_config"]), wrap) if x and x != "–") or "–"
        rows.append(f"| {t} | {r['layout']['class']} | `{lang['path']}` ({lang['n']}) | `{vis['path']}` ({vis['n']}) "
                    f"| {'; '.join(f'`{p}`' for p in pre)} | {_fields(r['config']['text_config'])} | {vfields} "
                    f"| {_ok(b['forward_text'])}/{_ok(b['generate_text'])} "
                    f"| {_ok(b['forward_image'])}/{_ok(b['generate_image'])} | {_unused(r, vis['path'])} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
