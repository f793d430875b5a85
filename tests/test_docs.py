"""The repository's docs tell the truth about themselves: citations resolve, nothing points outside."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = [p for p in ROOT.rglob("*") if p.suffix in {".py", ".md", ".sh", ".toml"} and ".git" not in p.parts
        and "site-packages" not in p.parts and p.is_file()]


def test_every_paper_citation_names_an_existing_section():
    headings = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[ .]", (ROOT / "docs" / "paper.md").read_text(), re.M)
    assert {"1", "1.2", "2", "5.1", "9.2"} <= set(headings)
    cited = {(p, m) for p in TEXT for m in re.findall(r"docs/paper\.md §(\d+(?:\.\d+)?)", p.read_text(errors="ignore"))}
    missing = sorted(f"{p.relative_to(ROOT)} cites §{m}" for p, m in cited if m not in headings)
    assert cited and not missing, missing


def test_nothing_cites_a_file_outside_the_repository():
    bad = [str(p.relative_to(ROOT)) for p in TEXT if p.name != "test_docs.py"
           and re.search(r"\bSPEC(\.md)? §|\.\./shared/|/work/shared", p.read_text(errors="ignore"))]
    assert not bad, bad


def test_generated_docs_are_in_sync_with_the_code():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_docs.py"), "--check"], cwd=ROOT)
    assert out.returncode == 0, "run: python scripts/update_docs.py"


def test_benchmarks_write_outside_the_checkout_unless_asked():
    """No benchmark script writes into benchmarks/results (tracked) by default: each asks bench_out.result_path,
    whose default folder lies outside the repository."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_out", ROOT / "benchmarks" / "bench_out.py")
    bench_out = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_out)
    assert ROOT.resolve() not in bench_out.result_path("x.json").resolve().parents
    assert bench_out.result_path("x.json", ROOT / "benchmarks" / "results") == ROOT / "benchmarks" / "results" / "x.json"
    for script in sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "bench_out.py"):
        text = script.read_text()
        assert '/ "results"' not in text and "RESULTS" not in text, f"{script.name} writes into the checkout"
