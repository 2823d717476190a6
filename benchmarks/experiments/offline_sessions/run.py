"""Offline `kiln.load(...).predict` with one session of all threads, one single-thread session per core, and kiln.load's
default (OpenVINO: the streams its throughput hint picks, and a solo model of all cores for a lone batch).

    python benchmarks/experiments/offline_sessions/run.py ARTIFACT [--rounds 10] [--variant NAME]

The predictors are loaded in one process and alternate passes over the peers' 1,024 held-out texts (10-200 tokens,
benchmarks/peers.py's mix); prints each pass's texts/s and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import kiln
from kiln.data.workloads import held_out_mix
from kiln.system.cpu import cpu_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    cores = cpu_info().usable_cores
    configs = {f"1 x {cores}": {"sessions": 1, "threads": cores}, f"{cores} x 1": {"sessions": cores, "threads": 1},
               "kiln.load's default": {}}
    predictors = {name: kiln.load(args.artifact, args.variant, **c) for name, c in configs.items()}
    first = next(iter(predictors.values()))
    texts = held_out_mix(1024, first.encoder.token_count)
    for predictor in predictors.values():
        predictor.predict(texts)  # warm-up: the engine's first shapes
    rates: dict[str, list[float]] = {name: [] for name in predictors}
    for _ in range(args.rounds):
        for name, predictor in predictors.items():
            start = time.perf_counter()
            predictor.predict(texts)
            rates[name].append(round(len(texts) / (time.perf_counter() - start), 1))
    for name, values in rates.items():
        print(f"sessions x threads {name}: median {statistics.median(values):.1f} texts/s; passes {values}")


if __name__ == "__main__":
    main()
