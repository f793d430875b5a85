"""The paper's Fig 4 on the tiny preset: Pre-LN's last-block output variance explodes with depth,
LayerNorm Scaling keeps it several times smaller (a short CPU run on the built-in corpus)."""

from __future__ import annotations

import json

from depthlab import from_preset
from depthlab.train import TrainConfig, train


def test_tiny_preset_pre_variance_grows_with_depth_and_lns_tames_it(tmp_path):
    # 20 steps of 8 x 32 tokens at lr 3e-3 reach, at block 16: pre ~220, lns ~28 with bytes; with
    # bpe:4096 pre ~120, lns ~15 (25 steps, seeds 0-2: pre 150-200, lns ~20).
    cfg = TrainConfig(data="builtin", tokenizer="bytes", steps=20, lr=3e-3, batch_size=8, seq_len=32,
                      eval_tokens=1024, eval_every=0, ckpt_every=0, variance_every=20, log_every=20)
    var = {}
    for scheme in ("pre", "lns"):
        summary = train(from_preset("tiny", scheme=scheme), cfg, tmp_path / scheme, quiet=True)
        var[scheme] = summary["layer_variance"]
        assert len(var[scheme]) == 16
        lines = [json.loads(l) for l in (tmp_path / scheme / "metrics.jsonl").read_text().splitlines()]
        assert [l["step"] for l in lines if "layer_variance" in l] == [0, 20]
    pre, lns = var["pre"], var["lns"]
    assert pre[-1] > 4 * lns[-1], (pre, lns)
    assert all(b > a for a, b in zip(pre, pre[1:])), pre  # grows block after block
    assert pre[-1] > 20 * pre[0]
