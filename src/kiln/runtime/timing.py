"""The one timing harness: latency statistics per (batch, length), best-of-rounds passes over a length mix."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tokenizers import Encoding

from kiln.records.timing import LatencyStats, MixResult, Timing
from kiln.runtime.batch_plan import padding_efficiency
from kiln.runtime.predictor import Predictor


def time_calls(call: Callable[[], Any], *, budget_s: float, min_runs: int = 5, max_runs: int = 200,
               warmup: int = 2) -> list[float]:
    """Wall times (s) of ``call`` after ``warmup`` runs: at least ``min_runs``, more while within budget."""
    for _ in range(warmup):
        call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < max_runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def latency_cell(run: Callable[[dict[str, np.ndarray]], Any], batch: dict[str, np.ndarray], *,
                 budget_s: float, min_runs: int = 5) -> LatencyStats:
    times_ms = np.array(time_calls(lambda: run(batch), budget_s=budget_s, min_runs=min_runs)) * 1000
    rows, length = batch["input_ids"].shape
    return LatencyStats(rows, length, len(times_ms), float(np.median(times_ms)),
                        float(np.percentile(times_ms, 90)), float(np.percentile(times_ms, 99)),
                        float(times_ms.std()))


def synthetic_batch(encoder, batch_size: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``batch_size`` different real-text windows of exactly ``seq_len`` tokens (special tokens included)."""
    from kiln.data.texts import joined

    encoding = encoder.encode([joined(seed, 60)], truncate=False)[0]
    ids = np.array(encoding.ids)
    first, last = ids[0], ids[-1]
    body = ids[1:-1]
    rows = []
    for b in range(batch_size):
        offset = (b * 37) % max(1, len(body) - seq_len)
        rows.append(np.concatenate([[first], body[offset : offset + seq_len - 2], [last]])[:seq_len])
    input_ids = np.stack(rows).astype(np.int64)
    arrays = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids),
              "token_type_ids": np.zeros_like(input_ids)}
    return {n: arrays[n] for n in encoder.input_names}


def best_seconds(predictor: Predictor, encodings: Sequence[Encoding], *, rounds: int, sort: bool = True) -> float:
    """Best wall time over ``rounds`` passes of ``predictor`` over ``encodings``."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        predictor.run_features(encodings, sort=sort)
        best = min(best, time.perf_counter() - start)
    return best


def warm(predictor: Predictor, encodings: Sequence[Encoding]) -> None:
    """One batch of the shortest inputs first, so lazy initialisation is not timed: at most a quarter of them (a
    decoder's 32 timing texts are one batch of 32, and warming on all of them was a whole timed pass more, ~10 s a
    variant on GPT-2 small). The shortest, because a decoder's teacher-forced batch steps once per position up to
    its longest row: 8 texts picked in input order reached ~128 tokens, nearly a pass of steps again. What a
    shorter warm-up leaves unallocated, the best of the timed rounds absorbs."""
    count = max(1, min(predictor.batch_size, len(encodings) // 4))
    predictor.run_features(sorted(encodings, key=lambda e: len(e.ids))[:count])


def time_predictor(predictor: Predictor, encodings: Sequence[Encoding], *, rounds: int = 2) -> Timing:
    """The task's own timing of ``predictor`` on ``encodings`` (``TaskSpec.time``: sorted batches, or a decoder's
    generation), best of ``rounds`` passes after a warm-up."""
    return predictor.handler.time(predictor, encodings, rounds=rounds)


def time_sorted_batches(predictor: Predictor, encodings: Sequence[Encoding], *, rounds: int = 2) -> Timing:
    """Sorted batches, best of ``rounds`` passes after a warm-up batch."""
    warm(predictor, encodings)
    return Timing(len(encodings), best_seconds(predictor, encodings, rounds=rounds), predictor.batch_size)


def length_mix_throughput(predictor: Predictor, encodings: Sequence[Encoding], rounds: int = 1) -> MixResult:
    lengths = [len(e.ids) for e in encodings]
    warm(predictor, encodings)
    results = {sort: len(encodings) / best_seconds(predictor, encodings, rounds=rounds, sort=sort)
               for sort in (True, False)}
    multiple = predictor.pad_multiple
    return MixResult(len(encodings), results[True], results[False],
                     padding_efficiency(lengths, predictor.batch_size, True, multiple, predictor.run_tokens),
                     padding_efficiency(lengths, predictor.batch_size, False, multiple), predictor.batch_size)


def peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the address space that exec replaced,
    so a spawned worker reports its own peak; ru_maxrss would carry over the forking parent's."""
    try:
        for line in open("/proc/self/status", encoding="ascii"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_info().rss / 1024**2  # current, where no peak is exposed
