"""The batcher's scheduling without an engine: how waiting features are partitioned into batches, which group is
due first, and which lengths a shape-caching engine is warmed with."""

from __future__ import annotations

import pytest

from kiln.serving.batcher import BatchLimits, BatchStats, Pace, next_group, partition


def test_partition_cuts_mixed_lengths_into_similar_groups_within_limits():
    lengths = sorted([10, 11, 12, 12, 14, 100, 101, 103, 104, 190, 195, 199])
    limits = BatchLimits(call_overhead_tokens=64)
    groups = partition(lengths, limits)
    assert [lengths[a:b] for a, b in groups] == [[10, 11, 12, 12, 14], [100, 101, 103, 104], [190, 195, 199]]
    assert partition(lengths, BatchLimits(call_overhead_tokens=100_000)) == [(0, 12)]  # calls dear: one batch
    tight = BatchLimits(max_batch_size=2, max_batch_tokens=300, call_overhead_tokens=10_000)
    for a, b in partition(lengths, tight):
        assert b - a <= 2 and (b - a == 1 or lengths[b - 1] * (b - a) <= 300)
    assert partition([512], BatchLimits(max_batch_tokens=100)) == [(0, 1)]  # one input always fits alone


def test_the_next_group_is_the_one_holding_the_feature_due_first():
    widths = [16, 16, 128, 128, 16]  # arrival order
    limits = BatchLimits(call_overhead_tokens=32)
    assert next_group(widths, limits) == [0, 1, 4]  # the oldest's group
    assert next_group(widths, limits, anchor=3) == [2, 3]


def test_a_wide_feature_is_due_before_an_older_narrow_one_by_its_batch_time():
    pace = Pace()
    assert pace.due(1.0, 256) == 1.0  # no batch has run: arrival order
    pace.observe(BatchStats(size=4, tokens=4 * 100, queue_seconds=0.0, inference_seconds=0.04))  # 100 us a token
    assert pace.due(1.0, 100) == pytest.approx(1.0 - 100 * 4 * 1e-4)  # its batch's expected 40 ms earlier
    assert pace.due(1.01, 128) < pace.due(1.0, 16)  # 10 ms younger but 45 ms longer to run: due first
    assert pace.due(1.1, 256) > pace.due(1.0, 16)  # only features that came less than a batch's time later pass
    pace.observe(BatchStats(size=8, tokens=8 * 100, queue_seconds=0.0, inference_seconds=0.04))
    assert pace.size == pytest.approx(4 + Pace.SMOOTHING * 4)  # a moving average, not the last batch


def test_warmup_runs_every_length_bucket_of_a_shape_caching_engine():
    """An engine that pads to buckets (OpenVINO) sees each bucket once before /ready; others warm once."""
    from kiln.engines.base import warm_every_length

    class Recorder:
        input_names = ("input_ids", "attention_mask")
        pad_multiple = 16

        def __init__(self):
            self.shapes = []

        def warmup(self):
            self.shapes.append("warmup")

        def run(self, inputs):
            self.shapes.append(inputs["input_ids"].shape)
            return {}

    engine = Recorder()
    assert warm_every_length(engine, 56) == 5
    assert engine.shapes == ["warmup", (1, 16), (1, 32), (1, 48), (1, 56)]
    engine.pad_multiple, engine.shapes = 1, []
    assert warm_every_length(engine, 56) == 1 and engine.shapes == ["warmup"]
