"""compare --finetune builtin-sft --eval builtin-mc: end to end on tiny models, the Table-2-shaped table."""

from __future__ import annotations

import json

import pytest

from depthlab.analysis.diagnostics import DiagnoseOptions
from depthlab.base.errors import DepthlabError
from depthlab.compare import CompareConfig, compare
from depthlab.compare.config import Downstream
from depthlab.compare.downstream import downstream_table
from depthlab.train import TrainConfig


def small_config(downstream: Downstream, seeds=(0,)) -> CompareConfig:
    train = TrainConfig(data="builtin", tokenizer="bytes", steps=2, seq_len=32, batch_size=2, eval_tokens=256,
                        device="cpu")
    diag = DiagnoseOptions(tokens=256, seq_len=32, batch_size=4, jacobian=False, progress=False)
    return CompareConfig(schemes=["pre", "lns"], preset="tiny", seeds=list(seeds), train=train, diagnose=diag,
                         model_overrides={"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64},
                         downstream=downstream)


def test_compare_finetune_eval_end_to_end(tmp_path):
    ds = Downstream(finetune="builtin-sft", tasks="builtin-mc", steps=2, batch_size=2, seq_len=256, limit=8)
    result = compare(small_config(ds), tmp_path, command="pytest")
    table = {e["scheme"]: e for e in result["downstream"]}
    assert set(table) == {"pre", "lns"}
    for scheme in ("pre", "lns"):
        run = tmp_path / "runs" / f"{scheme}-seed0"
        ev = json.loads((run / "downstream" / "eval.json").read_text())
        assert "finetune" in ev["target"]  # the fine-tuned model was scored
        acc = ev["results"]["builtin-mc"]["acc"]
        assert ev["results"]["builtin-mc"]["n"] == 8
        assert table[scheme]["tasks"]["builtin-mc"][0] == pytest.approx(100 * acc)
        assert table[scheme]["avg"][0] == pytest.approx(100 * acc)
        ft = json.loads((run / "finetune" / "config.json").read_text())
        assert ft["model"]["scheme"] == scheme and ft["train"]["steps"] == 2 and ft["train"]["seed"] == 0
    assert table["pre"]["delta_avg_vs_baseline"][0] == 0
    assert table["lns"]["delta_avg_vs_baseline"][0] == pytest.approx(table["lns"]["avg"][0] - table["pre"]["avg"][0])
    md = (tmp_path / "summary.md").read_text()
    assert "## Downstream (the paper's Table 2 shape)" in md
    assert "| scheme | SFT held-out loss | builtin-mc | avg | Δ avg vs pre |" in md
    assert "Downstream (Table 2 shape)" in (tmp_path / "report.html").read_text()
    again = compare(small_config(ds), tmp_path, command="pytest")  # rerun: everything reused
    assert again["downstream"] == result["downstream"]


def test_seeds_give_mean_and_spread_and_deltas_per_seed():
    rows = [{"scheme": s, "seed": k, "downstream": {"acc": {"a": acc, "b": acc / 2}, "sft_eval_loss": 1.0}}
            for s, k, acc in (("pre", 0, 0.4), ("pre", 1, 0.6), ("lns", 0, 0.5), ("lns", 1, 0.8))]
    t = {e["scheme"]: e for e in downstream_table(rows, ["pre", "lns"])}
    assert t["lns"]["tasks"]["a"][0] == pytest.approx(65.0)
    assert t["lns"]["avg"][0] == pytest.approx(48.75)
    assert t["lns"]["delta_avg_vs_baseline"][0] == pytest.approx((7.5 + 15) / 2)
    assert t["lns"]["delta_avg_vs_baseline"][1] == pytest.approx(5.303300858899107)


def test_bad_downstream_input_fails_before_training(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no instruction"}\n')
    for ds, what in ((Downstream(finetune=str(bad), tasks="builtin-mc"), "not an SFT record"),
                     (Downstream(finetune="builtin-sft"), "needs --eval"),
                     (Downstream(tasks="nope"), "unknown task")):
        with pytest.raises(DepthlabError, match=what):
            compare(small_config(ds), tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_downstream_on_a_vit_compare_is_refused_before_training(tmp_path):
    cfg = CompareConfig(schemes=["pre", "lns"], preset="vit-tiny", train=TrainConfig(data="digits", steps=2),
                        downstream=Downstream(tasks="builtin-mc"))
    with pytest.raises(DepthlabError, match="need language models"):
        compare(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()
