"""Atomic directory writes: build in a hidden sibling, rename into place only when complete."""

from __future__ import annotations

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
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        yield staging
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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
