"""Which texts run together (kiln.runtime.batch_plan), and the padding a batching costs."""

from __future__ import annotations

import itertools
import random

import pytest

from kiln.runtime.batch_plan import RUN_TOKENS, input_batches, length_batches, padding_efficiency


def _cost(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) + RUN_TOKENS for b in batches)


def test_padding_efficiency():
    assert padding_efficiency([10, 10, 10, 10], 2, sort=True) == 1.0
    assert padding_efficiency([10, 30, 10, 30], 2, sort=False) == pytest.approx(80 / 120)
    assert padding_efficiency([10, 30, 10, 30], 2, sort=True) == 1.0
    assert padding_efficiency([10], 1, sort=True, multiple=16) == pytest.approx(10 / 16)


def test_every_text_runs_once_shortest_first_within_the_batch_size():
    rng = random.Random(3)
    lengths = [rng.randint(5, 200) for _ in range(300)]
    batches = length_batches(lengths, 32)
    assert sorted(itertools.chain(*batches)) == list(range(300))
    assert all(1 <= len(b) <= 32 for b in batches)
    flat = [lengths[i] for i in itertools.chain(*batches)]
    assert flat == sorted(flat)
    assert input_batches(5, 2) == [[0, 1], [2, 3], [4]]


def test_like_lengths_fill_whole_batches():
    assert sorted(len(b) for b in length_batches([64] * 100, 32)) == [4, 32, 32, 32]


def test_a_spread_set_is_cut_where_padding_would_cost_more_than_a_run():
    # 4 short and 4 long texts: one batch of 8 computes 8 x 200 tokens, two batches 4 x 10 + 4 x 200
    assert length_batches([200, 10, 200, 10, 10, 200, 10, 200], 8) == [[1, 3, 4, 6], [0, 2, 5, 7]]


def test_the_plan_costs_no_more_than_fixed_sorted_runs_and_is_least_on_small_sets():
    rng = random.Random(7)
    for _ in range(50):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 9))]
        size = rng.randint(1, 4)
        plan = _cost(lengths, length_batches(lengths, size))
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        fixed = [order[i : i + size] for i in range(0, len(order), size)]
        assert plan <= _cost(lengths, fixed)
        # every way to cut the sorted list into runs of at most ``size``
        least = min(_cost(lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))])
                    for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k)
                    if all(b - a <= size for a, b in zip((0, *cuts), (*cuts, len(order)))))
        assert plan == least


def test_an_engine_whose_runs_are_dear_keeps_the_fewest_batches():
    """A teacher-forced decoder steps once per position in each run: the plan keeps ceil(n / batch_size) batches,
    still cut where they pad least."""
    from kiln.decoder.teacher import TeacherForced

    spread = [200, 10, 200, 10, 10, 200, 10, 200]
    assert length_batches(spread, 8, run_tokens=TeacherForced.run_tokens) == [[1, 3, 4, 6, 0, 2, 5, 7]]
    rng = random.Random(5)
    lengths = [rng.randint(5, 200) for _ in range(100)]
    dear = length_batches(lengths, 32, run_tokens=TeacherForced.run_tokens)
    assert len(dear) == 4 and len(length_batches(lengths, 32)) > 4
    order = sorted(range(100), key=lambda i: lengths[i])
    assert _cost(lengths, dear) <= _cost(lengths, [order[i : i + 32] for i in range(0, 100, 32)])  # pads no more
