"""What the compiled training step is made of, read on a CPU: graphs, graph breaks, recompiles, and the LM head's
logits buffers (does the loss materialise fp32 logits?).

usage:
    python benchmarks/step_anatomy.py                          # tiny shrunk to 2 blocks of 64, vocab 4096, bf16 autocast
    python benchmarks/step_anatomy.py --scheme lns --vocab 8192 --out benchmarks/results/step_anatomy_cpu.json

One compiled training call (the trainer's ``compile_for_training``: forward + loss, and their backward) of a small
model under bf16 autocast, with inductor's generated code captured (``run_and_get_code``). Reported: dynamo's
graphs, graph breaks and recompiles over ``--steps`` calls; in each generated graph (forward, backward) every
buffer holding B x T x V elements (the logits' size) with its dtype, and whether the backward reuses the saved
logits buffer in place. The graphs inductor builds for CUDA are the same graphs (the kernels differ), so what is
materialised here is what a GPU step materialises.
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import save_report  # noqa: E402  (sibling module)


def logits_buffers(code: str, numel: int) -> list[dict]:
    """Buffers of ``numel`` elements allocated in one generated graph (shape and dtype), and reuses named so."""
    found = []
    for name, shape, dtype in re.findall(r"(buf\d+) = empty_strided_\w+\(\(([\d, ]+)\), \([^)]*\), (torch\.\w+)\)", code):
        if math.prod(int(v) for v in shape.split(",") if v.strip()) == numel:
            found.append({"buffer": name, "shape": shape, "dtype": dtype.replace("torch.", "")})
    return found


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheme", default="pre")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="compiled calls (the later ones must not recompile)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    from depthlab import build_model, from_preset
    from depthlab.train.distributed import LMLoss
    from depthlab.train.step import compile_for_training

    torch.manual_seed(0)
    cfg = from_preset("tiny", n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=args.vocab, scheme=args.scheme)
    module = LMLoss(build_model(cfg)).train()
    compiled = compile_for_training(module)
    x, y = (torch.randint(args.vocab, (args.batch_size, args.seq_len)) for _ in range(2))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(x, y).loss
        loss.backward()

    _, codes = run_and_get_code(step)
    for _ in range(args.steps - 1):
        step()
    numel = args.batch_size * args.seq_len * args.vocab
    graphs = [{"graph": ("forward", "backward")[i] if i < 2 else f"graph {i}", "chars": len(code),
               "logits_sized_buffers": logits_buffers(code, numel),
               "reuses_a_saved_buffer_in_place": bool(re.search(r"buf\d+ = mm_\d+; del mm_\d+  # reuse", code))}
              for i, code in enumerate(codes)]
    report = {"benchmark": "step_anatomy", "command": "python benchmarks/step_anatomy.py " + " ".join(argv or sys.argv[1:]),
              "torch": torch.__version__, "python": platform.python_version(), "scheme": args.scheme,
              "shape": {"batch": args.batch_size, "seq_len": args.seq_len, "vocab": args.vocab}, "autocast": "bfloat16",
              "dynamo": {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
                         "recompiles": sum(counters["recompiles"].values()), "calls": args.steps},
              "graphs": graphs}
    for g in graphs:
        print(f"{g['graph']}: {g['chars']:,} characters of code; B*T*V buffers: {g['logits_sized_buffers'] or 'none'}"
              f"{'; reuses a saved buffer in place' if g['reuses_a_saved_buffer_in_place'] else ''}")
    print(f"dynamo: {report['dynamo']}")
    save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
