"""Which texts run together: length-sorted batches cut where padding would cost more than another run.

A batch pads every row to its longest, and the engine computes the padding like real tokens. Cutting a sorted list
into fixed runs of ``batch_size`` (sentence-transformers' way) pads a small or widely spread set heavily: 64 mixed
texts of 10-200 tokens in two batches of 32 compute 1.42x their real tokens. Here the sorted list is cut where it
costs least overall, counting a run as its padded tokens plus ``RUN_TOKENS`` for what a run costs beyond its
tokens. On a 2-core AVX2 EPYC (onnx-fp32, ``python -m kiln export``): all-MiniLM-L6-v2 took 4.3 ms for one row of 8
tokens and 0.15 ms a token in batches of 8 x 32, so a run costs ~20-30 tokens' worth; arctic-embed-m-v2.0's shape,
2 ms a token, a run costs less than 3. 32 is the larger, so the plan errs towards fewer, fuller batches.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.runtime.tokenization import padded_width

RUN_TOKENS = 32


def length_batches(lengths: Sequence[int], batch_size: int, multiple: int = 1) -> list[list[int]]:
    """Indices into ``lengths``, shortest first, in batches of at most ``batch_size`` that minimise the padded
    tokens computed (each row padded to its batch's longest, rounded up to ``multiple``) plus ``RUN_TOKENS`` a
    batch. Ties keep the input order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    widths = [padded_width(lengths[i], multiple) for i in order]
    # cost[j]: the least cost of the first j sorted texts; cut[j]: where their last batch starts
    cost = [0] * (len(order) + 1)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        width = widths[end - 1]  # sorted: a batch ending here is as wide as its last text
        best, start_best = None, end - 1
        for start in range(max(0, end - batch_size), end):
            total = cost[start] + (end - start) * width + RUN_TOKENS
            if best is None or total < best:
                best, start_best = total, start
        cost[end], cut[end] = best, start_best
    batches: list[list[int]] = []
    end = len(order)
    while end:
        batches.append(order[cut[end] : end])
        end = cut[end]
    return batches[::-1]


def input_batches(count: int, batch_size: int) -> list[list[int]]:
    """Indices ``0..count-1`` in input order, in runs of ``batch_size`` (unsorted batching)."""
    return [list(range(b, min(b + batch_size, count))) for b in range(0, count, batch_size)]


def padding_efficiency(lengths: Sequence[int], batch_size: int, sort: bool, multiple: int = 1) -> float:
    """Real tokens over computed tokens when ``lengths`` run as the predictor batches them: the length plan, or
    (``sort=False``) input order in runs of ``batch_size``."""
    batches = length_batches(lengths, batch_size, multiple) if sort else input_batches(len(lengths), batch_size)
    computed = sum(padded_width(max(lengths[i] for i in batch), multiple) * len(batch) for batch in batches)
    return sum(lengths) / computed if computed else 1.0
