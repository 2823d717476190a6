"""kiln.validation.spill: big runs wait on disk and come back row by row, bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kiln.records.figures import Run
from kiln.validation.spill import DiskRows, spilled


def _rows() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, 50)).astype(np.float32) for n in (3, 7, 1, 12)]


def test_rows_come_back_bit_for_bit_in_order():
    rows = _rows()
    disk = DiskRows(rows)
    assert len(disk) == 4
    for got, want in zip(disk, rows):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert [r.shape for r in disk[1:3]] == [(7, 50), (1, 50)]
    assert np.array_equal(disk[-1], rows[-1])


def test_a_big_run_is_spilled_with_its_results_and_a_small_one_is_not():
    rows = _rows()
    run = Run(tuple(rows), tuple(rows))  # a decoder's results are its reduced logits
    small = spilled(run)
    assert small is run  # under the threshold nothing is written
    big = spilled(run, threshold=1)
    assert isinstance(big.reduced, DiskRows) and big.results is big.reduced
    assert spilled(big, threshold=1) is big
    other = Run(tuple(rows), ("a", "b", "c", "d"))  # results of their own stay as they are
    assert spilled(other, threshold=1).results == ("a", "b", "c", "d")


def test_a_short_read_is_an_error_not_a_shorter_row():
    """Fault injection: the spill file loses its tail (a full disk, a truncated file)."""
    rows = _rows()
    disk = DiskRows(rows)
    os.ftruncate(disk._file.fileno(), rows[0].nbytes)
    assert np.array_equal(disk[0], rows[0])  # what is left is still read
    with pytest.raises(OSError, match=r"row 3: read 0 of 2400 bytes from the spilled run"):
        disk[3]


def test_rows_written_piece_by_piece_read_back_as_arrays():
    """A decoder's validation engine writes each row's positions as teacher forcing computes them, and hands
    back stand-ins that become arrays where used (np.asarray, slicing): the same values, never the whole batch in
    memory."""
    from kiln.system.disk_rows import DiskRow

    rows = _rows()
    disk = DiskRows.empty([r.shape for r in rows], np.float32)
    for start in range(max(len(r) for r in rows)):  # one position of every row at a time, as the steps go
        for i, row in enumerate(rows):
            if start < len(row):
                disk.write(i, start, row[start : start + 1])
    lazy = disk.lazy()
    assert all(isinstance(r, DiskRow) for r in lazy)
    for got, want in zip(lazy, rows):
        assert got.shape == want.shape and len(got) == len(want) and got.nbytes == want.nbytes
        assert np.array_equal(np.asarray(got), want) and np.array_equal(got[:2], want[:2])
        assert np.asarray(got, np.float64).dtype == np.float64
    run = Run(tuple(lazy), tuple(lazy))
    assert spilled(run, threshold=1) is run  # already on disk: not written again
    with pytest.raises(ValueError, match=r"row 0 of shape \(3, 50\): cannot write \(2, 50\) at 2"):
        disk.write(0, 2, rows[0][:2])  # past the row's end: an error, not another row's bytes


def test_a_short_write_is_an_error_not_a_shorter_row(monkeypatch):
    """Fault injection: the file takes fewer bytes than a step's logits (a full disk); the run stops there."""
    rows = _rows()
    disk = DiskRows.empty([r.shape for r in rows], np.float32)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: len(data) - 4)
    with pytest.raises(OSError, match=r"row 1: short write to the spilled run"):
        disk.write(1, 0, rows[1][:2])


def test_rows_collected_as_batches_come_go_to_disk_once_they_are_big_and_read_back_in_order():
    """A PyTorch decoder's reference run: rows arrive batch by batch in length order; under the threshold they stay
    in memory as they are, past it every row (those held so far and the rest as they come) is on disk, read back in
    the inputs' order."""
    from kiln.validation.spill import collected

    rows = _rows()
    arrival = [2, 0, 3, 1]  # sorted by length, as the predictor's batches come
    small = collected(((i, rows[i]) for i in arrival), len(rows))
    assert isinstance(small, tuple) and all(got is want for got, want in zip(small, rows))
    big = collected(((i, rows[i]) for i in arrival), len(rows), threshold=rows[2].nbytes + rows[0].nbytes)
    assert isinstance(big, DiskRows) and len(big) == 4
    assert all(np.array_equal(got, want) for got, want in zip(big, rows))
    assert collected(iter([(1, "b"), (0, "a")]), 2, threshold=0) == ("a", "b")  # not arrays: kept as they are
    with pytest.raises(ValueError, match="order must name every row once"):
        big.reorder([0, 0, 1, 2])
    big.append(rows[1])  # after a reorder a new row still goes past every other one
    assert all(np.array_equal(got, want) for got, want in zip(big, [*rows, rows[1]]))
