"""How long each command takes to refuse a model it cannot read, from a fresh process (issue 45: < 2 s on a quiet
machine, before any weight is read).

    python benchmarks/refusal_time.py --out benchmarks/results                       # the committed result
    python benchmarks/refusal_time.py --src /tmp/before/src --src src                # two source trees side by side

The models (config.json plus a 1 GiB placeholder weights file whose header is zeros, so any read would fail): XLM
(four ModuleLists of its depth, no block list to tell), a BERT encoder (asked to prune, or to stream), and a LLaVA
wrapper without a text decoder. Each command line runs ``--repeats`` times as ``python -m depthlab ...`` in a new
process, one at a time, every source tree in turn (``--src``: its ``src`` directory put first on PYTHONPATH; default
this checkout's); the seconds are wall time of the whole process, Python's start included. Run it with nothing else
heavy on the machine: the JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_out import result_path  # noqa: E402 - a sibling module

#: (label, the command line; {xlm}, {bert}, {llava}: the model directories, {o}: an output directory).
COMMANDS = [
    ("diagnose in memory, XLM", ["diagnose", "{xlm}", "--no-stream"]),
    ("diagnose --stream, XLM", ["diagnose", "{xlm}", "--stream"]),
    ("evaluate, XLM", ["evaluate", "{xlm}", "--tasks", "builtin-mc", "--out", "{o}"]),
    ("prune, XLM", ["prune", "{xlm}", "--remove", "1", "--out", "{o}"]),
    ("finetune, XLM", ["finetune", "{xlm}", "--data", "builtin-sft", "--out", "{o}"]),
    ("export, XLM (not a run)", ["export", "{xlm}", "--hf", "{o}"]),
    ("prune, BERT encoder", ["prune", "{bert}", "--remove", "1", "--out", "{o}"]),
    ("diagnose --stream, BERT encoder", ["diagnose", "{bert}", "--stream"]),
    ("prune, LLaVA without text_config", ["prune", "{llava}", "--remove", "1", "--out", "{o}"]),
]


def fixtures(root: Path) -> dict[str, Path]:
    """The three model directories, each with a 1 GiB placeholder weights file."""
    from transformers import AutoConfig

    paths = {}
    for name, config in (("xlm", AutoConfig.for_model("xlm", n_layers=6, emb_dim=64, n_heads=2, vocab_size=300)),
                         ("bert", AutoConfig.for_model("bert", num_hidden_layers=6, hidden_size=64, num_attention_heads=2,
                                                       intermediate_size=128, vocab_size=300,
                                                       architectures=["BertModel"]))):
        config.save_pretrained(root / name)
        paths[name] = root / name
    paths["llava"] = root / "llava"
    paths["llava"].mkdir()
    (paths["llava"] / "config.json").write_text(json.dumps({"model_type": "llava", "vision_config": {}}))
    for path in paths.values():
        with open(path / "model.safetensors", "wb") as f:
            f.truncate(1 << 30)
    return paths


def run_once(argv: list[str], src: Path, cwd: Path) -> tuple[float, int, str]:
    """(seconds, exit code, stderr's first line) of one ``python -m depthlab`` process using the source tree ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "depthlab", *argv], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)
    return time.perf_counter() - start, done.returncode, (done.stderr.strip().splitlines() or [""])[0]


def main() -> None:
    from depthlab.base.provenance import versions

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", action="append", type=Path, default=None,
                   help="a source tree's src directory (repeatable; default this checkout's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="result folder or .json file (default outside the checkout)")
    args = p.parse_args()
    srcs = [s.resolve() for s in (args.src or [ROOT / "src"])]
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = fixtures(root)
        for label, template in COMMANDS:
            for src in srcs:
                seconds, lines = [], set()
                for _ in range(args.repeats):
                    argv = [a.format(o=root / "out", **paths) for a in template]
                    s, code, line = run_once(argv, src, root)
                    assert code == 2 and not (root / "out").exists(), (label, code, line)
                    seconds.append(round(s, 3))
                    lines.add(line.replace(str(root), "<tmp>"))
                rows.append({"command": label, "src": str(src), "seconds": seconds,
                             "median_s": round(statistics.median(seconds), 3), "lines": sorted(lines)})
                print(f"{label:36s} {statistics.median(seconds):6.2f}s  {src}  {sorted(lines)[0][:100]}", flush=True)
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    cpu = f"{info.get('model name', 'unknown')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    doc = {"what": "seconds from a new process to a command's one-line refusal (exit 2) of a model it cannot read; "
                   "the weights file is a 1 GiB placeholder no command may read",
           "command": "python benchmarks/refusal_time.py " + " ".join(sys.argv[1:]),
           "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_average_before": load_before,
                       "load_average_after": os.getloadavg()},
           "versions": versions(), "repeats": args.repeats, "rows": rows}
    path = result_path("refusal_time_cpu.json", args.out)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
