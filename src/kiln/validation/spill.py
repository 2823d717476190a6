"""Big runs held on disk while validation goes on: a decoder's logits, one row at a time when read.

A decoder's agreement run is logits of every position over the vocabulary: 0.46-0.49 GB on GPT-2 small's 32
agreement texts. kiln optimize keeps the original's run for the whole build and a variant's sorted run until its
alone run exists, so two such runs sat under every engine's own memory. Written to an unlinked temporary file and
read back row by row (kiln.system.disk_rows), they cost one row at a time; a decoder's validation engines write
their rows there as they compute them (kiln.decoder.teacher). Encoders' runs (a few MB) stay in memory: below
``SPILL_BYTES`` nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kiln.records.figures import Run
from kiln.system.disk_rows import DiskRows

__all__ = ["SPILL_BYTES", "DiskRows", "collected", "spilled"]

SPILL_BYTES = 64 * 2**20


def _nbytes(values: Sequence[Any]) -> int:
    return sum(v.nbytes for v in values) if all(isinstance(v, np.ndarray) for v in values) else 0


def spilled(run: Run, threshold: int = SPILL_BYTES) -> Run:
    """``run`` with its reduced outputs on disk when they are arrays of ``threshold`` bytes or more; its results go
    with them where they are the same arrays (a decoder's logits are both)."""
    # Already on disk as a whole; rows a decoder's validation engine wrote there as it computed them (DiskRow
    # stand-ins, not arrays) count as nothing to spill in _nbytes.
    if isinstance(run.reduced, DiskRows) or _nbytes(run.reduced) < threshold:
        return run
    rows = DiskRows(run.reduced)
    same = len(run.results) == len(run.reduced) and all(r is s for r, s in zip(run.results, run.reduced))
    return Run(rows, rows if same else run.results)


def collected(pairs: Iterable[tuple[int, Any]], count: int, threshold: int = SPILL_BYTES) -> Sequence[Any]:
    """Values by index from ``(index, value)`` pairs as a predictor makes them, batch by batch: held in memory, or,
    once the arrays among them pass ``threshold`` bytes, on disk as they come (as stand-ins that read their row when
    used). The PyTorch reference of Qwen3-0.6B's shape held its 32 agreement texts' logits, 1.4 GB over a
    151,936-token vocabulary, until the last batch was done (`python benchmarks/optimize_profile.py --model
    qwen3-0.6b`)."""
    held: dict[int, Any] = {}
    disk: DiskRows | None = None
    where: dict[int, int] = {}
    size = 0
    for i, value in pairs:
        if disk is None:
            held[i] = value
            size += value.nbytes if isinstance(value, np.ndarray) else 0
            if size >= threshold and all(isinstance(v, np.ndarray) for v in held.values()):
                disk = DiskRows()
                for k, v in held.items():
                    where[k] = len(disk)
                    disk.append(v)
                held.clear()
        else:
            where[i] = len(disk)
            disk.append(value)
    if disk is None:
        return tuple(held[i] for i in range(count))
    disk.reorder([where[i] for i in range(count)])
    return disk
