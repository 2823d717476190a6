"""A decoder's latency, as the published ONNX Runtime GPT-2 study measured it: time to first token and per-token
latency for a fixed number of new tokens, per batch size x prompt length.

The prompts are real text cut to exactly the prompt length. Generation is greedy and ignores EOS, so every row makes
exactly ``new_tokens`` tokens and every run does the same work; the loop is kiln's own (``DecodeBatch`` on the
engine's stepper: IOBinding on ONNX Runtime), so what is timed is what ``kiln serve`` and ``generate()`` run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.decoder.batch import DecodeBatch, new_sequence
from kiln.decoder.generate import stream
from kiln.decoder.sampling import Sampling
from kiln.decoder.stopping import Stops
from kiln.records.timing import GenerationCell

DEFAULT_BATCH_SIZES = (1, 4)
DEFAULT_PROMPT_LENGTHS = (4, 16, 64, 128, 256, 512)
NEW_TOKENS = 32


def generate_once(steps: Any, pad_id: int, prompts: np.ndarray, new_tokens: int, decode) -> tuple[float, float]:
    """(TTFT s, mean step s) of one greedy run of ``prompts`` [batch, length] for ``new_tokens`` tokens."""
    stops = Stops(new_tokens, frozenset(), ())  # no EOS: every row runs the full length
    batch = DecodeBatch(steps, pad_id)
    sequences = [new_sequence(row.tolist(), Sampling(), stops, decode) for row in prompts]
    start = time.perf_counter()
    emitted = batch.add(sequences)
    first = time.perf_counter()
    made = len(emitted)
    for _ in range(new_tokens - 1):
        made += len(batch.step())
    end = time.perf_counter()
    if made != len(sequences) * new_tokens:  # the figures below are per token: they must be real tokens
        raise RuntimeError(f"{made} tokens came out of {len(sequences)} rows x {new_tokens} steps")
    return first - start, (end - first) / max(1, new_tokens - 1)


def time_generation(steps: Any, pad_id: int, prompts: Sequence[Sequence[int]], *, batch_size: int, new_tokens: int,
                    decode) -> float:
    """Seconds to continue every prompt by exactly ``new_tokens`` greedy tokens, ``batch_size`` prompts decoding
    together, a finished prompt's place going to the next (the continuous batching of ``generate()`` and kiln
    serve). EOS is ignored, so every pass does the same work."""
    stops = Stops(new_tokens, frozenset(), ())
    start = time.perf_counter()
    made = sum(1 for _ in stream(steps, pad_id, prompts, Sampling(), stops, decode, batch_size=batch_size))
    seconds = time.perf_counter() - start
    if made != len(prompts) * new_tokens:  # a timing per prompt of fewer tokens than said would flatter it
        raise RuntimeError(f"{made} tokens came out of {len(prompts)} prompts x {new_tokens} tokens")
    return seconds


def generation_cell(steps: Any, pad_id: int, prompts: np.ndarray, *, new_tokens: int, runs: int, decode,
                    warmup: int = 1) -> GenerationCell:
    for _ in range(warmup):  # the first run of a shape allocates; it is not what a user waits for
        generate_once(steps, pad_id, prompts, new_tokens, decode)
    timed = [generate_once(steps, pad_id, prompts, new_tokens, decode) for _ in range(runs)]
    ttft, step = [1000 * t for t, _ in timed], [1000 * s for _, s in timed]
    rows, length = prompts.shape
    return GenerationCell(rows, length, new_tokens, runs, statistics.median(ttft), statistics.median(step),
                          max(ttft), max(step))
