"""The GPU runbook's scripts (benchmarks/gpu/) in their dry-run mode (``--device cpu``, toy sizes), so the
runbook cannot rot: each runs end to end, writes what the device call would bring back (at most 8 files, the
device's limit) and records its results; and the corpus's trip through two calls (prepare.py splits it, call (a)
leaves a part on the machine, call (b) puts it back together, or trains on what it has)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dry_run(script: str, tmp_path: Path) -> tuple[dict, list[str]]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, f"benchmarks/gpu/{script}", "--device", "cpu", "--out", str(out),
                           "--carry", str(tmp_path / "no-carry")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir())  # what the device returns from $OUT
    record = json.loads((out / f"{script[0]}.json").read_text())
    assert record["steps"] and all(s["rc"] == 0 for s in record["steps"])
    assert {"torch", "device_name", "git_commit"} <= set(record)
    return record, files


def members(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def bench(module: str):
    """A module of benchmarks/gpu/ (or benchmarks/) imported by name."""
    import importlib

    for folder in (REPO / "benchmarks" / "gpu", REPO / "benchmarks"):
        sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(module)
    finally:
        del sys.path[:2]


def test_a_dry_run_collects_gpu_tests_measures_every_lever_and_profiles(tmp_path):
    record, files = dry_run("a_setup_tests_throughput.py", tmp_path)
    assert {"a.json", "a.log", "pytest.log", "throughput_130m.json", "throughput_1b.json"} <= set(files)
    collected = (tmp_path / "out" / "pytest.log").read_text()
    assert "test_sdpa_takes_flash_or_cudnn_for_the_causal_case" in collected  # the GPU tests are there
    assert "test_a_training_step_never_waits_for_the_gpu" in collected
    res = record["results"]
    a = bench("a_setup_tests_throughput")
    assert set(res["compile_s"]) == {f"{p} {v}" for _, p, vs in a.CHAINS for v in vs}
    assert all(v > 0 for v in res["compile_s"].values())  # each background warm-up wrote its first step
    lev = res["levers"]["130m"]
    # every lever of the GPU's list, as the toy measures it (eager; micro-batches / 16): all warmed, all measured
    assert set(lev["variants"]) == {a.dry(v) for v, _ in a.VARIANTS_130M} == {
        "pre", "pre+chunkce", "pre+foreach", "pre+mb2", "pre+mb4", "pre+chunkce+mb4"}
    assert all(v["tokens_per_s_median"] > 0 for v in lev["variants"].values())
    assert lev["default"] == "pre" and set(lev["over_default"]) == set(lev["variants"]) - {"pre"}
    assert lev["fastest"] in lev["variants"] and lev["goal_mfu"] == 0.45
    assert lev["variants"]["pre+mb4"]["micro_batch_size"] == 4 and lev["variants"]["pre"]["micro_batch_size"] == 1
    for name in ("pre", "pre+chunkce"):  # the profile: shares of the step's time by kind, launch gaps, top kernels
        prof = lev["profile"][name]
        assert sum(prof["shares"].values()) == pytest.approx(1.0) and {"matmul", "cross_entropy"} <= set(prof["shares"])
        assert 0 <= prof["launch_gap_share"] < 1 and prof["top"][0]["ms_per_step"] > 0
    assert set(res["levers"]["1b"]["variants"]) == {"pre", "pre+dff72"} and "pre" in res["levers"]["1b"]["profile"]
    assert record["seconds"] < 250  # the hard deadline held


def test_a_stash_only_keeps_the_corpus_part_and_measures_nothing(tmp_path):
    a = bench("a_setup_tests_throughput")
    assert a.main(["--stash-only", "--device", "cpu", "--out", str(tmp_path / "out"),
                   "--carry", str(tmp_path / "none")]) == 0
    record = json.loads((tmp_path / "out" / "a.json").read_text())
    assert record["results"] == {"kept_for_later_calls": []} and record["steps"] == []


def test_throughput_variants_name_each_lever_and_refuse_what_they_cannot_be():
    tt = bench("train_throughput")
    v = tt.parse_variant("pre+bf16+compile+chunkce512+mb32")
    assert (v.compile, v.chunkce, v.ce_rows, v.micro, v.mode) == (True, True, 512, 32, None)
    assert tt.parse_variant("pre+bf16+autotune").mode == "max-autotune-no-cudagraphs"
    assert tt.parse_variant("lns+bf16+cudagraphs").mode == "reduce-overhead"
    assert tt.parse_variant("pre+foreach").foreach and tt.parse_variant("official+mb4").micro == 4
    for bad, why in (("pre+cudagraphs+autotune", "not both"), ("hf+chunkce", "depthlab's trainer"),
                     ("pre+mb0", "unknown part"), ("pre+fast", "unknown part"), ("official+bf16", "no \\+flags")):
        with pytest.raises(ValueError, match=why):
            tt.parse_variant(bad)


def test_step_profile_names_kernels_and_finds_the_gpus_idle_time():
    sp = bench("step_profile")
    names = {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
             "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTT": "matmul", "triton_tem_fused_mm_0": "matmul",
             "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>": "attention",
             "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
             "triton_red_fused__log_softmax__to_copy_nll_loss_forward_3": "cross_entropy",
             "triton_poi_fused_embedding_dense_backward_1": "embedding",
             "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
             "Memcpy HtoD (Pinned -> Device)": "copy", "triton_per_fused_add_mean_mul_pow_rsqrt_2": "other"}
    assert {n: sp.categorise(n) for n in names} == names
    # two steps: kernels 0-40 us and 50-80 us (a 10 us gap), one nested in time on another stream
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": 0, "dur": 30},
        {"ph": "X", "cat": "kernel", "name": "triton_red_fused__log_softmax_0", "ts": 20, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "multi_tensor_apply_kernel", "ts": 50, "dur": 30},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 5}]}
    b = sp.breakdown(trace, "cuda", steps=2)
    assert b["launch_gap_share"] == pytest.approx(10 / 80) and b["events"] == 3
    assert b["shares"] == pytest.approx({"matmul": 0.375, "cross_entropy": 0.25, "optimizer": 0.375})
    assert b["time_s_per_step"] == pytest.approx(40e-6) and b["top"][0]["calls_per_step"] == 0.5
    cpu = {"traceEvents": [  # aten::linear (10) holds aten::addmm (7): self times 3 and 7; then a 5 us gap
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 2, "dur": 7, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 15, "dur": 5, "pid": 1, "tid": 1}]}
    b = sp.breakdown(cpu, "cpu", steps=1)
    assert b["shares"] == pytest.approx({"matmul": 10 / 15, "optimizer": 5 / 15})
    assert b["launch_gap_share"] == pytest.approx(5 / 20)


def test_b_dry_run_trains_both_schemes_with_depth_tracking_and_counts_epochs(tmp_path):
    record, files = dry_run("b_science_compare.py", tmp_path)
    assert set(files) == {"b.json", "b.log", "b-results.tar.gz"}
    res = record["results"]
    assert res["plan"]["steps"] == 3 and res["data"] == "builtin"
    assert {r["tokens"] for r in res["runs"].values()} == {192} and all(r["finished"] for r in res["runs"].values())
    assert res["corpus"]["train_tokens"] > 0 and res["corpus"]["epochs"] == pytest.approx(192 / res["corpus"]["train_tokens"])
    assert res["compare_summary"]["settings"]["schemes"] == ["pre", "lns"]
    # the regime's defaults (weight decay 0.1, AdamW; seq 1024 on the GPU, the toy's 32 here) reach every run
    assert res["plan"]["regime"] == {"weight_decay": 0.1, "seq_len": 32, "optimizer": "adamw"}
    trained = res["compare_summary"]["settings"]["train"]
    assert (trained["weight_decay"], trained["optimizer"]) == (0.1, "adamw")
    names = members(tmp_path / "out" / "b-results.tar.gz")
    assert "compare/summary.json" in names and not any("checkpoint" in n for n in names)
    for scheme in ("pre", "lns"):
        metrics = [n for n in names if n.startswith(f"compare/runs/{scheme}") and n.endswith("metrics.jsonl")]
        assert metrics, names


def test_b_takes_the_regime_as_flags_with_the_papers_batch_in_tokens(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from b_science_compare import compare_cmd, parse_args
    finally:
        sys.path.pop(0)
    for argv, batch, micro in (([], 128, 16), (["--seq-len", "256"], 512, 64), (["--seq-len", "2048"], 64, 8)):
        args = parse_args([*argv, "--out", str(tmp_path)])
        assert (args.batch_size, args.micro_batch_size, args.batch_size * args.seq_len) == (batch, micro, 131_072)
    args = parse_args(["--optimizer", "muon", "--weight-decay", "0", "--out", str(tmp_path)])
    cmd = compare_cmd(args, {"preset": "llama-130m", "steps": 10, "seq_len": args.seq_len, "batch_size": args.batch_size,
                             "micro_batch_size": args.micro_batch_size}, tmp_path / "cmp")
    flags = dict(zip(cmd, cmd[1:]))
    assert (flags["--optimizer"], flags["--weight-decay"], flags["--seq-len"], flags["--batch-size"]) == \
        ("muon", "0.0", "1024", "128")


def test_c_dry_run_streams_diagnose_and_prune_times_each_layer_and_runs_nccls_check(tmp_path):
    record, files = dry_run("c_diagnose.py", tmp_path)
    assert set(files) == {"c.json", "c.log", "nccl.json", "c-reports.tar.gz"}
    res = record["results"]
    diag, prune = res["diagnose_stream"], res["prune_stream"]
    L = res["streamed_shape"]["n_layers"]
    assert diag["finished"] and diag["rc"] == 0 and diag["layers_timed"] == L  # one weight pass, every layer timed
    eng, lanes = diag["engine"], L * (L + 1) // 2  # the intact lane and one per removed block, each through L - l + 1
    assert eng["weight_passes"] == 1 and eng["block_evals"] % lanes == 0 and eng["block_evals"] >= lanes  # per batch
    assert eng["token_evals"] % lanes == 0 and eng["token_evals"] >= lanes * res["streamed_tokens"]
    assert all(diag["seconds"][k] > 0 for k in ("read", "compute", "save", "head")) and diag["saved_bytes"] > 0
    assert diag["compute_tflops"] > 0 and diag["read_gb_per_s"] > 0 and diag["peak_host_rss_gib"] > 0
    assert prune["finished"] and prune["engine"]["weight_passes"] >= 2 and len(prune["passes"]) >= 2
    ex = res["extrapolation_70b"]
    assert ex["tokens_per_lane"] == eng["token_evals"] // lanes  # the 70B sweeps what the 8B swept, per lane
    assert ex["block_token_evals"] == 80 * 81 // 2 * ex["tokens_per_lane"] and ex["total_with_resume_state_s"] > 0
    assert len(ex["assumptions"]) >= 4
    nccl = res["nccl"]
    assert nccl["passed"] and nccl["backend"] == "gloo" and set(nccl["runs"]) == {
        "single", "ddp", "fsdp", "fsdp-resumed-as-ddp", "ddp-resumed-as-fsdp"}
    assert all(r["max_rel_loss_diff"] <= 1e-6 for n, r in nccl["runs"].items() if n != "single")
    names = members(tmp_path / "out" / "c-reports.tar.gz")
    assert "reports/8b-diagnose/report.json" in names and "reports/8b-pruned/prune.json" in names
    assert not any(n.endswith(".safetensors") for n in names)


def test_the_70b_extrapolation_scales_each_part_by_its_own_count():
    c = bench("c_diagnose")
    s8 = c.SHAPES["8b"]
    m = {"finished": True, "compute_tflops": 400.0, "read_gb_per_s": 2.0, "save_gb_per_s": 1.0,
         "saved_bytes": 1e9, "seconds": {"head": 3.0, "other": 20.0}}
    ex = c.extrapolate_70b(m, s8, 16_384, 139.8)
    flops = 3240 * 16_384 * c.layer_flops_per_token(c.SHAPE_70B, 256)
    assert ex["compute_s"] == pytest.approx(flops / 400e12, rel=1e-3)
    assert ex["read_s"] == pytest.approx(141.1 / 2.0, abs=0.1) and ex["head_s"] == pytest.approx(3.0 * 81 / 33 * 2, abs=0.1)
    assert ex["resume_state_bytes_written"] == pytest.approx(1e9 * (81 * 82) / (33 * 34) * 2)
    assert ex["fits_one_weight_pass"] and ex["total_with_resume_state_s"] > ex["total_without_resume_state_s"]
    assert c.extrapolate_70b({**m, "finished": False}, s8, 16_384, None) is None


def test_c_takes_streamed_args_that_start_with_a_dash():
    """The README's `--streamed-args '--stream'` once stopped argparse ("ambiguous option")."""
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from c_diagnose import glue_dash_values
    finally:
        sys.path.pop(0)
    argv = glue_dash_values(["--streamed-8b", "--streamed-args", "--stream --tokens 4096", "--device", "cpu"],
                            "--streamed-args")
    assert argv == ["--streamed-8b", "--streamed-args=--stream --tokens 4096", "--device", "cpu"]
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--streamed-8b", action="store_true")
    p.add_argument("--streamed-args", default="--stream")
    p.add_argument("--device")
    assert p.parse_args(argv).streamed_args == "--stream --tokens 4096"


def fake_shards(root: Path) -> Path:
    """A shard directory in open-english's layout: two training parts, one held-out part, a tokenizer folder."""
    import hashlib

    src = root / "shards"
    (src / "tokenizer").mkdir(parents=True)
    (src / "tokenizer" / "tokenizer.json").write_text("{}")
    parts = {"train": [], "val": []}
    for split, name, n in (("train", "train-00000.bin", 6), ("train", "train-00001.bin", 4), ("val", "val-00000.bin", 2)):
        data = bytes(range(2 * n))
        (src / name).write_bytes(data)
        parts[split].append({"file": name, "tokens": n, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (src / "shards.json").write_text(json.dumps({"dtype": "uint16", "train_tokens": 10, "parts": parts}))
    return src


def test_the_corpus_travels_in_two_calls_and_is_put_back_together(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from b_science_compare import assemble_corpus
        from prepare import split_corpus
    finally:
        sys.path.pop(0)
    gpu, stash = tmp_path / ".gpu", tmp_path / "stash"
    split_corpus(fake_shards(tmp_path), gpu)
    assert sorted(p.name for p in (gpu / "a" / "corpus").iterdir()) == ["train-00001.bin"]
    assert sorted(p.name for p in (gpu / "b" / "corpus").iterdir()) == ["shards.json", "tokenizer", "train-00000.bin",
                                                                         "val-00000.bin"]
    # the machine was given back between the calls: part 0 alone
    alone = assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c1")
    assert alone["train_tokens"] == 6 and alone["missing"] == ["train-00001.bin"]
    assert json.loads((tmp_path / "c1" / "shards.json").read_text())["parts"]["train"][0]["file"] == "train-00000.bin"
    # call (a) left part 1 in the stash: the whole corpus; a damaged copy there counts as missing
    stash.mkdir()
    shutil.copy2(gpu / "a" / "corpus" / "train-00001.bin", stash / "train-00001.bin")
    whole = assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c2")
    assert whole["train_tokens"] == 10 and whole["missing"] == []
    assert (tmp_path / "c2" / "train-00001.bin").read_bytes() == bytes(range(8))
    (stash / "train-00001.bin").write_bytes(b"\0" * 8)
    assert assemble_corpus(gpu / "b" / "corpus", stash, tmp_path / "c2")["missing"] == ["train-00001.bin"]


def test_a_padded_mlp_trains_exactly_as_the_unpadded_one():
    """+dffN (llama-1b's d_ff 5461 is no multiple of 8: tensor cores want aligned shapes): the extra units are zero,
    compute zero and get zero gradients, so a step leaves them zero and the loss equals the unpadded model's."""
    import torch

    from depthlab import build_model, from_preset

    tt = bench("train_throughput")
    cfg = from_preset("tiny", n_layers=2, d_model=16, n_heads=2, d_ff=21, vocab_size=50)
    small, wide = build_model(cfg), build_model(cfg.replace(d_ff=32))
    with torch.no_grad():
        for a, b in zip(small.parameters(), wide.parameters()):
            b.zero_()
            b[tuple(slice(0, n) for n in a.shape)].copy_(a)
    tt.pad_mlp(wide, 21)
    ids = torch.randint(50, (2, 9))
    losses = []
    for model in (small, wide):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        for _ in range(2):
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            losses.append(float(model(ids, labels=ids).loss))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    mlp = wide.blocks[0].ffn
    assert not mlp.gate_proj.weight[21:].any() and not mlp.up_proj.weight[21:].any() and not mlp.down_proj.weight[:, 21:].any()
