"""kiln bench's arithmetic: the padding a batching costs."""

from __future__ import annotations

import pytest

from kiln.runtime.timing import padding_efficiency


def test_padding_efficiency():
    assert padding_efficiency([10, 10, 10, 10], 2, sort=True) == 1.0
    assert padding_efficiency([10, 30, 10, 30], 2, sort=False) == pytest.approx(80 / 120)
    assert padding_efficiency([10, 30, 10, 30], 2, sort=True) == 1.0
    assert padding_efficiency([10], 1, sort=True, multiple=16) == pytest.approx(10 / 16)
