#!/usr/bin/env python3
"""A newcomer's check that cannot rot: README command 1 in a fresh clone and venv, then every command the
README and the docs/ pages show, at toy sizes; it stops at the first that fails and names it.

    python scripts/newcomer_check.py --fresh        # clone + fresh venv + README command 1 + every command
    python scripts/newcomer_check.py                # every command shown, in this (installed) environment
    python scripts/newcomer_check.py --subset ci    # what CI runs: the commands that take seconds (see SLOW)
    python scripts/newcomer_check.py --list         # the commands found, and how each will run (or why not)

Commands come from the pages themselves (:data:`PAGES`: README.md, then docs/*.md by name): ``bash`` blocks,
backticked ``depthlab ...`` commands with arguments, and ``python`` blocks (unless a
``<!-- newcomer: skip REASON -->`` line stands right before the block, bash or python). A command shown on
several pages runs once, where it first appears.
Toy sizes: the rewrites in :data:`TOY` (steps, tokens, presets); inputs a page names but does not make
(``my.jsonl``, ``commonsense_170k.json``, ``arc_easy.jsonl``, an image folder) are written first by
:func:`make_inputs`. Everything runs in one scratch directory, in page order, so a command can use what
an earlier one made (``depthlab diagnose runs/lns`` after ``depthlab train ... --out runs/lns``; a docs page's
commands after the README's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_COMMAND_1 = "bash scripts/install.sh && depthlab demo"
#: The pages whose commands run, in this order.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

#: (pattern, replacement) applied to every command: the toy sizes.
TOY: tuple[tuple[str, str], ...] = (
    (r"--steps \d+", "--steps 3"), (r"--finetune-steps \d+", "--finetune-steps 2"),
    (r"--heal-steps \d+", "--heal-steps 2"), (r"--diag-tokens \d+", "--diag-tokens 512"),
    (r"--tokens \d+", "--tokens 512"), (r"--seeds 0,1,2", "--seeds 0,1"), (r"--depth \d+", "--depth 64"),
    (r"--preset (llama|qwen)\S*", "--preset tiny"), (r"--batch-size \d{3,}", "--batch-size 8"),
    (r"(TrainConfig\([^)]*?)\bsteps=\d+", r"\1steps=3, eval_tokens=2048"), (r"\btokens=\d+", "tokens=512"),  # python
    (r"DiagnoseOptions\(", "DiagnoseOptions(jacobian=False, "),
)
#: Arguments appended to commands of a kind (toy sizes the README's flags do not reach).
APPEND: tuple[tuple[str, str], ...] = (
    (r"^depthlab (compare|demo)\b", "--diag-tokens 512 --no-jacobian --eval-tokens 2048"),
    (r"^depthlab diagnose", "--tokens 512 --no-jacobian"),
    (r"^depthlab prune", "--tokens 256"),
    (r"^depthlab prune smollm2", "--method angular-block"),
    (r"^depthlab evaluate", "--limit 8"),
    (r"^depthlab train", "--eval-tokens 2048"),
    (r"^depthlab finetune", "--steps 2"),
    (r"--preset vit-s\b", "--batch-size 8 --set n_layers=2 --steps 2"),
)
#: Commands that cannot run here, and why.
SKIP: tuple[tuple[str, str], ...] = (
    (r"^torchrun\b", "needs several processes or GPUs (tests/train/test_dist.py covers DDP/FSDP on the CPU)"),
    (r"\bhf:", "needs the Hugging Face hub (online)"),
    (r"\b(TARGET|DIR|FILE|RUN_DIR|RUN|COMMAND)\b|\.\.\.|…", "a template, not a command"),
    (r"^depthlab \w+$", "the command's name only"),
)
#: Commands that take more than a few seconds at toy size: not in ``--subset ci``.
SLOW = (r"\bsmollm2\b", r"^depthlab (demo|compare)\b", r"--finetune\b", r"--preset vit-s\b", r"\bruns/vit(\s|$)")


@dataclass
class Step:
    line: int  # line on its page
    shown: str  # as the page shows it
    run: str | None  # as this check runs it (None: skipped)
    why: str = ""  # why it is skipped
    page: str = "README.md"  # the page, relative to the repository

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _bash_commands(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for ln in joined.splitlines():
        cmd = re.sub(r"\s+#.*$", "", ln).strip()
        if cmd and not cmd.startswith("#"):
            out.append(cmd)
    return out


def page_steps(text: str, page: str = "README.md", seen: set[str] | None = None) -> list[Step]:
    """Every command of one page, in order, with how it will run (or why it will not); ``seen`` (shared across
    pages) holds the commands already found, which do not run twice."""
    steps, seen = [], set() if seen is None else seen
    marker = r"(<!-- newcomer: skip ([^>]*)-->\n|<!-- example:([\w-]+) -->\n)?"  # example blocks: tests/monitor
    for m in re.finditer(marker + r"```(bash|python)\n(.*?)```", text, re.S):
        line = text[:m.start()].count("\n") + 1
        why = m.group(2) or (f"a part of examples/monitor_*.py ({m.group(3)}), which the tests run whole"
                             if m.group(3) else "")
        if m.group(4) == "python":
            code = m.group(5)
            for pattern, repl in TOY:
                code = re.sub(pattern, repl, code)
            steps.append(Step(line, m.group(5), None if m.group(1) else code, why, page))
            continue
        for cmd in _bash_commands(m.group(5)):
            if cmd not in seen and cmd != README_COMMAND_1 and "pytest" not in cmd:
                seen.add(cmd)
                steps.append(Step(line, cmd, None, why, page) if m.group(1) else _step(line, cmd, page))
    for m in re.finditer(r"`(depthlab [^`]+)`", text):
        cmd = " ".join(m.group(1).split())
        if cmd not in seen:
            seen.add(cmd)
            steps.append(_step(text[:m.start()].count("\n") + 1, cmd, page))
    return sorted(steps, key=lambda s: s.line)


def all_steps(pages: tuple[Path, ...] = PAGES) -> list[Step]:
    """Every command of every page, page by page, each once."""
    seen: set[str] = set()
    return [s for p in pages for s in page_steps(p.read_text(), str(p.relative_to(ROOT)), seen)]


def _step(line: int, cmd: str, page: str = "README.md") -> Step:
    for pattern, why in SKIP:
        if re.search(pattern, cmd):
            return Step(line, cmd, None, why, page)
    run = cmd
    for pattern, repl in TOY:
        run = re.sub(pattern, repl, run)
    for pattern, extra in APPEND:
        if re.search(pattern, run):
            run += " " + extra
    return Step(line, cmd, run, page=page)


def make_inputs(work: Path) -> None:
    """The files the pages' commands name but do not make, written small and valid."""
    text = "\n".join(f"In the beginning was the word {i}, and the word was with the depth of {i}." for i in range(400))
    for name in ("my.jsonl", "corpus.jsonl"):
        (work / name).write_text("".join(json.dumps({"text": p, "body": p}) + "\n" for p in text.split(". ")))
    (work / "my.txt").write_text(text)
    sft = [{"instruction": f"Repeat {i}.", "input": "", "output": f"{i}"} for i in range(40)]
    for name in ("commonsense_170k.json", "alpaca.json"):
        (work / name).write_text(json.dumps(sft))
    arc = [{"question": {"stem": f"{i} + 1 = ?", "choices": [{"text": str(i + d), "label": "ABCD"[d]} for d in range(4)]},
            "answerKey": "B"} for i in range(10)]
    for name in ("arc_easy.jsonl", "arc_e.jsonl"):
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in arc))
    piqa = [{"goal": f"Open jar {i}", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0} for i in range(10)]
    (work / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in piqa))
    _image_folder(work / "path" / "to" / "imagefolder")


def _image_folder(root: Path) -> None:
    from PIL import Image

    for label in ("a", "b"):
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            Image.new("RGB", (32, 32), (40 * i, 200 if label == "a" else 20, 90)).save(root / label / f"{i}.png")


def _run_one(step: Step, work: Path, env: dict[str, str], timeout: int) -> tuple[bool, float, str]:
    t0 = time.time()
    if "\n" in step.shown:  # a python block
        proc = subprocess.run([sys.executable, "-c", step.run], cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout)
    else:
        for flag in ("--out", "--hf"):  # a page may reuse an output name; a scratch copy starts clean
            m = re.search(rf"{flag} (\S+)", step.run)
            if m and "--resume" not in step.run and (work / m.group(1)).exists():
                shutil.rmtree(work / m.group(1))
        proc = subprocess.run(step.run, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode == 0, time.time() - t0, (proc.stderr or proc.stdout)[-1500:]


def run_steps(steps: list[Step], work: Path, env: dict[str, str], timeout: int) -> int:
    make_inputs(work)
    for i, step in enumerate(steps, 1):
        if step.run is None:
            print(f"[{i}/{len(steps)}] skip   {step.where}  {step.shown[:80]}  ({step.why})", flush=True)
            continue
        ok, seconds, tail = _run_one(step, work, env, timeout)
        shown = step.shown.splitlines()[0][:80]
        print(f"[{i}/{len(steps)}] {'ok  ' if ok else 'FAIL'} {seconds:6.1f}s {step.where}  {shown}", flush=True)
        if not ok:
            print(f"\nFAILED: the command at {step.where}:\n  {step.shown}\nran as:\n  {step.run}\n{tail}")
            return 1
    return 0


def fresh_environment(keep: Path | None) -> tuple[Path, dict[str, str], float]:
    """Clone this checkout into a scratch directory, make a fresh venv there, run README command 1 in it."""
    base = keep or Path(tempfile.mkdtemp(prefix="depthlab-newcomer-"))
    clone = base / "depthlab"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    env = {**os.environ, "PATH": f"{base / 'venv' / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(base / "venv"),
           "DEPTHLAB_CACHE": str(base / "cache"), "PYTHON": str(base / "venv" / "bin" / "python")}
    env.pop("PYTHONPATH", None)
    t0 = time.time()
    proc = subprocess.run(README_COMMAND_1, shell=True, cwd=clone, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"FAILED: README command 1 ({README_COMMAND_1}) exited with {proc.returncode}")
    return clone, env, time.time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", action="store_true", help="fresh clone + venv, README command 1 first")
    ap.add_argument("--subset", choices=("all", "ci"), default="all", help="ci: only the commands that take seconds")
    ap.add_argument("--list", action="store_true", help="print the commands and how each runs, then exit")
    ap.add_argument("--keep", type=Path, help="work in this directory (kept) instead of a temporary one")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per command (default 900)")
    args = ap.parse_args(argv)
    steps = all_steps()
    if args.subset == "ci":
        steps = [s for s in steps if s.run is None or not any(re.search(p, s.shown) for p in SLOW)]
    if args.list:
        for s in steps:
            print(f"{s.where}: {s.shown.splitlines()[0]}\n    -> {s.run or 'skip: ' + s.why}")
        return 0
    if args.fresh:
        clone, env, seconds = fresh_environment(args.keep)
        print(f"README command 1 ({README_COMMAND_1}): ok in {seconds:.0f}s", flush=True)
    else:
        env = {**os.environ}
    work = Path(tempfile.mkdtemp(prefix="depthlab-readme-", dir=args.keep))
    env.setdefault("DEPTHLAB_CACHE", str(work / ".cache"))
    t0 = time.time()
    code = run_steps(steps, work, env, args.timeout)
    print(f"every command works ({time.time() - t0:.0f}s)" if code == 0 else "", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
