"""Which inputs run together: sorted by length, cut into the contiguous groups of least total cost.

A batch pads every row to its longest, and the engine computes the padding like real tokens; a run also costs
something beyond its tokens. So a group costs ``run_tokens`` + its widest x its count, and a length-sorted list is
cut where the sum over groups is least (dynamic programming over the cut points), within a count and a token cap.
On a CPU the per-token cost barely falls past batch ~8, so one wide batch of mixed lengths (much of it padding) is
slower than several batches of like lengths. The server's batcher cuts its look-ahead window so
(kiln.serving.batcher), and ``predict`` / ``encode`` and the gate's sorted batching cut their inputs so, with
``batch_size`` the most a batch holds. Cutting every ``batch_size`` inputs instead (sentence-transformers' way)
computes 1.42 tokens per real one on 64 texts of 10-200 tokens in batches of 32 (``kiln.data.workloads.held_out_mix``,
arctic-embed-m-v2.0's test tokenizer); this plan 1.06.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.runtime.tokenization import padded_width

# A run's fixed cost, in padded tokens (measured: 30-90 on CPU; OpenVINO int8 MiniLM on single-thread streams ~16;
# onnx-fp32 on a 2-core AVX2 EPYC: MiniLM 4.3 ms for one row of 8 tokens and 0.15 ms a token in batches of 8 x 32,
# ~20-30 tokens, arctic-embed-m-v2.0's shape under 3). Shape changes between calls cost besides
# (benchmarks/experiments/engine_shapes at 91ffdaf, 2-core EPYC): one session cycling widths +-16 ran 1.9-2.7% slower
# than on one shape, batch sizes 7-9 0.5-2.1%; two sessions on shuffled shapes 2.3% slower than on grouped ones.
RUN_TOKENS = 64


def least_cost_groups(widths: Sequence[int], max_count: int, *, run_tokens: int = RUN_TOKENS,
                      max_tokens: int | None = None) -> list[tuple[int, int]]:
    """Cut ascending ``widths`` into contiguous [start, end) groups of at most ``max_count`` that minimise the sum of
    ``run_tokens`` + widest x count; a group's padded tokens stay within ``max_tokens`` unless it is one input."""
    n = len(widths)
    best = [0.0] + [float("inf")] * n  # best[j]: least cost of the first j inputs
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        widest = widths[j - 1]
        for i in range(j - 1, max(0, j - max_count) - 1, -1):
            padded = widest * (j - i)
            if max_tokens is not None and padded > max_tokens and i < j - 1:
                break  # a single input always fits (the tokenizer truncated it to the model's maximum)
            cost = best[i] + run_tokens + padded
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups = []
    j = n
    while j > 0:
        groups.append((cut[j], j))
        j = cut[j]
    return groups[::-1]


def length_batches(lengths: Sequence[int], batch_size: int, multiple: int = 1,
                   run_tokens: int = RUN_TOKENS) -> list[list[int]]:
    """Indices into ``lengths``, shortest first, in the least-cost groups of at most ``batch_size`` (widths padded
    to ``multiple`` as collation pads them; ``run_tokens``: the engine's cost of a run). Equal lengths keep their
    input order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    widths = [padded_width(lengths[i], multiple) for i in order]
    return [order[start:end] for start, end in least_cost_groups(widths, batch_size, run_tokens=run_tokens)]


def input_batches(count: int, batch_size: int) -> list[list[int]]:
    """Indices ``0..count-1`` in input order, in runs of ``batch_size`` (unsorted batching)."""
    return [list(range(b, min(b + batch_size, count))) for b in range(0, count, batch_size)]


def padding_efficiency(lengths: Sequence[int], batch_size: int, sort: bool, multiple: int = 1,
                       run_tokens: int = RUN_TOKENS) -> float:
    """Real tokens over computed tokens when ``lengths`` run as the predictor batches them: the length plan, or
    (``sort=False``) input order in runs of ``batch_size``."""
    batches = (length_batches(lengths, batch_size, multiple, run_tokens) if sort
               else input_batches(len(lengths), batch_size))
    computed = sum(padded_width(max(lengths[i] for i in batch), multiple) * len(batch) for batch in batches)
    return sum(lengths) / computed if computed else 1.0
