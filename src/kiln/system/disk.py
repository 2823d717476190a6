"""What a failure looked like from the disk: native libraries report a full disk in their own words (OpenVINO's
``save_model`` raised "basic_ios::clear: iostream error" when a 1.2 GB IR met a full disk), so kiln names the cause
it can measure beside their message."""

from __future__ import annotations

import shutil
from pathlib import Path

LOW_FREE_BYTES = 512 * 1024**2  # below this, a failed write most likely ran out of space


def low_space_note(path: Path, below: int = LOW_FREE_BYTES) -> str:
    """A clause naming the free space on ``path``'s disk when it is under ``below`` bytes, else ""."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return ""
    if free >= below:
        return ""
    return (f" (the disk holding {path} had {free / 1024**2:.0f} MiB free when it failed: a write most likely ran "
            "out of space; free some, or give -o a directory on a larger disk)")
