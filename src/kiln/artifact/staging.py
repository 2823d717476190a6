"""Atomic directory writes: build in a hidden sibling, rename into place only when complete."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
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
    target = check_target(target, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target)
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


def check_target(target: Path, *, overwrite: bool) -> Path:
    """``target`` resolved, or ArtifactError when it may not be written: it exists and ``overwrite`` is off, or it
    is a file. Commands call it before their heavy imports too, so a wrong -o is refused in a second, not after
    torch has loaded."""
    target = target.expanduser().resolve()
    if target.exists() and not overwrite:
        raise ArtifactError(f"{target} already exists; pass --force to replace it")
    if target.exists() and not target.is_dir():
        raise ArtifactError(f"{target} exists and is a file; choose a directory path for -o")
    return target


def _host() -> str:
    """This machine's name as a staging directory carries it: letters, digits and dashes, at most 32."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def _unused_name(target: Path) -> Path:
    """``.<name>.<host>-<pid>-<random>.partial`` beside ``target``, not yet taken (64 random bits: no other writer
    picks it). The host and process say whose it is, so a later run can tell one a killed run abandoned."""
    while True:
        staging = target.parent / f".{target.name}.{_host()}-{os.getpid()}-{secrets.token_hex(8)}.partial"
        if not staging.exists():
            return staging


def remove_abandoned(target: Path) -> list[Path]:
    """Remove the staging directories of ``target`` that a killed run left (SIGKILL, the OOM killer, a lost
    machine: no handler ran), and return them: those named for this host whose process is gone. A live writer's,
    another host's (a shared filesystem) and one whose name carries no owner are left alone."""
    owned = re.compile(rf"^\.{re.escape(target.name)}\.{re.escape(_host())}-(\d+)-[0-9a-f]{{16}}\.partial$")
    removed = []
    for found in target.parent.glob(f".{_glob_escape(target.name)}.*.partial"):
        match = owned.match(found.name)
        if match and found.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(found, ignore_errors=True)
            removed.append(found)
    return removed


def _glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


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
