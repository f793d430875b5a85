"""DepthMonitor: the trainer's series on the trainer's checkpoints, blocks found or named for any model,
regular scalar names."""

import json
import math

import pytest
import torch
from torch import nn

import depthlab as d
from depthlab.analysis.diagnostics.probes import TRACKED, depth_probe
from depthlab.analysis.monitor import DepthMonitor, block_tag, probe_scalars, record_scalars, resolve_layers
from depthlab.base.errors import DepthlabError
from depthlab.targets import load_run
from depthlab.train import TrainConfig, train
from depthlab.train.data import load_train_data
from depthlab.train.distributed import DistEnv

SEQ, PROBE = 32, 4


def test_monitor_equals_the_trainers_series_on_the_same_checkpoint_and_probe_batch(tmp_path):
    """Every probe line of metrics.jsonl (steps 3 and 6, removal at the last only, as the trainer's
    schedule says) is what DepthMonitor returns on that step's checkpoint with the trainer's probe batch."""
    run = tmp_path / "run"
    cfg = TrainConfig(data="builtin", tokenizer="bytes", steps=6, seq_len=SEQ, batch_size=4, lr=3e-3, variance_every=3,
                      eval_every=0, eval_tokens=1024, probe_batch_size=PROBE, ckpt_every=3, keep_last=3,
                      track_removal=True)
    train(d.from_preset("tiny", scheme="lns", n_layers=4, d_model=32, n_heads=2, d_ff=48), cfg, run, quiet=True)
    lines = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "layer_angular" in r}
    assert sorted(lines) == [0, 3, 6] and "layer_removal" not in lines[3] and "layer_removal" in lines[6]
    _, tok, saved = load_run(str(run))
    data = load_train_data(TrainConfig.from_dict(saved["train"]), tok, DistEnv())
    for step in (3, 6):
        model, _, _ = load_run(str(run / "checkpoint" / f"step-{step:08d}"))
        monitor = DepthMonitor(model, (data.probe_batch, data.probe_labels), every=3)
        assert monitor.step(step - 1) is None  # not a probe step
        scalars = monitor.step(step, last=step == 6)
        record = monitor.records[-1]
        assert set(record) == set(lines[step])
        for key in TRACKED:
            if key in record:
                assert record[key] == pytest.approx(lines[step][key], rel=1e-6, abs=1e-9), (step, key)
        assert scalars == probe_scalars({k: v for k, v in record.items() if k != "step"})
        assert monitor.step(step, last=True) is None  # each step once


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attention_norm = nn.RMSNorm(d)
        self.ffn_norm = nn.RMSNorm(d)
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, h, freqs):  # torchtitan's call: layer(h, freqs_cis)
        h = h + self.a(self.attention_norm(h)) * freqs
        return h + self.b(torch.tanh(self.ffn_norm(h)))


class TitanStyle(nn.Module):
    """torchtitan's layout: blocks in a ModuleDict keyed by their index, called with extra arguments."""

    def __init__(self, vocab=40, d=16, n=5):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleDict({str(i): Block(d) for i in range(n)})
        self.norm, self.output = nn.RMSNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.tok_embeddings(ids)
        freqs = torch.linspace(0.5, 1.5, h.shape[-1])
        for layer in self.layers.values():
            h = layer(h, freqs)
        return self.output(self.norm(h))


def test_a_moduledict_model_find_layers_cannot_see_gets_naive_numbers():
    torch.manual_seed(0)
    model = TitanStyle().train()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 2.0)
    ids = torch.randint(0, 40, (3, 9))
    with pytest.raises(DepthlabError, match="cannot find the layer list"):
        DepthMonitor(model, ids)
    monitor = DepthMonitor(model, ids, every=1, layers="layers", removal_every=1)
    assert monitor.n_layers == 5 and resolve_layers(model, model.layers) == list(model.layers.values())
    monitor.step(1)
    got = monitor.records[-1]
    assert model.training  # the train/eval flags are restored
    x, y = ids[:, :-1], ids[:, 1:]
    freqs = torch.linspace(0.5, 1.5, 16)
    with torch.no_grad():
        hs = [model.tok_embeddings(x)]
        for layer in model.layers.values():
            hs.append(layer(hs[-1], freqs))
        base = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    for l, blk in enumerate(model.layers.values(), 1):
        a, b = hs[l - 1].double(), hs[l].double()
        assert got["layer_contribution"][l - 1] == pytest.approx(((b - a).norm(dim=-1) / a.norm(dim=-1)).mean().item())
        cos = nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1, 1)
        assert got["layer_angular"][l - 1] == pytest.approx((cos.acos() / math.pi).mean().item(), abs=1e-3)
        w = torch.cat([blk.attention_norm.weight, blk.ffn_norm.weight]).abs().mean().item()
        assert got["layer_norm_gain"][l - 1] == pytest.approx(w)
        with torch.no_grad():  # removal by hand: the remaining blocks on x^l
            h = hs[l - 1]
            for later in list(model.layers.values())[l:]:
                h = later(h, freqs)
            loss = nn.functional.cross_entropy(model.output(model.norm(h)).flatten(0, 1), y.flatten()).item()
        assert got["layer_removal"][l - 1] == pytest.approx(loss - base, abs=1e-5)


def test_schedule_probes_every_nth_step_and_the_last_with_the_trainers_removal_rhythm():
    model = d.build_model(d.from_preset("tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=30))
    monitor = DepthMonitor(model, torch.randint(0, 30, (2, 7)), every=2, removal_every=2)
    got = {s: monitor.step(s, last=s == 7) for s in range(0, 8)}
    assert [s for s, v in got.items() if v] == [0, 2, 4, 6, 7]
    removal = [r["step"] for r in monitor.records if "layer_removal" in r]
    assert removal == [0, 4, 7]  # start, every 2nd probe (4 // 2 = 2), last
    assert monitor.seconds > 0


def test_names_are_regular_zero_padded_and_one_based():
    assert block_tag("layer_angular", 7, 12) == "depth/angular/block_07"
    assert block_tag("layer_removal", 7, 128) == "depth/removal/block_007"
    assert block_tag("layer_variance", 3, 5) == "depth/variance/block_03"
    s = probe_scalars({"layer_angular": [0.1, 0.2, 0.3], "layer_norm_gain": [None, 1.0, 2.0]})
    assert s == {"depth/angular/block_01": 0.1, "depth/angular/block_02": 0.2, "depth/angular/block_03": 0.3,
                 "depth_deepest_third/angular": 0.3, "depth/norm_gain/block_02": 1.0,
                 "depth/norm_gain/block_03": 2.0, "depth_deepest_third/norm_gain": 2.0}
    assert record_scalars({"step": 3, "loss": 2.5, "eval_ppl": 9.0, "tokens": 64}) == {
        "train/loss": 2.5, "eval/ppl": 9.0, "train/tokens": 64.0}


@pytest.mark.parametrize("bad, match", [
    (dict(every=0), "every must be a positive"),
    (dict(layers="transformer.h"), "has no attribute 'transformer'"),
    (dict(layers="norm"), "is a RMSNorm"),
])
def test_bad_arguments_fail_in_one_line(bad, match):
    with pytest.raises(DepthlabError, match=match):
        DepthMonitor(TitanStyle(), torch.randint(0, 40, (2, 5)), **{"layers": "layers", **bad})


def test_probe_matches_depth_probe_on_an_hf_style_output():
    """The default forward reads ``.logits`` of an HF model and calls it without a cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    ids = torch.randint(0, 50, (2, 9))
    monitor = DepthMonitor(model, ids, every=1)
    monitor.step(1, last=True)
    ref = depth_probe(model, ids[:, :-1], ids[:, 1:])
    assert {k: monitor.records[-1][k] for k in ref} == ref
