"""Content hashes for files and model directories."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(root: Path) -> list[Path]:
    """Every regular file below ``root``, sorted, as paths relative to it."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def directory_hash(root: Path, files: list[Path] | None = None) -> str:
    """One hash over the names and contents of ``files`` (default: all files below ``root``)."""
    digest = hashlib.sha256()
    for rel in files if files is not None else list_files(root):
        digest.update(rel.as_posix().encode())
        digest.update(b"\0")
        digest.update(sha256_file(root / rel).encode())
        digest.update(b"\n")
    return digest.hexdigest()
