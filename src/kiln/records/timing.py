"""Timing records: latency statistics per (batch, length) and best-of-rounds passes over a length mix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyStats:
    batch_size: int
    seq_len: int
    n: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    std_ms: float

    @property
    def ms_per_sequence(self) -> float:
        return self.median_ms / self.batch_size

    @property
    def sequences_per_second(self) -> float:
        return 1000 * self.batch_size / self.median_ms


@dataclass(frozen=True)
class MixResult:
    sequences: int
    sorted_per_s: float
    unsorted_per_s: float
    sorted_padding_efficiency: float  # real tokens / computed tokens
    unsorted_padding_efficiency: float
    batch_size: int


@dataclass(frozen=True)
class Timing:
    """Best wall time of passes over a length mix, tokenization excluded: length-sorted batches, or for a decoder
    (``new_tokens`` > 0) each text a prompt continued by that many greedy tokens, ``batch_size`` decoding together."""

    sequences: int
    seconds: float
    batch_size: int
    new_tokens: int = 0

    def describe(self) -> str:
        return describe_timing(self.sequences, self.batch_size, self.new_tokens)

    @property
    def ms_per_sequence(self) -> float:
        return 1000 * self.seconds / self.sequences

    @property
    def sequences_per_second(self) -> float:
        return self.sequences / self.seconds


def describe_timing(sequences: int, batch_size: int, new_tokens: int) -> str:
    """What a timing timed, as the report says it."""
    if new_tokens:
        return (f"{sequences} prompts each continued by {new_tokens} greedy tokens, {batch_size} decoding together "
                "(continuous batching, as generate() and kiln serve run it)")
    return f"{sequences} sequences, length-sorted batches of up to {batch_size}, cut where they pad least"


@dataclass(frozen=True)
class GenerationCell:
    """Medians over ``runs``: ``ttft_ms`` is the prefill of the whole batch and its first token; ``per_token_ms``
    the mean of the ``new_tokens - 1`` single-token steps after it (each step makes one token per row)."""

    batch_size: int
    prompt_tokens: int
    new_tokens: int
    runs: int
    ttft_ms: float
    per_token_ms: float
    ttft_max_ms: float
    per_token_max_ms: float

    @property
    def tokens_per_second(self) -> float:
        """Decoding throughput after the first token: rows x steps per second."""
        return 1000 * self.batch_size / self.per_token_ms
