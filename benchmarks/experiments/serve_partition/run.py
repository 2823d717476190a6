"""Replay of kiln serve's batch partition over a stream of waiting requests: padded tokens per input and batch size,
with the partition costing raw lengths against the engine's padded widths (issue 27).

No engine runs: a window of ``--window`` waiting single-text requests (lengths drawn from serve_load.py's texts,
tokenized by the artifact's tokenizer) is cut by ``kiln.serve.batcher.partition``; the group holding the oldest
request "runs", its requests are replaced by new arrivals, and so on. What the engine would run is each group's
longest length rounded up to the pad multiple, times its size. Sorted batches of 8 over the whole set (offline) are
printed for comparison.

    python benchmarks/experiments/serve_partition/run.py kiln-out/best [--window 32] [--multiples 16,8]
"""

from __future__ import annotations

import argparse
import random

from kiln.artifact.directory import Artifact
from kiln.bench.measure import padding_efficiency
from kiln.data.workloads import serving_mix
from kiln.runtime.tokenization import padded_width
from kiln.serve.batcher import BatchLimits, next_group


def replay(lengths: list[int], window: int, multiple: int, padded: bool, limits: BatchLimits,
           inputs: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """(padded tokens per input, inputs per batch) over ``inputs`` replayed requests."""
    rng = random.Random(seed)
    waiting = [rng.choice(lengths) for _ in range(window)]  # in arrival order: waiting[0] is the oldest
    tokens = done = calls = 0
    while done < inputs:
        chosen = set(next_group([padded_width(n, multiple) if padded else n for n in waiting], limits))
        tokens += padded_width(max(waiting[k] for k in chosen), multiple) * len(chosen)
        done, calls = done + len(chosen), calls + 1
        waiting = [n for k, n in enumerate(waiting) if k not in chosen] + [rng.choice(lengths) for _ in chosen]
    return tokens / done, done / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--window", type=int, default=BatchLimits().window_requests)
    parser.add_argument("--multiples", default="16,8")
    args = parser.parse_args()
    encoder = Artifact.open(args.artifact).encoder()
    texts = serving_mix(512, encoder.token_count)
    lengths = [len(e.ids) for e in encoder.encode(texts, truncate=True)]
    limits = BatchLimits()
    print(f"{len(lengths)} texts, real mean {sum(lengths) / len(lengths):.1f} tokens; window {args.window} requests, "
          f"per-call cost {limits.call_overhead_tokens} tokens")
    for multiple in (int(m) for m in args.multiples.split(",")):
        for padded in (False, True):
            per_input, size = replay(lengths, args.window, multiple, padded, limits)
            print(f"multiple {multiple:2d}, partition on {'padded widths' if padded else 'raw lengths  '}: "
                  f"{per_input:6.1f} padded tokens per input, batches of {size:.1f}")
        offline = sum(lengths) / len(lengths) / padding_efficiency(lengths, 8, sort=True, multiple=multiple)
        print(f"multiple {multiple:2d}, sorted batches of 8 (offline): {offline:6.1f}")


if __name__ == "__main__":
    main()
