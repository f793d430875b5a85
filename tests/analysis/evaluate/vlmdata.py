"""A tiny random LLaVA (CLIP vision tower of 2 blocks, Llama text tower of 2 blocks) saved with its processor, and
MMMU-format image-text task files: the fixtures of the image-text evaluation tests."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

#: tokenizer vocabulary: 0..2 specials, 3..258 the bytes, then the image token and (``merged``) " A" .. " D" as one token
IMAGE_TOKEN = "<image>"


def tiny_tokenizer(merged: bool) -> Any:
    """A byte-level tokenizer; ``merged``: the letters after a space (" A") are single tokens, as in real BPEs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{ch: 3 + i for i, ch in enumerate(byte)}, IMAGE_TOKEN: 259}
    merges = []
    if merged:
        for letter in "ABCD":
            vocab["Ġ" + letter] = len(vocab)
            merges.append(("Ġ", letter))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<pad>", "<s>", "</s>", IMAGE_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   extra_special_tokens={"image_token": IMAGE_TOKEN})


def tiny_llava(out: Path, merged: bool = True, seed: int = 0) -> Path:
    """Save a random LLaVA (32x32 pictures, 16 patches, vocabulary 300) and its LlavaProcessor into ``out``."""
    import torch
    import transformers as tf

    tok = tiny_tokenizer(merged)
    cfg = tf.LlavaConfig(
        vision_config={"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32, "patch_size": 8,
                       "projection_dim": 32},
        text_config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
                     "max_position_embeddings": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN), vision_feature_layer=-1, image_seq_length=16)
    torch.manual_seed(seed)
    model = tf.LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # a larger init: the tiny model's choices then differ clearly from one another
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    ip = tf.LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    proc = tf.LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                             num_additional_image_tokens=1,
                             chat_template="{% for m in messages %}USER: {% for c in m['content'] %}"
                                           "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}"
                                           "{% endfor %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}ASSISTANT: "
                                           "{% endif %}")
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


def png_bytes(seed: int, size: int = 24) -> bytes:
    """A random RGB picture, PNG-encoded."""
    import torch
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size, size, 3, generator=g) * 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def mmmu_rows(folder: Path) -> list[dict[str, Any]]:
    """Three MMMU-style rows (pictures written into ``folder``): an inline ``<image 1>``, two images of which one is
    named in an option and one is not, and an open question (to be skipped)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(3):
        (folder / f"p{k}.png").write_bytes(png_bytes(k))
    return [
        {"id": "a", "question": "What is drawn in <image 1>?", "options": "['a cat', 'a dog', 'a cow']",
         "answer": "B", "image_1": "p0.png", "question_type": "multiple-choice"},
        {"id": "b", "question": "Which picture matches?", "options": ["<image 2>", "neither"], "answer": "A",
         "image_1": "p1.png", "image_2": "p2.png", "question_type": "multiple-choice"},
        {"id": "c", "question": "How many?", "options": "[]", "answer": "3", "image_1": "p0.png",
         "question_type": "open"},
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
