"""Atomic directory writes: build in a hidden sibling, rename into place only when complete."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import ArtifactError


@contextmanager
def staged_directory(target: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``target``, on any error it is removed.

    The staging directory sits beside the target (same filesystem, so the final rename is atomic) and
    is named ``.<name>.*.partial`` so a crash never leaves something at ``target`` that later loads.
    """
    target = target.expanduser().resolve()
    if target.exists() and not overwrite:
        raise ArtifactError(f"{target} already exists; pass --force to replace it")
    if target.exists() and not target.is_dir():
        raise ArtifactError(f"{target} exists and is a file; choose a directory path for -o")
    target.parent.mkdir(parents=True, exist_ok=True)
    # The name is chosen before the directory exists and the directory is made inside the try: a signal turned
    # into an exception (SIGTERM, Ctrl-C) between mkdtemp's mkdir and the try left the .partial behind (seen in
    # tests/e2e/test_cli.py's terminated export on a loaded machine).
    staging = _unused_name(target)
    try:
        staging.mkdir(mode=0o700)
        yield staging
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _unused_name(target: Path) -> Path:
    """``.<name>.<random>.partial`` beside ``target``, not yet taken (64 random bits: no other writer picks it)."""
    while True:
        staging = target.parent / f".{target.name}.{secrets.token_hex(8)}.partial"
        if not staging.exists():
            return staging


def _swap_into_place(staging: Path, target: Path) -> None:
    if not target.exists():
        staging.rename(target)
        return
    # Move the old artifact aside first so the new one lands in one rename; the old one is deleted last.
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    retired.rmdir()
    target.rename(retired)
    staging.rename(target)
    shutil.rmtree(retired, ignore_errors=True)
