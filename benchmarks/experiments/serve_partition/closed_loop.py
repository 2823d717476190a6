"""A discrete-event simulation of kiln serve's batcher under closed-loop clients: throughput, p50/p99 latency and
padding for batching policies, without an engine or its noise (issue 27).

Model: ``--clients`` clients each send one text (a length drawn from serve_load.py's texts), wait for its answer and
send the next at once; two engine streams each run one batch at a time, taking (padded tokens + ``--call-tokens``) /
``--tokens-per-s`` seconds. A policy picks the next batch from the waiting requests (in arrival order) whenever a
stream is free. The absolute req/s depends on ``--tokens-per-s``; the comparison between policies is the point.

Policies: ``window W`` is the partition over the oldest W requests (``--batch-window W``), costed at padded widths,
the group holding the oldest runs; ``due W`` is kiln serve's: the group holding the feature due first
(kiln.serve.batcher.Pace: arrival minus the expected run time of a batch of its width) runs; ``score W`` runs the
partition's group with the largest summed wait instead (the oldest's group once it has waited ``--guard-ms``);
``adaptive W/N`` uses window N while the oldest has waited over ``--guard-ms``, else W.

    python benchmarks/experiments/serve_partition/closed_loop.py kiln-out/best [--clients 64]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Callable

from kiln.artifact.directory import Artifact
from kiln.data.workloads import serving_mix
from kiln.runtime.tokenization import padded_width
from kiln.serve.batcher import BatchLimits, BatchStats, Pace, next_group, partition

Waiting = list[tuple[float, int]]  # (arrival time, length) in arrival order
Policy = Callable[[Waiting, float], Waiting]


def simulate(policy: Policy, lengths: list[int], args: argparse.Namespace, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    now, waiting = 0.0, [(0.0, rng.choice(lengths)) for _ in range(args.clients)]
    free, running, latencies, tokens, inputs = 2, [], [], 0, 0
    while len(latencies) < args.requests:
        while free and waiting:
            batch = policy(waiting, now)
            for item in batch:
                waiting.remove(item)
            padded = padded_width(max(length for _, length in batch), args.multiple) * len(batch)
            tokens, inputs = tokens + padded, inputs + len(batch)
            heapq.heappush(running, (now + (padded + args.call_tokens) / args.tokens_per_s, id(batch), batch))
            free -= 1
        now, _, batch = heapq.heappop(running)
        free += 1
        for arrived, _ in batch:
            latencies.append(now - arrived)
            waiting.append((now, rng.choice(lengths)))
    steady = sorted(latencies[len(latencies) // 10:])  # the first tenth is the ramp
    return {"req_s": len(latencies) / now, "p50_ms": 1000 * statistics.median(steady),
            "p99_ms": 1000 * steady[int(0.99 * len(steady))], "padded": tokens / inputs}


def oldest_group(window: Waiting, limits: BatchLimits, multiple: int, pace: Pace | None = None) -> Waiting:
    """kiln serve's choice (kiln.serve.batcher.next_group): the group holding the oldest, or with ``pace`` the one
    holding the feature due first."""
    widths = [padded_width(n, multiple) for _, n in window]
    anchor = 0 if pace is None else pace.first_due([arrived for arrived, _ in window], widths)
    return [window[k] for k in next_group(widths, limits, anchor)]


def most_waited_group(window: Waiting, limits: BatchLimits, multiple: int, now: float) -> Waiting:
    """The partition's group with the largest summed wait, instead of the one holding the oldest."""
    order = sorted(range(len(window)), key=lambda k: window[k][1])
    groups = partition([padded_width(window[k][1], multiple) for k in order], limits)
    start, end = max(groups, key=lambda g: sum(now - window[order[k]][0] for k in range(*g)))
    return [window[order[k]] for k in range(start, end)]


def policies(args: argparse.Namespace) -> dict[str, Policy]:
    limits, multiple, guard = BatchLimits(), args.multiple, args.guard_ms / 1000

    def window(size: int) -> Policy:
        return lambda waiting, now: oldest_group(waiting[:size], limits, multiple)

    def due(size: int) -> Policy:
        pace = Pace()  # fed each chosen batch's simulated run time, as the batcher feeds it each batch's stats

        def policy(waiting: Waiting, now: float) -> Waiting:
            batch = oldest_group(waiting[:size], limits, multiple, pace)
            tokens = padded_width(max(n for _, n in batch), multiple) * len(batch)
            pace.observe(BatchStats(len(batch), tokens, 0.0, (tokens + args.call_tokens) / args.tokens_per_s))
            return batch
        return policy

    def score(size: int) -> Policy:
        def policy(waiting: Waiting, now: float) -> Waiting:
            if now - waiting[0][0] >= guard:
                return oldest_group(waiting[:size], limits, multiple)
            return most_waited_group(waiting[:size], limits, multiple, now)
        return policy

    def adaptive(wide: int, narrow: int) -> Policy:
        return lambda waiting, now: window(narrow if now - waiting[0][0] >= guard else wide)(waiting, now)

    out = {f"window {w}": window(w) for w in (8, 16, 24, 32, 48, 64)}
    out.update({f"due {w}": due(w) for w in (16, 24, 28, 32, 48)})
    out.update({f"score {w}": score(w) for w in (32, 48)})
    out.update({f"adaptive {w}/{n}": adaptive(w, n) for w, n in ((32, 16), (48, 16), (64, 16))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--multiple", type=int, default=16)
    parser.add_argument("--tokens-per-s", type=float, default=10_600.0, help="one stream's rate (kiln serve, MiniLM "
                        "int8, 2-core EPYC: ~10.6k)")
    parser.add_argument("--call-tokens", type=float, default=16.0, help="an engine call's fixed cost, in tokens")
    parser.add_argument("--guard-ms", type=float, default=300.0)
    args = parser.parse_args()
    encoder = Artifact.open(args.artifact).encoder()
    lengths = [len(e.ids) for e in encoder.encode(serving_mix(512, encoder.token_count), truncate=True)]
    for name, policy in policies(args).items():
        row = simulate(policy, lengths, args)
        print(f"{name:15s} {row['req_s']:6.1f} req/s  p50 {row['p50_ms']:4.0f} ms  p99 {row['p99_ms']:4.0f} ms  "
              f"padded tokens per input {row['padded']:.1f}", flush=True)


if __name__ == "__main__":
    main()
