"""The other loops: the plain-loop example (a nanoGPT-style model, docs/monitor.md's code) and a Lightning
Trainer; and the README / docs code blocks are the examples' code, character for character."""

import csv
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from monitor_readers import need
from torch import nn

from depthlab.analysis.diagnostics.probes import depth_probe
from depthlab.analysis.monitor import block_tag, probe_scalars

ROOT = Path(__file__).resolve().parents[3]


def example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plain_loop_example_tracks_a_nanogpt_style_model(tmp_path):
    model, monitor = example("monitor_plain_loop").main(
        ["--layers", "3", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--batch", "4", "--steps", "5",
         "--every", "2", "--probe-rows", "2", "--out", str(tmp_path)])
    assert [r["step"] for r in monitor.records] == [0, 2, 4, 5]
    logged = [__import__("json").loads(x) for x in (tmp_path / "depth.jsonl").read_text().splitlines()]
    assert [x.pop("step") for x in logged] == [0, 2, 4, 5]
    assert logged[-1] == probe_scalars({k: v for k, v in monitor.records[-1].items() if k != "step"})
    # the last probe is the tracking function on the trained model, blocks = transformer.h
    ids = monitor.inputs
    ref = depth_probe(model.eval(), ids, monitor.labels, forward=lambda x: model(x)[0], layers=list(model.transformer.h))
    assert {k: monitor.records[-1][k] for k in ref} == ref
    assert monitor.records[-1]["layer_norm_gain"][0] == pytest.approx(
        torch.cat([model.transformer.h[0].ln_1.weight, model.transformer.h[0].ln_2.weight]).abs().mean().item())
    assert (tmp_path / "depth_tracking.png").stat().st_size > 1000


def readme_blocks(text: str) -> dict[str, str]:
    return dict(re.findall(r"<!-- example:([\w-]+) -->\n```python\n(.*?)```", text, re.S))


def example_blocks() -> dict[str, str]:
    out = {}
    for path in (ROOT / "examples").glob("monitor_*.py"):
        for name, body in re.findall(r"# readme:start ([\w-]+)\n(.*?)    # readme:end", path.read_text(), re.S):
            out[name] = "".join(line[4:] + "\n" for line in body.splitlines())
    return out


@pytest.mark.parametrize(("doc", "names"), [("README.md", {"hf-trainer"}), ("docs/monitor.md", {"hf-trainer", "plain-loop"})])
def test_the_docs_show_the_code_the_tests_run(doc, names):
    shown, run = readme_blocks((ROOT / doc).read_text()), example_blocks()
    assert set(run) == {"hf-trainer", "plain-loop"} and set(shown) == names
    for name in names:
        assert shown[name] == run[name], f"{doc}: block {name} differs from examples/ (update the doc)"


class TinyLM(nn.Module):
    def __init__(self, vocab=30, d=16, n=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d)) for _ in range(n))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


@need("lightning")
def test_lightning_callback_logs_to_the_trainers_loggers(tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from depthlab.analysis.monitor import DepthMonitorLightning

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = TinyLM()

        def training_step(self, batch, _):
            (ids,) = batch
            logits = self.net(ids[:, :-1])
            return nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, 30, (40, 9)))
    probe = torch.randint(0, 30, (3, 9))
    module = Module()
    callback = DepthMonitorLightning(probe, every=2, module="net", removal_every=1)
    trainer = L.Trainer(max_steps=5, accumulate_grad_batches=2, logger=CSVLogger(tmp_path), callbacks=[callback],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", log_every_n_steps=1)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert [r["step"] for r in callback.monitor.records] == [0, 2, 4, 5]  # optimizer steps, not micro-batches
    rows = list(csv.DictReader(open(next(Path(tmp_path).rglob("metrics.csv")))))
    tag = block_tag("layer_angular", 3, 3)
    logged = {int(r["step"]): float(r[tag]) for r in rows if r.get(tag)}
    assert logged == {r["step"]: pytest.approx(r["layer_angular"][2], rel=1e-6) for r in callback.monitor.records}
    ref = depth_probe(module.net.eval(), probe[:, :-1], probe[:, 1:], forward=module.net)
    assert {k: callback.monitor.records[-1][k] for k in ref} == ref
