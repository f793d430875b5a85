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
