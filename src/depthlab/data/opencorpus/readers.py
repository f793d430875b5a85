"""Readers for the formats the corpus's packages ship, each turning files into plain text.

    dictd_entries(dict_dz, index)   dictd databases (dict-gcide, dict-jargon, ...): one text per entry
    sword_entries(module_dir)       SWORD zText/zCom modules (sword-comm-*): one text per entry, OSIS stripped
    rdata_strings(rdb)              character vectors of an R lazy-load database (r-cran-janeaustenr)
    html_to_text(html)              an HTML page's readable text (navigation, scripts, SVG dropped)
    clean_text(text)                the normalisation every document gets (NFC, newlines, spaces)

Only the standard library: these run on the build machine, not in training.
"""

from __future__ import annotations

import gzip
import html
import re
import struct
import unicodedata
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from depthlab.base.errors import DepthlabError

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")


def clean_text(text: str, dedent: bool = False) -> str:
    """NFC, ``\\n`` newlines, no control characters, tabs as spaces, no trailing spaces, at most
    one blank line in a row; ``dedent`` also strips each line's indentation."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text).replace("\t", "    ")
    lines = [ln.strip() if dedent else ln.rstrip() for ln in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def english_enough(text: str, min_ascii: float = 0.9) -> bool:
    """At least ``min_ascii`` of the non-space characters are ASCII (drops translations, e.g. the
    zh_CN/ja_JP trees of the kernel docs, while curly quotes and dashes pass)."""
    chars = [c for c in text if not c.isspace()]
    return bool(chars) and sum(c < "\x80" for c in chars) >= min_ascii * len(chars)


# ---------------------------------------------------------------------- dictd
def _b64(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def dictd_entries(dict_dz: Path, index: Path) -> Iterator[tuple[str, str]]:
    """(headword, text) of each entry of a dictd database, in file order; the ``00-database-*``
    header entries are skipped and entries several headwords share come once."""
    data = gzip.open(dict_dz).read()  # dictzip is gzip
    spans: dict[tuple[int, int], str] = {}
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith(("00-database", "00database")):
            continue
        span = (_b64(parts[1]), _b64(parts[2]))
        spans.setdefault(span, parts[0])
    for (off, size), word in sorted(spans.items()):
        yield word, data[off:off + size].decode("utf-8", errors="replace")


_GCIDE_TAG = re.compile(r"^\s*\[(?:\d{4} Webster|Webster \d{4}|WordNet|PJC|Century|Chambers|Jargon|RHUD|DOE|JS|MW)"
                        r"[^\]\n]{0,40}\]\s*$", re.M)
_GCIDE_PRON = re.compile(r"[ \t]*\\[^\\\n]{1,80}\\"  # \Ap"ple\, then a respelling such as (k??r"t?-p?), not (Zool.)
                         r"(?:[ \t]*\((?=[^()\n]*[?\"`'\[\-])[^()\n]{1,60}\))?")
_GCIDE_LETTER = re.compile(r"\[\*?([A-Za-z])[\^=~:.`'\"\-,]?\]")


def gcide_text(entry: str) -> str:
    """A GCIDE entry without its source tags (``[1913 Webster]``), pronunciation (``\\Ap"ple\\`` and
    the respelling in parentheses after it) and ASCII accent codes (``[ae]`` -> æ, ``[a^]`` -> a)."""
    entry = _GCIDE_TAG.sub("", entry)
    entry = _GCIDE_PRON.sub("", entry)
    for code, ch in (("[ae]", "æ"), ("[AE]", "Æ"), ("[oe]", "œ"), ("[OE]", "Œ")):
        entry = entry.replace(code, ch)
    return _GCIDE_LETTER.sub(r"\1", entry)


def link_braces(text: str) -> str:
    """``{word}`` cross-reference markup of FOLDOC/Jargon/GCIDE -> ``word``."""
    return re.sub(r"\{([^{}\n]{1,80})\}", r"\1", text)


def pages(entries: Iterator[tuple[str, str]], chars: int = 8000) -> Iterator[tuple[str, str]]:
    """Consecutive entries grouped into pages of about ``chars`` characters: (first headword, text)."""
    buf, size, first = [], 0, None
    for word, text in entries:
        if not text.strip():
            continue
        first = first if buf else word
        buf.append(text.strip())
        size += len(text)
        if size >= chars:
            yield first, "\n\n".join(buf)
            buf, size = [], 0
    if buf:
        yield first, "\n\n".join(buf)


# ---------------------------------------------------------------------- SWORD
def _sword_rows(vindex: bytes, blocks: list[tuple[int, int, int]]) -> list[tuple[int, int, int]] | None:
    """Entries (block, offset, size) of a verse index; the entry width (10 bytes for zText/zCom,
    12 for the *4 drivers) is whichever one makes every entry fit its block."""
    for width, fmt in ((10, "<IIH"), (12, "<III")):
        if len(vindex) % width:
            continue
        rows = [struct.unpack_from(fmt, vindex, i) for i in range(0, len(vindex), width)]
        if all(s == 0 or (b < len(blocks) and o + s <= blocks[b][2]) for b, o, s in rows):
            return rows
    return None


def sword_entries(module_dir: Path) -> Iterator[str]:
    """Raw (OSIS) text of each entry of a compressed SWORD Bible text or commentary, in canonical
    order (Old Testament, then New); entries that link to an earlier one come once."""
    for testament in ("ot", "nt"):
        stem = next((module_dir / f"{testament}.{p}z" for p in "bc" if (module_dir / f"{testament}.{p}zs").is_file()), None)
        if stem is None:
            continue
        bzs = Path(f"{stem}s").read_bytes()
        bzz = Path(f"{stem}z").read_bytes()
        blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs) - len(bzs) % 12, 12)]
        rows = _sword_rows(Path(f"{stem}v").read_bytes(), blocks)
        if rows is None:
            raise DepthlabError(f"{module_dir}: unreadable SWORD verse index {stem.name}v")
        cache: dict[int, bytes] = {}
        seen = set()
        for b, o, s in rows:
            if s == 0 or (b, o, s) in seen:
                continue
            seen.add((b, o, s))
            if b not in cache:
                off, size, _ = blocks[b]
                cache = {b: zlib.decompress(bzz[off:off + size])}  # blocks come in order: keep one
            yield cache[b][o:o + s].decode("utf-8", errors="replace")


_OSIS_BREAK = re.compile(r"<(?:lb|l|p|div|title|chapter|lg)\b[^>]*>|</(?:title|p|l|lg)>")


def osis_text(osis: str) -> str:
    """Plain text of an OSIS fragment: paragraph/line/title tags -> line breaks, notes dropped."""
    osis = re.sub(r"<note\b[^>]*>.*?</note>", "", osis, flags=re.S)
    osis = _OSIS_BREAK.sub("\n", osis)
    return html.unescape(re.sub(r"<[^>]+>", "", osis))


# ---------------------------------------------------------------------- R lazy-load data
def _r_strings(blob: bytes) -> list[str] | None:
    """The strings of a serialized R character vector (XDR format 2 or 3), else None."""
    if blob[:2] != b"X\n":
        return None
    version, q = struct.unpack_from(">i", blob, 2)[0], 14
    if version == 3:  # native encoding name follows the header
        q += 4 + struct.unpack_from(">i", blob, q)[0]
    if struct.unpack_from(">i", blob, q)[0] & 0xFF != 16:  # STRSXP
        return None
    (n,), q = struct.unpack_from(">i", blob, q + 4), q + 8
    out = []
    for _ in range(n):
        _, size = struct.unpack_from(">ii", blob, q)
        q += 8
        if size >= 0:
            out.append(blob[q:q + size].decode("utf-8", errors="replace"))
            q += size
        else:
            out.append("")  # NA
    return out


def rdata_strings(rdb: Path) -> Iterator[list[str]]:
    """Every character vector stored in an R lazy-load database (``data/Rdata.rdb``): the file is a
    run of (4-byte length, zlib stream) records, each a serialized R object."""
    data, pos = rdb.read_bytes(), 0
    while pos + 4 < len(data):
        z = zlib.decompressobj()
        try:
            blob = z.decompress(data[pos + 4:])
        except zlib.error:
            raise DepthlabError(f"{rdb}: not a zlib-compressed R lazy-load database (at byte {pos})") from None
        pos = len(data) - len(z.unused_data)
        strings = _r_strings(blob)
        if strings is not None:
            yield strings


# ---------------------------------------------------------------------- HTML
class _TextParser(HTMLParser):
    SKIP_TAGS = {"script", "style", "head", "nav", "noscript", "svg", "form", "select"}
    SKIP_CLASSES = {"nosearch", "navheader", "navfooter", "menu", "toc"}
    PARAGRAPH = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "blockquote", "ul", "ol", "dl",
                 "section", "title"}
    LINE = {"br", "li", "tr", "dt", "dd"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip: list[str] = []  # tag being skipped, repeated per nested same-name tag
        self.pre = 0

    def handle_starttag(self, tag, attrs) -> None:
        if self.skip:
            if tag == self.skip[0]:
                self.skip.append(tag)
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag in self.SKIP_TAGS or classes & self.SKIP_CLASSES:
            self.skip.append(tag)
            return
        if tag in self.PARAGRAPH or tag in self.LINE:
            self.out.append("\n\n" if tag in self.PARAGRAPH else "\n")
        self.pre += tag == "pre"

    def handle_endtag(self, tag) -> None:
        if self.skip:
            if tag == self.skip[0]:
                self.skip.pop()
            return
        self.pre -= tag == "pre" and self.pre > 0
        if tag in self.PARAGRAPH:
            self.out.append("\n\n")

    def handle_data(self, data) -> None:
        if not self.skip:
            self.out.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(page: str) -> str:
    """The readable text of an HTML page, paragraphs separated by blank lines."""
    parser = _TextParser()
    parser.feed(page)
    parser.close()
    return "".join(parser.out)
