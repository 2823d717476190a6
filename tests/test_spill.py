"""kiln.validation.spill: big runs wait on disk and come back row by row, bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kiln.validation.figures import Run
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
