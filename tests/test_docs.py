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


README_MAX_LINES = 400
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not '-' or '_'), spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    """Every relative link target of a markdown page, outside code."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_readme_reads_in_ten_minutes():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_slug_is_githubs():
    assert slug("The paper's claims, measured") == "the-papers-claims-measured"
    assert slug("`--dtype` and `--weights`") == "--dtype-and---weights"
    assert slug("prune_heal.py — prune + LoRA heal") == "prune_healpy--prune--lora-heal"


def test_the_readme_keeps_its_two_set_up_commands_and_the_newcomer_check_reads_every_page():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/install.sh && depthlab demo" in readme
    assert "bash scripts/install.sh --dev && python3 -m pytest -q" in readme
    import importlib.util

    spec = importlib.util.spec_from_file_location("newcomer_check", ROOT / "scripts" / "newcomer_check.py")
    check = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(check)
    steps = check.all_steps()
    assert {p.name for p in check.PAGES} == {p.name for p in PAGES}
    assert {"README.md", "docs/pruning.md", "docs/vit.md"} <= {s.page for s in steps if s.run}
    assert all(s.run or s.why for s in steps), [s.where for s in steps if not (s.run or s.why)]
    ran = [s.shown for s in steps if s.run]
    assert len(set(ran)) == len(ran), "a command shown on two pages runs twice"
