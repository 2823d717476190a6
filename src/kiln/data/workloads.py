"""The text sets kiln's benchmarks time, each named once so that every script times the same texts.

Both are mixes of lengths uniform in 10-200 tokens (``texts.length_mix``), cut to the tokenizer given:
  * ``held_out_mix``: from the held-out sentences, which no calibration set is cut from: the peers' table
    (benchmarks/peers.py), the offline experiments and the GPU check;
  * ``serving_mix``: from the built-in sentences: the load benchmarks (serve_load.py, triton_load.py, shadow_cost.py)
    and the serving experiments.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.data import corpus
from kiln.data.texts import length_mix

LOW, HIGH = 10, 200  # tokens, special tokens included


def held_out_mix(count: int, token_count: Callable[[str], int]) -> list[str]:
    """``count`` held-out texts of 10-200 tokens (seed 13): the offline and peer benchmarks' set."""
    return length_mix(count, LOW, HIGH, seed=13, token_count=token_count, source=corpus.sentences("held-out"))


def serving_mix(count: int, token_count: Callable[[str], int]) -> list[str]:
    """``count`` texts of 10-200 tokens from the built-in sentences (seed 11): the load benchmarks' set."""
    return length_mix(count, LOW, HIGH, seed=11, token_count=token_count)
