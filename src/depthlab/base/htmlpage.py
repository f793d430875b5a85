"""Self-contained HTML pages: one stylesheet, PNGs embedded as base64, small table helpers.
Shared by the diagnose and compare reports."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Iterable, Sequence

CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td.k{text-align:left;font-weight:600}
.summary{background:#eef6ee;border-left:4px solid #4a4;padding:.8em 1em;font-size:1.05em}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
code,pre{background:#f6f6f6;padding:.15em .35em;border-radius:3px;font-size:.88em}
pre{padding:.6em;overflow-x:auto;white-space:pre-wrap}.scroll{overflow-x:auto}.muted{color:#777;font-size:.88em}"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def img(path: str | Path | None, alt: str) -> str:
    """An <img> with the PNG at ``path`` embedded; empty when there is no such file."""
    if not path or not Path(path).is_file():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    """Two-column key/value table; rows whose value is None are left out."""
    body = "".join(f'<tr><td class="k">{esc(k)}</td><td style="text-align:left">{esc(v)}</td></tr>'
                   for k, v in rows if v is not None)
    return f"<table>{body}</table>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def page(title: str, body: Iterable[str]) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>" + "".join(body) + "</body></html>\n")
