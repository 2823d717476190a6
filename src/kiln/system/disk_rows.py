"""Arrays held in an unlinked temporary file and read back one at a time: a decoder's logits.

A decoder's teacher-forced logits are every position over the vocabulary: 0.46 GB on GPT-2 small's 32 agreement
texts. Read back with ``os.pread`` (no mapping: the page cache is the kernel's, not the process's resident memory),
they cost one row at a time. Written whole (``DiskRows(rows)``) or piece by piece as they are computed
(``DiskRows.empty`` and ``write``: teacher forcing yields one position of every row at a time, so the rows of a
batch never need to be in memory together).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, overload

import numpy as np


def _size(shape: Sequence[int], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


class DiskRows(Sequence[np.ndarray]):
    """Arrays in a temporary file, each read back (read-only) when indexed."""

    def __init__(self, rows: Iterable[np.ndarray] = ()) -> None:
        self._file = tempfile.TemporaryFile(prefix="kiln-rows-")  # unlinked: gone when closed or collected
        self._index: list[tuple[int, np.dtype, tuple[int, ...]]] = []
        offset = 0
        for row in rows:
            array = np.ascontiguousarray(row)
            self._file.write(memoryview(array).cast("B"))
            self._index.append((offset, array.dtype, array.shape))
            offset += array.nbytes
        self._file.flush()
        self._end = offset  # where the next appended row goes (rows may be reordered; the file only grows)

    @classmethod
    def empty(cls, shapes: Sequence[tuple[int, ...]], dtype: Any) -> DiskRows:
        """Room for rows of ``shapes``, to be filled by ``write`` (a row never written reads back as zeros)."""
        rows, kind, offset = cls(), np.dtype(dtype), 0
        for shape in shapes:
            rows._index.append((offset, kind, tuple(shape)))
            offset += _size(shape, kind)
        rows._file.truncate(offset)
        rows._end = offset
        return rows

    def append(self, row: np.ndarray) -> None:
        """``row`` as the next row, at the file's end."""
        array = np.ascontiguousarray(row)
        data = memoryview(array).cast("B")
        if os.pwrite(self._file.fileno(), data, self._end) != len(data):
            raise OSError(f"row {len(self._index)}: short write to the spilled run")
        self._index.append((self._end, array.dtype, array.shape))
        self._end += array.nbytes

    def reorder(self, order: Sequence[int]) -> None:
        """Row ``k`` becomes what row ``order[k]`` was (rows written as they came, read back in another order)."""
        if sorted(order) != list(range(len(self._index))):
            raise ValueError("order must name every row once")
        self._index = [self._index[k] for k in order]

    def write(self, i: int, start: int, values: np.ndarray) -> None:
        """``values`` as row ``i``'s entries from ``start`` on along its first axis."""
        offset, dtype, shape = self._index[i]
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.shape[1:] != shape[1:] or not 0 <= start <= start + len(array) <= shape[0]:
            raise ValueError(f"row {i} of shape {shape}: cannot write {array.shape} at {start}")
        stride = _size(shape[1:], dtype)
        data = memoryview(array).cast("B")
        if os.pwrite(self._file.fileno(), data, offset + start * stride) != len(data):
            raise OSError(f"row {i}: short write to the spilled run")

    def lazy(self) -> list[DiskRow]:
        """One stand-in per row, read from the file where it is used as an array (``np.asarray``)."""
        return [DiskRow(self, i) for i in range(len(self))]

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
        size = _size(shape, dtype)
        data = os.pread(self._file.fileno(), size, offset)
        if len(data) != size:  # the file is the run: a short read is a lost output, never a shorter row
            raise OSError(f"row {i}: read {len(data)} of {size} bytes from the spilled run")
        return np.frombuffer(data, dtype).reshape(shape)

    def layout(self, i: int) -> tuple[np.dtype, tuple[int, ...]]:
        """Row ``i``'s dtype and shape, without reading it."""
        return self._index[i][1:]


class DiskRow:
    """Row ``i`` of a DiskRows, read when used as an array; its shape and size without reading it."""

    __slots__ = ("_rows", "_i")

    def __init__(self, rows: DiskRows, i: int) -> None:
        self._rows, self._i = rows, i

    @property
    def shape(self) -> tuple[int, ...]:
        return self._rows.layout(self._i)[1]

    @property
    def dtype(self) -> np.dtype:
        return self._rows.layout(self._i)[0]

    @property
    def nbytes(self) -> int:
        return _size(self.shape, self.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        return self._rows[self._i][key]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._rows[self._i]
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array
