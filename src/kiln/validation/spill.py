"""Big runs held on disk while validation goes on: a decoder's logits, one row at a time when read.

A decoder's agreement run is logits of every position over the vocabulary: 0.46-0.49 GB on GPT-2 small's 32
agreement texts. kiln optimize keeps the original's run for the whole build and a variant's sorted run until its
alone run exists, so two such runs sat under every engine's own memory. Written to an unlinked temporary file and
read back row by row (``os.pread``, no mapping: the page cache is the kernel's, not the process's resident memory),
they cost one row at a time. Encoders' runs (a few MB) stay in memory: below ``SPILL_BYTES`` nothing is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, overload

import numpy as np

from kiln.validation.figures import Run

SPILL_BYTES = 64 * 2**20


class DiskRows(Sequence[np.ndarray]):
    """Arrays written once to a temporary file, each read back (read-only) when indexed."""

    def __init__(self, rows: Iterable[np.ndarray]) -> None:
        self._file = tempfile.TemporaryFile(prefix="kiln-rows-")  # unlinked: gone when closed or collected
        self._index: list[tuple[int, np.dtype, tuple[int, ...]]] = []
        offset = 0
        for row in rows:
            array = np.ascontiguousarray(row)
            self._file.write(memoryview(array).cast("B"))
            self._index.append((offset, array.dtype, array.shape))
            offset += array.nbytes
        self._file.flush()

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        offset, dtype, shape = self._index[i]
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        data = os.pread(self._file.fileno(), size, offset)
        if len(data) != size:  # the file is the run: a short read is a lost output, never a shorter row
            raise OSError(f"row {i}: read {len(data)} of {size} bytes from the spilled run")
        return np.frombuffer(data, dtype).reshape(shape)


def _nbytes(values: Sequence[Any]) -> int:
    return sum(v.nbytes for v in values) if all(isinstance(v, np.ndarray) for v in values) else 0


def spilled(run: Run, threshold: int = SPILL_BYTES) -> Run:
    """``run`` with its reduced outputs on disk when they are arrays of ``threshold`` bytes or more; its results go
    with them where they are the same arrays (a decoder's logits are both)."""
    if isinstance(run.reduced, DiskRows) or _nbytes(run.reduced) < threshold:
        return run
    rows = DiskRows(run.reduced)
    same = len(run.results) == len(run.reduced) and all(r is s for r, s in zip(run.results, run.reduced))
    return Run(rows, rows if same else run.results)
