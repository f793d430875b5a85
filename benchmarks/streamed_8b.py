"""Models larger than memory: diagnose and prune a Llama-3-8B-shaped checkpoint on a 24 GB, 2-core CPU.

    python benchmarks/streamed_8b.py --toy                  # tiny shapes, the same steps (about a minute)
    python benchmarks/streamed_8b.py --smollm2              # SmolLM2-135M: streamed vs in memory, one run
    python benchmarks/streamed_8b.py --compute-dtypes       # one 8B-shaped layer: bf16 compute vs fp32 upcast
    python benchmarks/streamed_8b.py --rows                 # one SmolLM2 layer: time per token by rows per call
    python benchmarks/streamed_8b.py --rows-ab --repeats 2  # SmolLM2 streamed sweep: the CPU row cap on vs off
    nice -n 10 python benchmarks/streamed_8b.py             # the 8B run: ~16 GB written to --cache-dir, hours

8B (and toy) mode:
1. writes a Llama-3-8B-shaped checkpoint (32 layers, d_model 4096, d_ff 14336, 32 query / 8 KV heads, vocab
   128,256, RoPE theta 500,000; seeded N(0, 0.02) weights, unit norms; bf16 safetensors shards of ~5 GB, a
   byte-level tokenizer) into ``--cache-dir``, tensor by tensor in row chunks (a few hundred MB of memory),
   never into the repository; an existing complete checkpoint is reused;
2. runs ``depthlab diagnose DIR --stream --weights bf16 --tokens 256`` (all-pairs angular distance, the full
   removal sweep, no joint check) and ``depthlab prune DIR --remove 8 --method angular-block --stream``, each in
   a child process: wall time, peak RSS (``os.wait4``), bytes of weights read, achieved FLOP/s of the sweep;
3. measures this machine's fp32 matmul throughput for the same shapes (the layer's seven projections at the
   row counts the sweep uses, and the LM head) for the FLOP/s ratio;
4. loads the pruned checkpoint with plain ``transformers`` (bf16, each module upcast to fp32 while it runs)
   and compares its logits on a few tokens with the streamed engine's logits of the original model with
   the removed blocks skipped.
Before writing anything it checks the free disk and memory and stops with one clear line when they are short.

SmolLM2 mode: ``depthlab diagnose`` of SmolLM2-135M (as an HF safetensors directory) at its default token
count, streamed and in memory, one child process each: the wall-time and peak-RSS ratios.

Rows mode: one SmolLM2 decoder layer applied to 31 streams × 8 sequences × 256 tokens (what diagnose's
removal sweep feeds it at the default token count) in calls of 256 to 63,488 token rows, interleaved rounds:
the time per token row, which sets the engine's cap on rows per layer call on a CPU. Rows-ab mode: the whole
streamed diagnose of SmolLM2 at 2,048 tokens (in this process, no joint check), with the cap and without it
(the activation budget alone, as before the cap), interleaved rounds: the sweep's seconds.

Results: ``benchmarks/results/streamed_<mode>_cpu.json`` with the machine, versions and the exact command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import result_path  # noqa: E402  (sibling module)

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {
    "8b": dict(n_layers=32, d_model=4096, d_ff=14336, n_heads=32, n_kv_heads=8, vocab=128256, rope_theta=500000.0,
               max_pos=8192, remove=8),
    "toy": dict(n_layers=8, d_model=256, d_ff=896, n_heads=8, n_kv_heads=2, vocab=4096, rope_theta=500000.0,
                max_pos=1024, remove=2),
}
SHARD_BYTES = 5 * 10**9
INIT_STD = 0.02  # Llama's initializer_range
ROW_CHUNK = 4096


# ---------------------------------------------------------------------------------------------- the checkpoint
def tensor_specs(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """HF Llama tensor names and shapes, in the order ``save_pretrained`` writes them."""
    D, F, hd = s["d_model"], s["d_ff"], s["d_model"] // s["n_heads"]
    out = [("model.embed_tokens.weight", (s["vocab"], D))]
    for i in range(s["n_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (D,)), (p + "self_attn.q_proj.weight", (s["n_heads"] * hd, D)),
                (p + "self_attn.k_proj.weight", (s["n_kv_heads"] * hd, D)),
                (p + "self_attn.v_proj.weight", (s["n_kv_heads"] * hd, D)),
                (p + "self_attn.o_proj.weight", (D, s["n_heads"] * hd)),
                (p + "post_attention_layernorm.weight", (D,)), (p + "mlp.gate_proj.weight", (F, D)),
                (p + "mlp.up_proj.weight", (F, D)), (p + "mlp.down_proj.weight", (D, F))]
    return out + [("model.norm.weight", (D,)), ("lm_head.weight", (s["vocab"], D))]


def _nbytes(shape: tuple[int, ...]) -> int:
    return 2 * math.prod(shape)  # bf16


def _tensor_bytes(name: str, shape: tuple[int, ...], seed: int, device: str = "cpu"):
    """The tensor in bf16, row chunk by row chunk: norms are ones, every other weight N(0, INIT_STD), drawn on
    ``device`` (a GPU draws the 8B shape's 8e9 numbers in a second; a CPU takes minutes)."""
    if len(shape) == 1:
        yield torch.ones(shape, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
        return
    gen = torch.Generator(device).manual_seed(seed)
    for r in range(0, shape[0], ROW_CHUNK):
        rows = torch.randn(min(ROW_CHUNK, shape[0] - r), shape[1], generator=gen, device=device) * INIT_STD
        yield rows.to(torch.bfloat16).cpu().view(torch.int16).numpy().tobytes()


def write_checkpoint(path: Path, s: dict, seed: int = 0, device: str = "cpu") -> dict:
    """The checkpoint of shapes ``s`` in ``path`` (reused when complete), its random weights drawn on ``device`` (the
    same seed draws other numbers on another device); returns its size and how long it took."""
    done = path / "complete.json"
    if done.is_file():
        return {**json.loads(done.read_text()), "reused": True}
    t0 = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    specs, shards, size = tensor_specs(s), [[]], 0
    for name, shape in specs:
        if shards[-1] and size + _nbytes(shape) > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += _nbytes(shape)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        total += _write_shard(path / fname, shard, seed, specs, device)
        weight_map.update(dict.fromkeys((n for n, _ in shard), fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=1))
    _config(s).save_pretrained(path)
    sys.path.insert(0, str(ROOT / "tests"))
    from depthlab.hf.tiny import byte_tokenizer

    byte_tokenizer().save_pretrained(path)
    info = {"bytes": total, "shards": len(shards), "write_s": round(time.perf_counter() - t0, 1), "seed": seed,
            "drawn_on": device}
    done.write_text(json.dumps(info) + "\n")
    return {**info, "reused": False}


def _write_shard(file: Path, shard: list, seed: int, specs: list, device: str = "cpu") -> int:
    entries, offset = {}, 0
    for name, shape in shard:
        entries[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + _nbytes(shape)]}
        offset += _nbytes(shape)
    meta = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    meta += b" " * (-len(meta) % 8)
    order = [n for n, _ in specs]
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(meta)) + meta)
        for name, shape in shard:
            for chunk in _tensor_bytes(name, shape, seed * 100_003 + order.index(name), device):
                f.write(chunk)
    return offset


def _config(s: dict):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=s["vocab"], hidden_size=s["d_model"], intermediate_size=s["d_ff"],
                       num_hidden_layers=s["n_layers"], num_attention_heads=s["n_heads"],
                       num_key_value_heads=s["n_kv_heads"], max_position_embeddings=s["max_pos"], rms_norm_eps=1e-5,
                       rope_theta=s["rope_theta"], tie_word_embeddings=False, dtype="bfloat16", bos_token_id=None,
                       eos_token_id=256, pad_token_id=None, initializer_range=INIT_STD)


# ---------------------------------------------------------------------------------------------- children
def run_child(argv: list[str], log: Path) -> dict:
    """Run ``argv`` (stdout+stderr to ``log``): wall time, peak RSS of that child (``os.wait4``), exit status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    tail = log.read_text().splitlines()[-12:]
    return {"argv": shlex.join(argv), "exit": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "log_tail": tail}


def depthlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "depthlab", *args]


# ---------------------------------------------------------------------------------------------- FLOP/s
def layer_flops_per_token(s: dict, seq_len: int) -> int:
    """2 per weight of the layer's linear maps + 2·T·(heads·head_dim) for attention (depthlab.prune.export.cost)."""
    D, F, hd = s["d_model"], s["d_ff"], s["d_model"] // s["n_heads"]
    linear = D * s["n_heads"] * hd * 2 + 2 * D * s["n_kv_heads"] * hd + 3 * D * F
    return 2 * linear + 2 * seq_len * s["n_heads"] * hd


def matmul_throughput(s: dict, rows: list[int], repeats: int = 2) -> dict:
    """fp32 GFLOP/s of the layer's seven projections (and the LM head) at each row count: best of ``repeats``."""
    D, F, hd = s["d_model"], s["d_ff"], s["d_model"] // s["n_heads"]
    shapes = [(D, s["n_heads"] * hd), (D, s["n_kv_heads"] * hd), (D, s["n_kv_heads"] * hd), (s["n_heads"] * hd, D),
              (D, F), (D, F), (F, D)]
    weights = [torch.randn(n, k) * INIT_STD for k, n in shapes]
    out = {}
    for m in rows:
        flops = sum(2 * m * w.shape[0] * w.shape[1] for w in weights)
        xs = {k: torch.randn(m, k) for k in {w.shape[1] for w in weights}}

        def layer(xs=xs) -> None:
            for w in weights:
                torch.nn.functional.linear(xs[w.shape[1]], w)
        best = min(_timed(layer) for _ in range(repeats + 1))
        out[str(m)] = round(flops / best / 1e9, 2)
    head = torch.randn(s["vocab"], D) * INIT_STD
    x = torch.randn(rows[0], D)
    best = min(_timed(lambda: torch.nn.functional.linear(x, head)) for _ in range(repeats + 1))
    out["head"] = round(2 * rows[0] * D * s["vocab"] / best / 1e9, 2)
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def achieved(report: dict, s: dict, seq_len: int) -> dict:
    """FLOPs of the sweeps (token-layer applications x a layer's FLOPs/token + head tokens x 2·D·V) per second."""
    eng = report["engine"]
    flops = eng["token_evals"] * layer_flops_per_token(s, seq_len) + eng["head_tokens"] * 2 * s["d_model"] * s["vocab"]
    return {"flops": flops, "sweep_s": eng["sweep_seconds"], "gflop_per_s": round(flops / eng["sweep_seconds"] / 1e9, 2)}


# ---------------------------------------------------------------------------------------------- checks
def preflight(cache: Path, out: Path, s: dict, mode: str) -> None:
    """Stop with one line when the disk or memory is too small for this mode (before writing anything)."""
    ckpt = sum(_nbytes(shape) for _, shape in tensor_specs(s))
    pruned = ckpt - s["remove"] * sum(_nbytes(sh) for n, sh in tensor_specs(s) if n.startswith("model.layers.0."))
    have = (cache / "complete.json").is_file()
    for where, need in ((cache, 0 if have else ckpt), (out, pruned + ckpt // 20)):
        where.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(where).free
        if need > free:
            sys.exit(f"streamed_8b ({mode}): not enough disk in {where}: {need / 1e9:.1f} GB needed, {free / 1e9:.1f} "
                     "GB free; give --cache-dir / --out elsewhere or free space")
    avail = _mem_available()
    need_mem = 6 * 2**30 if mode == "8b" else 2**30
    if avail is not None and avail < need_mem:
        sys.exit(f"streamed_8b ({mode}): {avail / 2**30:.1f} GiB of memory available, {need_mem / 2**30:.0f} GiB needed "
                 "(one fp32 layer, the fp32 embedding or head, the streams); stop other jobs first")


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@torch.no_grad()
def transformers_check(original: Path, pruned: Path, removed: list[int], n_tokens: int = 8) -> dict:
    """The pruned checkpoint in plain transformers (bf16 in memory, each module upcast to fp32 while it runs)
    against the streamed engine's logits of the original with ``removed`` skipped (fp32 compute)."""
    import resource

    from transformers import AutoModelForCausalLM

    from depthlab.prune.streamed import LogitsConsumer
    from depthlab.targets.stream.lanes import Lane
    from depthlab.targets.stream.open import locate, open_streamed, stored_bytes
    from depthlab.targets.stream.safetensors import tensor_index
    from depthlab.targets.stream.sweep import SweepBatch, Sweeper, SweepSettings

    found = locate(str(pruned))
    index = tensor_index(list(found.files))
    upcast = 2 * sum(index[k].numel for k in ("model.embed_tokens.weight", "lm_head.weight") if k in index)
    need = stored_bytes(found, torch.bfloat16) * 13 // 10 + upcast  # the bf16 model, and its embedding and head in fp32
    avail = _mem_available()
    if avail is not None and need > avail:
        return {"skipped": f"loading the pruned model needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB "
                           "are available"}
    ids = torch.arange(10, 10 + n_tokens)[None] * 7 % 250
    consumer = LogitsConsumer()
    target = open_streamed(str(original), "cpu", torch.bfloat16, torch.float32)
    Sweeper(target, SweepSettings(progress=False)).sweep("check", [SweepBatch(ids, states=False)],
                                                         [Lane("skip", frozenset(removed))], False, consumer)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(pruned), dtype=torch.bfloat16).eval()
    model.model.embed_tokens.float()
    model.model.norm.float()
    model.lm_head.float()
    def up(module, args) -> None:
        module.float()

    def down(module, args, out) -> None:
        module.to(torch.bfloat16)

    for layer in model.model.layers:  # one layer in fp32 at a time: bf16 -> fp32 -> bf16 is exact
        layer.register_forward_pre_hook(up)
        layer.register_forward_hook(down)
    got = model(input_ids=ids, use_cache=False).logits.float()
    ref = consumer.out[0]
    return {"n_layers_loaded": model.config.num_hidden_layers, "tokens": n_tokens, "seconds": round(time.perf_counter() - t0, 1),
            "max_abs_logit_diff": float((got - ref).abs().max()), "max_abs_logit": float(ref.abs().max()),
            "peak_rss_bytes_of_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---------------------------------------------------------------------------------------------- modes
def machine() -> dict:
    from depthlab.base.provenance import versions

    info = {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average": list(os.getloadavg())}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        flags = next(line for line in text.splitlines() if line.startswith("flags")).split()
        info["bf16_instructions"] = sorted(f for f in flags if "bf16" in f or f.startswith("amx"))
        info["memory_total_bytes"] = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                                              if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    return {"machine": info, "versions": versions()}


def run_big(mode: str, args: argparse.Namespace) -> dict:
    """Steps 1-4 of the module docstring for the 8B (or toy) shapes."""
    s, T = SHAPES[mode], args.tokens
    name = "llama3-8b-shaped" if mode == "8b" else "llama-toy-shaped"
    cache = Path(args.cache_dir or Path.home() / ".cache" / "depthlab" / "bench" / name)
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / f"{name}-runs")
    preflight(cache, out, s, mode)
    ckpt = write_checkpoint(cache, s)
    for sub in ("diagnose", "pruned"):
        shutil.rmtree(out / sub, ignore_errors=True)
    common = ["--stream", "--weights", "bf16", "--tokens", str(T), "--seq-len", str(T), "--batch-size", "1"]
    diag = run_child(depthlab("diagnose", str(cache), *common, "--no-joint-check", "--out", str(out / "diagnose")),
                     out / "diagnose.log")
    rep = json.loads((out / "diagnose" / "report.json").read_text())
    prune = run_child(depthlab("prune", str(cache), "--remove", str(s["remove"]), "--method", "angular-block", *common,
                               "--out", str(out / "pruned")), out / "prune.log")
    prep = json.loads((out / "pruned" / "prune.json").read_text())
    throughput = matmul_throughput(s, [T, 4 * T, 16 * T])
    reached = achieved(rep, s, T)
    check = transformers_check(cache, out / "pruned", prep["removed_blocks"])
    eng = rep["engine"]
    return {
        "shapes": s, "checkpoint": {"dir": str(cache), **ckpt}, "tokens": T,
        "diagnose": {**diag, "engine": eng, "loss": rep["loss"], "summary": rep["summary"], "achieved": reached},
        "prune": {**prune, "engine": prep["engine"], "removed_blocks": prep["removed_blocks"], "loss": prep["loss"],
                  "export": prep["export"], "summary": prep["summary"]},
        "matmul_gflop_per_s_fp32": throughput,
        "transformers_check": check,
        "goals": {
            "peak_rss_le_6GB": max(diag["peak_rss_bytes"], prune["peak_rss_bytes"]) <= 6 * 10**9,
            "each_layer_read_once_per_sweep": eng["bytes_read"] == eng["checkpoint_bytes"] and eng["weight_passes"] == 1,
            "flops_ratio": round(reached["gflop_per_s"] / max(v for k, v in throughput.items() if k != "head"), 3),
            "flops_ratio_ge_0.6": reached["gflop_per_s"] >= 0.6 * max(v for k, v in throughput.items() if k != "head"),
            "pruned_loads_with_equal_logits": "skipped" not in check
            and check["max_abs_logit_diff"] <= 1e-3 * max(1.0, check["max_abs_logit"]),
        },
    }


def run_smollm2(args: argparse.Namespace) -> dict:
    """``depthlab diagnose`` of SmolLM2-135M at its default token count, streamed and in memory."""
    cache = Path(args.cache_dir or Path.home() / ".cache" / "depthlab" / "bench" / "smollm2-safetensors")
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "smollm2-runs")
    preflight(cache, out, {**SHAPES["toy"], "remove": 0}, "smollm2")
    _smollm2_dir(args)
    runs: dict[str, list[dict]] = {"streamed": [], "in_memory": []}
    for r in range(args.repeats):
        for engine, flag in (("streamed", "--stream"), ("in_memory", "--no-stream"))[:: 1 if r % 2 == 0 else -1]:
            dest = out / f"{engine}-{r}"
            shutil.rmtree(dest, ignore_errors=True)
            tokens = ["--tokens", str(args.tokens)] if args.tokens else []  # none: diagnose's default for the device
            res = run_child(depthlab("diagnose", str(cache), flag, *tokens, "--out", str(dest)), out / f"{engine}-{r}.log")
            rep = json.loads((dest / "report.json").read_text())
            runs[engine].append({**res, "tokens": rep["data"]["tokens"], "engine": rep.get("engine"), "report": rep})
    a, b = runs["streamed"][0]["report"], runs["in_memory"][0]["report"]
    diff = max(abs(x - y) for x, y in zip(a["removal"]["delta_loss"] + a["angular"]["adjacent"],
                                          b["removal"]["delta_loss"] + b["angular"]["adjacent"]))
    units_lens = _units_lens_diff(a, b)
    wall = {k: min(r["wall_s"] for r in v) for k, v in runs.items()}
    rss = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    for v in runs.values():
        for r in v:
            r.pop("report")
    return {"runs": runs, "wall_s": wall, "peak_rss_bytes": rss, "max_abs_diff_units_and_lens": units_lens,
            "wall_ratio_streamed_over_in_memory": round(wall["streamed"] / wall["in_memory"], 3),
            "peak_rss_ratio_streamed_over_in_memory": round(rss["streamed"] / rss["in_memory"], 3),
            "max_abs_diff_delta_loss_and_adjacent_angular": diff,
            "goal_wall_ratio_le_1.3": wall["streamed"] <= 1.3 * wall["in_memory"]}


def _units_lens_diff(a: dict, b: dict) -> float | None:
    """max |Δ| over the attention / MLP units and the logit lens of two reports (None when either lacks them)."""
    if not all(k in r for k in ("sublayers", "lens") for r in (a, b)):
        return None
    nums = lambda r: [v for u in ("attn", "mlp") for k in ("contribution", "angular", "delta_loss")  # noqa: E731
                      for v in r["sublayers"][u].get(k, [])] + [v for k in ("loss", "agreement", "kl") for v in r["lens"][k]]
    return max(abs(x - y) for x, y in zip(nums(a), nums(b)))


@torch.no_grad()
def run_compute_dtypes(args: argparse.Namespace) -> dict:
    """One decoder layer of the 8B (or toy) shape on ``--tokens`` tokens: bf16 weights computed in bf16, against
    the same weights upcast to fp32 first (the upcast timed with it)."""
    import copy

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    s, T = SHAPES["toy" if args.toy else "8b"], args.tokens
    config = _config(s)
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16).eval()
    for p in layer.parameters():
        p.normal_(0.0, INIT_STD) if p.dim() == 2 else p.fill_(1.0)
    x = torch.randn(1, T, s["d_model"])
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(T)[None])

    def bf16() -> None:
        layer(x.bfloat16(), position_embeddings=(cos.bfloat16(), sin.bfloat16()))

    def upcast() -> None:
        copy.deepcopy(layer).float()(x, position_embeddings=(cos, sin))

    flops = T * layer_flops_per_token(s, T)
    out = {"shapes": s, "tokens": T, "layer_flops": flops}
    for name, fn in (("bf16_compute", bf16), ("fp32_upcast_per_layer", upcast)):
        fn()  # warm-up
        best = min(_timed(fn) for _ in range(args.repeats + 1))
        out[name] = {"seconds": round(best, 3), "gflop_per_s": round(flops / best / 1e9, 2)}
    out["faster"] = min(("bf16_compute", "fp32_upcast_per_layer"), key=lambda k: out[k]["seconds"])
    return out


def _smollm2_dir(args: argparse.Namespace) -> Path:
    cache = Path(args.cache_dir or Path.home() / ".cache" / "depthlab" / "bench" / "smollm2-safetensors")
    if not (cache / "complete.json").is_file():
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_models import smollm2_safetensors

        smollm2_safetensors(cache)
        (cache / "complete.json").write_text("{}\n")
    return cache


@torch.no_grad()
def run_rows(args: argparse.Namespace, streams: int = 31, seqs: int = 8, seq_len: int = 256) -> dict:
    """Seconds per token row of one SmolLM2 layer (the 4th) by token rows per call, interleaved rounds."""
    from depthlab.targets.stream.open import open_streamed
    from depthlab.targets.stream.sweep import CPU_ROWS_PER_CALL

    src = open_streamed(str(_smollm2_dir(args))).source
    call = src.layer_calls(seq_len)[3]
    torch.manual_seed(0)
    x = torch.randn(streams * seqs, seq_len, int(src.skeleton.config.hidden_size))
    per_call = [1, 2, 4, 8, 16, 32, streams * seqs]  # sequences per call
    times: dict[int, list[float]] = {k * seq_len: [] for k in per_call}
    with src.layer(3) as layer:
        call(layer, x[:1])  # warm-up
        for _ in range(args.repeats + 1):
            for k in per_call:
                t0 = time.perf_counter()
                for c in range(0, x.shape[0], k):
                    call(layer, x[c:c + k])
                times[k * seq_len].append((time.perf_counter() - t0) / (x.shape[0] * seq_len))
    us = {rows: round(min(v) * 1e6, 2) for rows, v in times.items()}
    best = min(us, key=us.get)
    return {"layer": 4, "streams": streams, "sequences": seqs, "seq_len": seq_len,
            "microseconds_per_token_row": us, "all_rounds_us": {r: [round(t * 1e6, 2) for t in v] for r, v in times.items()},
            "fastest_rows_per_call": best, "engine_cpu_cap_rows": CPU_ROWS_PER_CALL,
            "engine_cap_vs_fastest": round(us[min(us, key=lambda r: abs(r - CPU_ROWS_PER_CALL))] / us[best], 3),
            "one_call_vs_fastest": round(us[streams * seqs * seq_len] / us[best], 3)}


def run_rows_ab(args: argparse.Namespace) -> dict:
    """The streamed diagnose of SmolLM2 at 2,048 tokens with the CPU row cap and without it, interleaved."""
    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.targets.stream import sweep as engine
    from depthlab.targets.stream.open import open_streamed

    path, cap = str(_smollm2_dir(args)), engine.CPU_ROWS_PER_CALL
    opts = DiagnoseOptions(tokens=2048, jacobian=False, joint_check=False, progress=False)
    out: dict[str, dict] = {"capped": {"seconds": []}, "uncapped": {"seconds": []}}
    reports = {}
    for r in range(args.repeats):
        for name in ("capped", "uncapped")[:: 1 if r % 2 == 0 else -1]:
            engine.CPU_ROWS_PER_CALL = cap if name == "capped" else 1 << 40
            target = open_streamed(path)
            out[name]["rows_per_call"] = engine.Sweeper(target)._budget()[1]
            t0 = time.perf_counter()
            reports[name] = diagnose(target, opts)
            out[name]["seconds"].append(round(time.perf_counter() - t0, 1))
    engine.CPU_ROWS_PER_CALL = cap
    a, b = reports["capped"], reports["uncapped"]
    diff = max(abs(x - y) for x, y in zip(a["removal"]["delta_loss"] + a["angular"]["adjacent"],
                                          b["removal"]["delta_loss"] + b["angular"]["adjacent"]))
    best = {k: min(v["seconds"]) for k, v in out.items()}
    return {"tokens": a["data"]["tokens"], **out, "capped_over_uncapped": round(best["capped"] / best["uncapped"], 3),
            "max_abs_diff_delta_loss_and_adjacent_angular": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toy", action="store_true", help="tiny shapes (the same steps, about a minute)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M: streamed vs in-memory diagnose")
    ap.add_argument("--compute-dtypes", action="store_true", help="one layer: bf16 compute vs fp32 upcast")
    ap.add_argument("--rows", action="store_true", help="one SmolLM2 layer: time per token by rows per call")
    ap.add_argument("--rows-ab", action="store_true", help="SmolLM2 streamed diagnose: the CPU row cap on vs off")
    ap.add_argument("--tokens", type=int, default=None,
                    help="evaluation tokens (default 256, one sequence; --smollm2: diagnose's default for the device)")
    ap.add_argument("--repeats", type=int, default=1, help="timed repetitions (smollm2: interleaved rounds)")
    ap.add_argument("--cache-dir", help="where the checkpoint is written (default ~/.cache/depthlab/bench/...)")
    ap.add_argument("--out", help="where the runs write (default ~/.cache/depthlab/bench/...-runs)")
    ap.add_argument("--result", help="result folder or .json file (default streamed_<mode>_cpu.json outside the "
                    "checkout; --result benchmarks/results updates the committed one)")
    args = ap.parse_args()
    if args.tokens is None and not (args.smollm2 or args.rows or args.rows_ab):
        args.tokens = 256
    load_before = list(os.getloadavg())
    if args.compute_dtypes:
        mode, result = ("bf16_vs_fp32" + ("_toy" if args.toy else "")), run_compute_dtypes(args)
    elif args.smollm2:
        mode, result = "smollm2", run_smollm2(args)
    elif args.rows:
        mode, result = "rows", run_rows(args)
    elif args.rows_ab:
        mode, result = "rows_ab", run_rows_ab(args)
    else:
        mode = "toy" if args.toy else "8b"
        result = run_big(mode, args)
    record = {"command": "python " + shlex.join(["benchmarks/streamed_8b.py", *sys.argv[1:]]), **machine(), **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    path = result_path(f"streamed_{mode}_cpu.json", args.result)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("versions",)}, indent=1, default=str)[:6000])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
