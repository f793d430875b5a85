"""Bad input to every command: exit 2, one stderr line naming the bad value, no traceback, nothing
created or changed. In-process through ``depthlab.cli.main`` (fast); a few through a real interpreter."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthlab import from_preset
from depthlab.base.fileio import sha256_file
from depthlab.cli import main
from depthlab.train import TrainConfig, train

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--tokenizer", "bytes",
        "--seq-len", "16", "--batch-size", "4", "--eval-tokens", "128", "--steps", "2", "--device", "cpu", "-q"]
TINY_ANY_STEPS = [a for i, a in enumerate(TINY) if "--steps" not in TINY[max(i - 1, 0):i + 1]]  # the steps from a file


def _rewrite_checkpoints(run: Path, config=None, tensors=None) -> None:
    """Change every checkpoint of ``run`` (its config.json and / or its weights) with consistent checksums: what
    a damaged but self-consistent run looks like to depthlab."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for ckpt in (run / "checkpoint").iterdir():
        if config is not None:
            cfg = json.loads((ckpt / "config.json").read_text())
            config(cfg)
            (ckpt / "config.json").write_text(json.dumps(cfg))
        if tensors is not None:
            with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
                meta = f.metadata()
            weights = load_file(str(ckpt / "model.safetensors"))
            tensors(weights)
            save_file(weights, str(ckpt / "model.safetensors"), metadata=meta)
        state = json.loads((ckpt / "trainer_state.json").read_text())
        for name in ("config.json", "model.safetensors"):
            state["files"][name] = (ckpt / name).stat().st_size
            state["sha256"][name] = sha256_file(ckpt / name)
        (ckpt / "trainer_state.json").write_text(json.dumps(state))


def _hf_dirs(ws: Path) -> None:
    """A tiny HF Llama (``hf``), one whose config.json claims a layer more than its weights hold (``hf_more``) and
    one with a NaN weight (``hf_nan``)."""
    from safetensors.torch import load_file, save_file

    from depthlab.hf.tiny import tiny_model

    tiny_model("llama", num_hidden_layers=2).save_pretrained(ws / "hf")
    shutil.copytree(ws / "hf", ws / "hf_more")
    cfg = json.loads((ws / "hf_more" / "config.json").read_text())
    (ws / "hf_more" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    shutil.copytree(ws / "hf", ws / "hf_nan")
    weights = load_file(str(ws / "hf_nan" / "model.safetensors"))
    next(v for k, v in sorted(weights.items()) if "mlp" in k)[0, 0] = float("nan")
    save_file(weights, str(ws / "hf_nan" / "model.safetensors"), metadata={"format": "pt"})


def _stream_dirs(ws: Path) -> None:
    """A tiny sharded HF Llama with its tokenizer (``st``) and one damaged copy per way the streamed engine must
    refuse before its first layer (issue 33): config.json claiming fewer layers than the weights hold, a NaN
    weight, int32 weights, a shape mismatch, a tensor the index names but its shard lacks, a shard cut short, an
    empty shard; and an HF directory whose ``pytorch_model.bin`` pickles more than tensors."""
    import torch
    from safetensors.torch import load_file, save_file
    from tiny_models import hf_dir

    base = hf_dir(ws, "llama", 3, max_shard_size="40KB").rename(ws / "st")

    def variant(name: str, edit=None, config=None) -> None:
        shutil.copytree(base, ws / name)
        if config is not None:
            cfg = json.loads((ws / name / "config.json").read_text())
            (ws / name / "config.json").write_text(json.dumps({**cfg, **config}))
        if edit is not None:
            shard = next(f for f in sorted((ws / name).glob("*.safetensors"))[::-1]
                         if any("mlp" in k for k in load_file(str(f))))  # the shard of the last MLP weights
            weights = load_file(str(shard))
            edit(weights, max(k for k in weights if "mlp" in k))
            save_file(weights, str(shard), metadata={"format": "pt"})

    def cut(name: str, keep) -> None:
        shutil.copytree(base, ws / name)
        shard = sorted((ws / name).glob("*.safetensors"))[-1]
        shard.write_bytes(shard.read_bytes()[:keep(shard.stat().st_size)])

    variant("st_cfg2", config={"num_hidden_layers": 2})
    variant("st_nan", lambda w, k: w[k].view(-1).__setitem__(0, float("nan")))
    variant("st_int", lambda w, k: w.__setitem__(k, (100 * w[k]).to(torch.int32)))
    variant("st_shape", lambda w, k: w.__setitem__(k, w[k][:-1].clone()))
    variant("st_missing", lambda w, k: w.pop(k))
    cut("st_trunc", lambda n: n // 2)
    cut("st_zero", lambda n: 0)
    (ws / "hf_pickle").mkdir()
    shutil.copy(ws / "hf" / "config.json", ws / "hf_pickle")
    torch.save({"weight": torch.zeros(1), "code": dict}, ws / "hf_pickle" / "pytorch_model.bin")


def _config_files(ws: Path) -> None:
    """``--config`` files holding values the flags would refuse, or of the wrong type (issue 33)."""
    files = {"steps_huge.json": {"steps": 1e26}, "heal_huge.json": {"remove": 1, "heal_steps": 1e22},
             "tokens_huge.json": {"tokens": 1e20}, "data_int.json": {"data": 5}, "schemes_int.json": {"schemes": 5},
             "plots_word.json": {"no_plots": "maybe"}, "d_model_huge.json": {"model": {"d_model": 1048576}},
             "layers_huge.json": {"model": {"n_layers": 100000000}}}
    for name, data in files.items():
        (ws / name).write_text(json.dumps(data))
    (ws / "a_dir").mkdir()
    (ws / "dangling").symlink_to(ws / "nowhere")


def _bad_files(ws: Path) -> None:
    """Task and SFT files that must be refused, each for one reason."""
    def jsonl(name: str, *rows) -> None:
        (ws / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    ok = {"context": "The sky is", "choices": ["blue", "green"], "answer": 0}
    jsonl("one_choice.jsonl", ok, {"question": "Which?", "choices": {"text": ["only"], "label": ["A"]},
                                   "answerKey": "A"})
    jsonl("one_ending.jsonl", {"ctx": "He opens the door and", "endings": ["walks in."], "label": 0})
    jsonl("context_null.jsonl", ok, {"context": None, "choices": ["a", "b"], "answer": 1})
    jsonl("empty_choices.jsonl", {"context": "Pick", "choices": ["", ""], "answer": 0})
    sft = {"instruction": "Say hi.", "input": "", "output": "hi"}
    jsonl("input_zero.jsonl", sft, sft, {"instruction": "Say hi.", "input": 0, "output": "hi"})
    (ws / "trunc.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x01")  # the header cut short
    (ws / "report").mkdir()
    (ws / "report" / "report.json").write_text("{}")


def _vlm_files(ws: Path) -> None:
    """A tiny image-text wrapper (LLaVA), an image folder with a file that is not an image, MMMU-format files with a
    missing image and with no answer."""
    from PIL import Image

    from depthlab.hf.tiny import save_tiny_wrapper

    save_tiny_wrapper("llava", ws / "vlm")
    for cls in ("cat", "dog"):
        (ws / "imgs" / cls).mkdir(parents=True)
        Image.new("RGB", (8, 8), (200, 10, 10)).save(ws / "imgs" / cls / "a.png")
    (ws / "imgs" / "dog" / "junk.png").write_bytes(b"not a picture" * 4)
    Image.new("RGB", (8, 8)).save(ws / "pic.png")
    row = {"id": "q1", "question": "<image 1> What colour?", "options": "['red', 'blue']", "answer": "A",
           "image_1": "pic.png"}
    (ws / "vlm_noimage.jsonl").write_text(json.dumps({**row, "image_1": "nope.png"}) + "\n")
    (ws / "vlm_noanswer.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "answer"}) + "\n")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace: a trained tiny run, a copy whose weights do not match its config, one with a NaN weight,
    tiny HF models (one claiming more layers than it holds, one with a NaN weight), and bad files."""
    ws = tmp_path_factory.mktemp("ws")
    data = ws / "corpus.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"Line {i} of a small corpus, words and words. " * 6})
                              for i in range(80)) + "\n")
    model = from_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
    train(model, TrainConfig(data=str(data), tokenizer="bytes", steps=2, seq_len=16, batch_size=4, eval_tokens=128,
                             device="cpu"), ws / "run", quiet=True)
    shutil.copytree(ws / "run", ws / "mismatch")
    _rewrite_checkpoints(ws / "mismatch", config=lambda c: c["model"].update(d_model=64))  # config != weights
    shutil.copytree(ws / "run", ws / "nanrun")
    _rewrite_checkpoints(ws / "nanrun", tensors=lambda w: next(v for k, v in sorted(w.items()) if "blocks.1." in k
                                                               and v.is_floating_point()).view(-1)[0].fill_(float("nan")))
    _hf_dirs(ws)
    _stream_dirs(ws)
    _config_files(ws)
    _bad_files(ws)
    _vlm_files(ws)
    (ws / "a_file").write_text("I am a file\n")
    (ws / "empty.txt").write_text("\n\n")
    (ws / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9?", "choices": ["a", "b"], "answer": 0}\n')
    (ws / "garbage.parquet").write_bytes(b"this is not parquet at all" * 10)
    (ws / "full").mkdir()
    (ws / "full" / "x").write_text("x")
    return ws


def snapshot(root: Path) -> dict:
    """Every path under root with its size and mtime (.lock: the PID of its last holder, not run content)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")
            if p.name != ".lock"}


#: (id, argv with {ws} for the workspace, a string the error line must contain)
CASES = [
    # ---- train
    ("train-device", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--device", "tpu9", "--out", "{ws}/new"], "tpu9"),
    ("train-lr-huge", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "1e39", "--out", "{ws}/new"], "1e+39"),
    ("train-lr-nan", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "nan", "--out", "{ws}/new"], "nan"),
    ("train-lr-negative", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--lr", "-1", "--out", "{ws}/new"], "-1"),
    ("train-init-std-nan", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--set", "init_std=nan",
                            "--out", "{ws}/new"],
     "init_std"),
    ("train-unknown-field", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--set", "n_layerz=2", "--out", "{ws}/new"],
     "n_layerz"),
    ("train-seq-len", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--seq-len", "100000", "--out", "{ws}/new"],
     "100000"),
    ("train-missing-data", ["train", *TINY, "--data", "{ws}/nope.jsonl", "--out", "{ws}/new"], "nope.jsonl"),
    ("train-garbage-parquet", ["train", *TINY, "--data", "{ws}/garbage.parquet", "--out", "{ws}/new"],
     "garbage.parquet"),
    ("train-empty-data", ["train", *TINY, "--data", "{ws}/empty.txt", "--out", "{ws}/new"], "empty.txt"),
    ("train-out-is-file", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/a_file"], "a_file"),
    ("train-out-under-file", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/a_file/run"], "a_file"),
    ("train-out-existing", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--out", "{ws}/run"], "run"),
    ("train-tokenizer", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--tokenizer", "sentencepiece:9",
                         "--out", "{ws}/new"], "sentencepiece:9"),
    ("train-micro-batch", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--micro-batch-size", "3",
                           "--out", "{ws}/new"], "micro_batch_size=3"),
    ("train-steps-zero", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--steps", "0", "--out", "{ws}/new"], "steps"),
    ("train-resume-not-run", ["train", "--resume", "{ws}/full"], "full"),
    ("train-init-from-missing", ["train", "--init-from", "{ws}/nope", "--out", "{ws}/new"], "nope"),
    ("train-init-from-not-a-model", ["train", "--init-from", "{ws}/full", "--out", "{ws}/new"], "full"),
    ("train-init-from-and-preset", ["train", "--init-from", "{ws}/run", "--preset", "tiny", "--out", "{ws}/new"],
     "--preset"),
    ("train-init-from-and-resume", ["train", "--init-from", "{ws}/run", "--resume", "{ws}/run"], "--init-from"),
    ("train-resume-scheme", ["train", "--resume", "{ws}/run", "--scheme", "lns"], "scheme"),
    ("train-resume-lr", ["train", "--resume", "{ws}/run", "--lr", "0.5"], "lr=0.5"),
    ("train-resume-allow-steps", ["train", "--resume", "{ws}/run", "--steps", "9", "--allow-changed", "steps"],
     "steps"),
    ("train-allow-without-resume", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--allow-changed", "lr",
                                    "--out", "{ws}/new"], "allow-changed"),
    ("train-seed-negative", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--seed=-1", "--out", "{ws}/new"],
     "seed -1"),
    ("train-seed-huge", ["train", *TINY, "--data", "{ws}/corpus.jsonl", "--seed", "99999999999999999999",
                         "--out", "{ws}/new"], "99999999999999999999"),
    ("train-vit-text-data", ["train", "--preset", "vit-tiny", "--data", "{ws}/corpus.jsonl", "--steps", "2",
                             "--device", "cpu", "-q", "--out", "{ws}/new"], "corpus.jsonl"),
    ("train-init-from-hf-more-layers", ["train", "--init-from", "{ws}/hf_more", "--data", "{ws}/corpus.jsonl",
                                        "--out", "{ws}/new"], "3 layers"),
    ("train-init-from-nan-run", ["train", "--init-from", "{ws}/nanrun", "--data", "{ws}/corpus.jsonl",
                                 "--out", "{ws}/new"], "NaN"),
    # ---- diagnose
    ("diagnose-seq-len-run", ["diagnose", "{ws}/run", "--seq-len", "4096", "--out", "{ws}/new"], "4096"),
    ("diagnose-seq-len-preset", ["diagnose", "preset:tiny", "--seq-len", "100000", "--out", "{ws}/new"], "100000"),
    ("diagnose-out-is-file", ["diagnose", "{ws}/run", "--out", "{ws}/a_file"], "a_file"),
    ("diagnose-mc-latin1", ["diagnose", "{ws}/run", "--mc", "{ws}/latin1.jsonl", "--tokens", "64", "--device", "cpu",
                            "--out", "{ws}/new"], "latin1.jsonl"),
    ("diagnose-mc-missing", ["diagnose", "{ws}/run", "--mc", "{ws}/nope.jsonl", "--out", "{ws}/new"], "nope.jsonl"),
    ("diagnose-vision-of-text-model", ["diagnose", "{ws}/hf", "--tower", "vision", "--out", "{ws}/new"], "text-only"),
    ("diagnose-stream-vision-of-text-model", ["diagnose", "{ws}/st", "--stream", "--tower", "vision", "--out",
                                              "{ws}/new"], "text-only"),
    ("diagnose-vision-unreadable-image", ["diagnose", "{ws}/vlm", "--tower", "vision", "--data", "{ws}/imgs",
                                          "--out", "{ws}/new"], "junk.png"),
    ("diagnose-vision-missing-image", ["diagnose", "{ws}/vlm", "--tower", "vision", "--data",
                                       "{ws}/vlm_noimage.jsonl", "--out", "{ws}/new"], "nope.png"),
    ("diagnose-vision-no-answer", ["diagnose", "{ws}/vlm", "--tower", "vision", "--data", "{ws}/vlm_noanswer.jsonl",
                                   "--stream", "--out", "{ws}/new"], "answer"),
    ("diagnose-missing-target", ["diagnose", "{ws}/no-such-run", "--out", "{ws}/new"], "no-such-run"),
    ("diagnose-device", ["diagnose", "{ws}/run", "--device", "tpu9", "--out", "{ws}/new"], "tpu9"),
    ("diagnose-tokens", ["diagnose", "{ws}/run", "--tokens", "0", "--out", "{ws}/new"], "--tokens"),
    ("diagnose-mismatch", ["diagnose", "{ws}/mismatch", "--device", "cpu", "--out", "{ws}/new"], "mismatch"),
    ("diagnose-mc-one-choice", ["diagnose", "{ws}/run", "--mc", "{ws}/one_choice.jsonl", "--out", "{ws}/new"],
     "one_choice.jsonl:2"),
    ("diagnose-out-is-run", ["diagnose", "{ws}/run", "--device", "cpu", "--out", "{ws}/run"], "run directory"),
    ("diagnose-out-is-hf-model", ["diagnose", "{ws}/run", "--device", "cpu", "--out", "{ws}/hf"], "model directory"),
    ("diagnose-out-has-report", ["diagnose", "{ws}/run", "--device", "cpu", "--out", "{ws}/report"], "report.json"),
    ("diagnose-scheme-on-run", ["diagnose", "{ws}/run", "--scheme", "lns", "--out", "{ws}/new"], "--scheme lns"),
    ("diagnose-nan-run", ["diagnose", "{ws}/nanrun", "--device", "cpu", "--out", "{ws}/new"], "NaN"),
    ("diagnose-nan-hf", ["diagnose", "{ws}/hf_nan", "--device", "cpu", "--out", "{ws}/new"], "NaN"),
    ("diagnose-hf-more-layers", ["diagnose", "{ws}/hf_more", "--device", "cpu", "--out", "{ws}/new"], "3 layers"),
    ("diagnose-truncated-gguf", ["diagnose", "{ws}/trunc.gguf", "--device", "cpu", "--out", "{ws}/new"],
     "trunc.gguf"),
    ("diagnose-loss-budget-nan", ["diagnose", "{ws}/run", "--loss-budget", "nan", "--out", "{ws}/new"],
     "--loss-budget nan"),
    ("diagnose-jac-layers-zero", ["diagnose", "{ws}/run", "--jac-layers", "0", "--out", "{ws}/new"],
     "--jac-layers 0"),
    # ---- issue 33: the streamed engine checks the whole checkpoint before its first layer
    ("diagnose-stream-weights-beyond-config", ["diagnose", "{ws}/st_cfg2", "--stream", "--device", "cpu",
                                               "--out", "{ws}/new"], "config.json says 2 layers, but the weights hold"),
    ("prune-stream-weights-beyond-config", ["prune", "{ws}/st_cfg2", "--stream", "--remove", "1", "--device", "cpu",
                                            "--out", "{ws}/new"], "layer(s) [2]"),
    ("diagnose-stream-nan", ["diagnose", "{ws}/st_nan", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "NaN/inf weights (model.layers.2.mlp"),
    ("prune-stream-nan", ["prune", "{ws}/st_nan", "--stream", "--remove", "1", "--device", "cpu", "--out", "{ws}/new"],
     "NaN/inf weights"),
    ("diagnose-stream-int32", ["diagnose", "{ws}/st_int", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "stored as I32"),
    ("diagnose-stream-shape", ["diagnose", "{ws}/st_shape", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "is [63, 32], the config makes it [64, 32]"),
    ("diagnose-stream-index-lies", ["diagnose", "{ws}/st_missing", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "but that file does not hold it"),
    ("diagnose-stream-truncated", ["diagnose", "{ws}/st_trunc", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "is cut short"),
    ("prune-stream-truncated", ["prune", "{ws}/st_trunc", "--stream", "--remove", "1", "--device", "cpu",
                                "--out", "{ws}/new"], "is cut short"),
    ("diagnose-stream-empty-shard", ["diagnose", "{ws}/st_zero", "--stream", "--device", "cpu", "--out", "{ws}/new"],
     "is empty (0 bytes)"),
    # ---- issue 33: --config values pass the flags' checks, the work is estimated first
    ("train-config-steps-huge", ["train", *TINY_ANY_STEPS, "--config", "{ws}/steps_huge.json", "--data", "{ws}/corpus.jsonl",
                                 "--out", "{ws}/new"], "tokens, more than depthlab accepts"),
    ("train-steps-huge", ["train", *TINY, "--steps", "10000000000000000", "--data", "{ws}/corpus.jsonl",
                          "--out", "{ws}/new"], "lower --steps"),
    ("prune-config-heal-steps-huge", ["prune", "{ws}/run", "--config", "{ws}/heal_huge.json", "--out", "{ws}/new"],
     "--heal-steps 10000000000000000000000"),
    ("diagnose-config-tokens-huge", ["diagnose", "{ws}/run", "--config", "{ws}/tokens_huge.json", "--out", "{ws}/new"],
     "--tokens 100000000000000000000"),
    ("train-config-d-model-huge", ["train", "--config", "{ws}/d_model_huge.json", "--tokenizer", "bytes", "--data",
                                   "{ws}/corpus.jsonl", "--out", "{ws}/new"], "d_model=1048576"),
    ("train-config-n-layers-huge", ["train", "--config", "{ws}/layers_huge.json", "--tokenizer", "bytes", "--data",
                                    "{ws}/corpus.jsonl", "--out", "{ws}/new"], "n_layers=100000000"),
    ("train-memory", ["train", *TINY, "--set", "d_model=65536", "--set", "n_heads=64", "--set", "d_ff=65536",
                      "--data", "{ws}/corpus.jsonl", "--out", "{ws}/new"], "GiB for weights, gradients and Adam"),
    ("train-config-data-int", ["train", *TINY, "--config", "{ws}/data_int.json", "--out", "{ws}/new"],
     "data must be a string, got 5"),
    ("compare-config-schemes-int", ["compare", "--config", "{ws}/schemes_int.json", "--out", "{ws}/new"],
     "schemes must be a list of strings, got 5"),
    ("train-config-bool-word", ["train", *TINY, "--config", "{ws}/plots_word.json", "--data", "{ws}/corpus.jsonl",
                                "--out", "{ws}/new"], "no_plots must be true or false, got 'maybe'"),
    ("train-config-directory", ["train", *TINY, "--config", "{ws}/a_dir", "--out", "{ws}/new"], "is a directory"),
    ("train-wandb-empty", ["train", *TINY, "--wandb", "", "--data", "{ws}/corpus.jsonl", "--out", "{ws}/new"],
     "--wandb '' names nothing"),
    ("diagnose-jac-layers-twice", ["diagnose", "{ws}/run", "--jac-layers", "1,1", "--out", "{ws}/new"],
     "--jac-layers 1,1 names a block twice"),
    ("diagnose-jac-layers-beyond", ["diagnose", "{ws}/run", "--jac-layers", "99", "--device", "cpu",
                                    "--out", "{ws}/new"], "the model has blocks 1..2"),
    ("prune-out-dangling-symlink", ["prune", "{ws}/run", "--remove", "1", "--out", "{ws}/dangling"],
     "which does not exist"),
    ("prune-bad-unit-no-out", ["prune", "{ws}/run", "--unit", "nope"], "unknown --unit 'nope'"),  # the value first
    ("diagnose-hf-pickle", ["diagnose", "{ws}/hf_pickle", "--device", "cpu", "--out", "{ws}/new"],
     "refusing to unpickle"),
    # ---- export
    ("export-hf-is-file", ["export", "{ws}/run", "--hf", "{ws}/a_file"], "a_file"),
    ("export-hf-under-file", ["export", "{ws}/run", "--hf", "{ws}/a_file/hf"], "a_file"),
    ("export-hf-not-empty", ["export", "{ws}/run", "--hf", "{ws}/full"], "full"),
    ("export-missing-run", ["export", "{ws}/no-such-run", "--hf", "{ws}/new"], "no-such-run"),
    ("export-mismatch", ["export", "{ws}/mismatch", "--hf", "{ws}/new"], "mismatch"),
    # ---- tokenize
    ("tokenize-empty", ["tokenize", "--data", "{ws}/empty.txt", "--tokenizer", "bytes", "--out", "{ws}/new"],
     "empty.txt"),
    ("tokenize-missing", ["tokenize", "--data", "{ws}/nope.txt", "--tokenizer", "bytes", "--out", "{ws}/new"],
     "nope.txt"),
    ("tokenize-tokenizer", ["tokenize", "--data", "{ws}/corpus.jsonl", "--tokenizer", "sentencepiece:9",
                            "--out", "{ws}/new"], "sentencepiece:9"),
    ("tokenize-out-is-file", ["tokenize", "--data", "{ws}/corpus.jsonl", "--tokenizer", "bytes",
                              "--out", "{ws}/a_file"], "a_file"),
    ("tokenize-garbage-parquet", ["tokenize", "--data", "{ws}/garbage.parquet", "--tokenizer", "bytes",
                                  "--out", "{ws}/new"], "garbage.parquet"),
    # ---- theory
    ("theory-out-is-file", ["theory", "--no-empirical", "--out", "{ws}/a_file"], "a_file"),
    ("theory-out-under-file", ["theory", "--no-empirical", "--out", "{ws}/a_file/t"], "a_file"),
    ("theory-depth", ["theory", "--depth", "1", "--no-empirical", "--out", "{ws}/new"], "depth"),
    ("theory-seeds", ["theory", "--seeds", "a,b", "--empirical-depth", "4", "--out", "{ws}/new"], "a,b"),
    # ---- compare
    ("compare-unknown-scheme", ["compare", "--schemes", "pre,foo", "--out", "{ws}/new"], "foo"),
    ("compare-twice", ["compare", "--schemes", "pre,pre", "--out", "{ws}/new"], "pre"),
    ("compare-seeds", ["compare", "--schemes", "pre", "--seeds", "x", "--out", "{ws}/new"], "x"),
    ("compare-out-is-file", ["compare", "--schemes", "pre", "--out", "{ws}/a_file"], "a_file"),
    ("compare-out-is-a-run", ["compare", "--schemes", "pre,lns", "--out", "{ws}/run"], "not a compare"),  # no .lock left
    ("compare-set-scheme", ["compare", "--schemes", "pre", "--set", "scheme=lns", "--out", "{ws}/new"], "scheme"),
    ("compare-preset", ["compare", "--schemes", "pre", "--preset", "llama-1z", "--out", "{ws}/new"], "llama-1z"),
    ("compare-seeds-negative", ["compare", "--schemes", "pre", "--seeds=-1", "--out", "{ws}/new"], "--seeds -1"),
    ("compare-seeds-huge", ["compare", "--schemes", "pre", "--seeds", "99999999999999999999", "--out", "{ws}/new"],
     "99999999999999999999"),
    ("compare-seeds-comma", ["compare", "--schemes", "pre", "--seeds", ",", "--out", "{ws}/new"], "','"),
    ("compare-jobs-zero", ["compare", "--schemes", "pre", "--jobs", "0", "--out", "{ws}/new"], "--jobs 0"),
    ("compare-jobs-negative", ["compare", "--schemes", "pre", "--jobs=-2", "--out", "{ws}/new"], "--jobs -2"),
    ("compare-vit-text-data", ["compare", "--schemes", "pre", "--preset", "vit-tiny", "--data", "{ws}/corpus.jsonl",
                               "--out", "{ws}/new"], "corpus.jsonl"),
    ("compare-diag-tokens", ["compare", "--schemes", "pre", "--diag-tokens", "0", "--out", "{ws}/new"],
     "--diag-tokens 0"),
    ("compare-diag-mc-empty-choices", ["compare", "--schemes", "pre", "--diag-mc", "{ws}/empty_choices.jsonl",
                                       "--out", "{ws}/new"], "empty_choices.jsonl:1"),
    # ---- prune
    ("prune-out-is-file", ["prune", "{ws}/run", "--remove", "1", "--out", "{ws}/a_file"], "a_file"),
    ("prune-vision-of-text-model", ["prune", "{ws}/hf", "--tower", "vision", "--remove", "1", "--out", "{ws}/new"],
     "text-only"),
    ("prune-vision-unreadable-image", ["prune", "{ws}/vlm", "--tower", "vision", "--data", "{ws}/imgs", "--remove",
                                       "1", "--stream", "--out", "{ws}/new"], "junk.png"),
    ("prune-vision-no-answer", ["prune", "{ws}/vlm", "--tower", "vision", "--data", "{ws}/vlm_noanswer.jsonl",
                                "--remove", "1", "--out", "{ws}/new"], "answer"),
    ("prune-missing-target", ["prune", "{ws}/no-such-run", "--remove", "1", "--out", "{ws}/new"], "no-such-run"),
    ("prune-too-many", ["prune", "{ws}/run", "--remove", "5", "--device", "cpu", "--out", "{ws}/new"], "5"),
    ("prune-block-range", ["prune", "{ws}/run", "--blocks", "9", "--device", "cpu", "--out", "{ws}/new"], "9"),
    ("prune-mismatch", ["prune", "{ws}/mismatch", "--remove", "1", "--device", "cpu", "--out", "{ws}/new"],
     "mismatch"),
    ("prune-remove-zero", ["prune", "{ws}/run", "--remove", "0", "--out", "{ws}/new"], "--remove 0"),
    ("prune-remove-negative", ["prune", "{ws}/run", "--remove=-1", "--out", "{ws}/new"], "--remove -1"),
    ("prune-blocks-zero", ["prune", "{ws}/run", "--blocks", "0", "--out", "{ws}/new"], "--blocks 0"),
    ("prune-blocks-negative", ["prune", "{ws}/run", "--blocks=-1", "--out", "{ws}/new"], "--blocks -1"),
    ("prune-blocks-comma", ["prune", "{ws}/run", "--blocks", ",", "--out", "{ws}/new"], "','"),
    ("prune-blocks-twice", ["prune", "{ws}/run", "--blocks", "1,1", "--out", "{ws}/new"], "1,1"),
    ("prune-blocks-all", ["prune", "{ws}/run", "--blocks", "1,2", "--device", "cpu", "--out", "{ws}/new"], "1,2"),
    ("prune-budget-nan", ["prune", "{ws}/run", "--budget", "nan", "--out", "{ws}/new"], "--budget nan"),
    ("prune-budget-negative", ["prune", "{ws}/run", "--budget", "-1", "--out", "{ws}/new"], "--budget -1"),
    ("prune-two-requests", ["prune", "{ws}/run", "--remove", "1", "--budget", "1", "--out", "{ws}/new"],
     "--remove, --budget"),
    ("prune-heal-lr-nan", ["prune", "{ws}/run", "--remove", "1", "--heal-steps", "1", "--heal-lr", "nan",
                           "--out", "{ws}/new"], "--heal-lr nan"),
    ("prune-heal-lr-negative", ["prune", "{ws}/run", "--remove", "1", "--heal-lr", "-1", "--out", "{ws}/new"],
     "--heal-lr -1"),
    ("prune-heal-steps", ["prune", "{ws}/run", "--remove", "1", "--heal-steps", "-3", "--out", "{ws}/new"],
     "--heal-steps -3"),
    ("prune-heal-batch-size", ["prune", "{ws}/run", "--remove", "1", "--heal-batch-size", "0", "--out", "{ws}/new"],
     "--heal-batch-size 0"),
    ("prune-tokens", ["prune", "{ws}/run", "--remove", "1", "--tokens", "0", "--out", "{ws}/new"], "--tokens 0"),
    ("prune-nan-run", ["prune", "{ws}/nanrun", "--remove", "1", "--device", "cpu", "--out", "{ws}/new"], "NaN"),
    ("prune-nan-hf", ["prune", "{ws}/hf_nan", "--remove", "1", "--device", "cpu", "--out", "{ws}/new"], "NaN"),
    # ---- finetune
    ("finetune-missing-source", ["finetune", "{ws}/no-such-run", "--data", "builtin-sft", "--out", "{ws}/new"],
     "no-such-run"),
    ("finetune-not-a-model", ["finetune", "{ws}/full", "--data", "builtin-sft", "--out", "{ws}/new"], "full"),
    ("finetune-bad-data", ["finetune", "{ws}/run", "--data", "{ws}/corpus.jsonl", "--device", "cpu",
                           "--out", "{ws}/new"], "corpus.jsonl"),
    ("finetune-out-is-file", ["finetune", "{ws}/run", "--data", "builtin-sft", "--out", "{ws}/a_file"], "a_file"),
    ("finetune-out-existing", ["finetune", "{ws}/run", "--data", "builtin-sft", "--out", "{ws}/run"], "run"),
    ("finetune-input-zero", ["finetune", "{ws}/run", "--data", "{ws}/input_zero.jsonl", "--device", "cpu",
                             "--out", "{ws}/new"], "input_zero.jsonl:3"),
    ("finetune-hf-more-layers", ["finetune", "{ws}/hf_more", "--data", "builtin-sft", "--out", "{ws}/new"],
     "3 layers"),
    ("finetune-nan-run", ["finetune", "{ws}/nanrun", "--data", "builtin-sft", "--out", "{ws}/new"], "NaN"),
    ("finetune-lr-nan", ["finetune", "{ws}/run", "--data", "builtin-sft", "--lr", "nan", "--device", "cpu",
                         "--out", "{ws}/new"], "nan"),
    # ---- evaluate
    ("evaluate-missing-task", ["evaluate", "{ws}/run", "--tasks", "{ws}/nope.jsonl", "--out", "{ws}/new"],
     "nope.jsonl"),
    ("evaluate-out-is-file", ["evaluate", "{ws}/run", "--tasks", "builtin-mc", "--out", "{ws}/a_file"], "a_file"),
    ("evaluate-image-task-missing-image", ["evaluate", "{ws}/vlm", "--tasks", "{ws}/vlm_noimage.jsonl", "--out",
                                          "{ws}/new"], "nope.png"),
    ("evaluate-image-task-no-answer", ["evaluate", "{ws}/vlm", "--tasks", "{ws}/vlm_noanswer.jsonl", "--out",
                                       "{ws}/new"], "answer"),
    ("evaluate-missing-target", ["evaluate", "{ws}/no-such-run", "--tasks", "builtin-mc", "--out", "{ws}/new"],
     "no-such-run"),
    ("evaluate-batch-size", ["evaluate", "{ws}/run", "--tasks", "builtin-mc", "--batch-size", "0",
                             "--out", "{ws}/new"], "batch-size"),
    ("evaluate-scheme-on-run", ["evaluate", "{ws}/run", "--tasks", "builtin-mc", "--scheme", "lns",
                                "--out", "{ws}/new"], "--scheme lns"),
    ("evaluate-one-choice-arc", ["evaluate", "{ws}/run", "--tasks", "{ws}/one_choice.jsonl", "--out", "{ws}/new"],
     "one_choice.jsonl:2"),
    ("evaluate-one-ending-hellaswag", ["evaluate", "{ws}/run", "--tasks", "{ws}/one_ending.jsonl",
                                      "--out", "{ws}/new"], "one_ending.jsonl:1"),
    ("evaluate-context-null", ["evaluate", "{ws}/run", "--tasks", "{ws}/context_null.jsonl", "--out", "{ws}/new"],
     "context_null.jsonl:2"),
    ("evaluate-empty-choices", ["evaluate", "{ws}/run", "--tasks", "{ws}/empty_choices.jsonl", "--out", "{ws}/new"],
     "empty_choices.jsonl:1"),
    ("evaluate-nan-run", ["evaluate", "{ws}/nanrun", "--tasks", "builtin-mc", "--device", "cpu", "--out", "{ws}/new"],
     "NaN"),
    ("evaluate-truncated-gguf", ["evaluate", "{ws}/trunc.gguf", "--tasks", "builtin-mc", "--device", "cpu",
                                 "--out", "{ws}/new"], "trunc.gguf"),
]


def _argv(argv, ws):
    return [a.replace("{ws}", str(ws)) for a in argv]


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(ws, argv, needle, capsys, caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path / "cache"))  # outside the workspace
    monkeypatch.chdir(ws)  # a default output directory would show up in the snapshot
    torch.set_num_threads(1)
    before = snapshot(ws)
    caplog.set_level(logging.INFO)
    try:
        code = main(_argv(argv, ws))
    except SystemExit as exit_:  # argparse refuses a value itself (one line, exit 2)
        code = exit_.code
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured.err
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"depthlab {argv[0]}: error:"), lines
    assert needle in lines[0], lines[0]
    assert "1000000000 blocks" not in lines[0]  # no placeholder block count
    assert "weights_only" not in lines[0]  # never the advice to switch the pickle protection off
    assert "Traceback" not in captured.err + captured.out
    assert snapshot(ws) == before
    # refused before any work started: no training, diagnosis or pass over data logged or printed
    work = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("depthlab")
            and r.getMessage() and not r.getMessage().startswith("depthlab")]
    assert not work, work
    assert not captured.out.strip(), captured.out


def test_there_are_enough_cases_for_every_command():
    from depthlab.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices) - {"demo"}  # demo = compare with defaults
    assert len(CASES) >= 40
    assert commands <= {c[1][0] for c in CASES}, commands - {c[1][0] for c in CASES}


@pytest.mark.parametrize("case", ["train-device", "export-mismatch", "diagnose-out-is-file"])
def test_bad_input_in_a_real_interpreter(ws, case):
    argv, needle = next(c[1:] for c in CASES if c[0] == case)
    before = snapshot(ws)
    proc = subprocess.run([sys.executable, "-m", "depthlab", *_argv(argv, ws)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, cwd=ws)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert snapshot(ws) == before


def test_verbose_failure_shows_the_traceback_exits_2_and_removes_the_out_it_created(ws, tmp_path, capsys,
                                                                                     monkeypatch):
    """-v adds the traceback of an unexpected error; the exit code and the clean-up stay those of any failure."""
    import depthlab.analysis.evaluate

    def broken(target, tasks, *, out, **kw):
        Path(out).mkdir(parents=True)
        (Path(out) / "eval.json").write_text("{")  # half an output
        raise RuntimeError("boom in the middle")

    monkeypatch.setattr(depthlab.analysis.evaluate, "evaluate", broken)
    out = tmp_path / "evals"
    code = main(["-v", "evaluate", str(ws / "run"), "--tasks", "builtin-mc", "--device", "cpu", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" in err and "boom in the middle" in err
    assert err.strip().splitlines()[-1] == "depthlab evaluate: error: RuntimeError: boom in the middle"
    assert not out.exists()


def test_init_from_falls_back_past_a_damaged_newest_checkpoint(ws, tmp_path, capsys):
    """As resume and diagnose do: the damaged newest checkpoint is named in a warning, the older intact one used."""
    src = tmp_path / "src"
    shutil.copytree(ws / "run", src)
    newest = sorted((src / "checkpoint").glob("step-*"))[-1]
    blob = bytearray((newest / "model.safetensors").read_bytes())
    blob[-8:] = b"\x00" * 8  # same size, other bytes: caught by the checksum only
    (newest / "model.safetensors").write_bytes(bytes(blob))
    out = tmp_path / "new"
    argv = ["train", "--init-from", str(src), "--data", str(ws / "corpus.jsonl"), "--seq-len", "16", "--batch-size",
            "4", "--eval-tokens", "64", "--steps", "1", "--device", "cpu", "--no-plots", "-q", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    used = json.loads((out / "config.json").read_text())["init_from"]["checkpoint"]
    intact = sorted((src / "checkpoint").glob("step-*"))[-2]
    assert used == str(intact.resolve())


def test_a_refused_compare_makes_no_lock_file_in_a_directory_that_is_not_its_own(tmp_path, capsys):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    assert main(["compare", "--schemes", "pre,lns", "--out", str(foreign)]) == 2
    assert "is not a compare" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["todo.txt"]
