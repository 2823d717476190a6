"""End to end texts/s of kiln.load's split plan (no serving.json) by batch size: the peers' held-out texts, sorted
batches, tokenization included, rounds alternated between the sizes in one process (issue 27).

    python benchmarks/experiments/offline_sessions/batch_size.py kiln-out/best [--sizes 8,16,32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kiln.artifact.directory import Artifact
from kiln.data.workloads import held_out_mix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--sizes", default="8,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--texts", type=int, default=1024)
    args = parser.parse_args()
    artifact = Artifact.open(args.artifact)
    variant = artifact.variant_name()
    plan = artifact.serving_plan(variant, split_cores=True)
    predictor = artifact.predictor(variant, plan)
    # benchmarks/peers.py's texts: held-out sentences, 10-200 tokens
    texts = held_out_mix(args.texts, artifact.encoder().token_count)
    sizes = [int(s) for s in args.sizes.split(",")]
    predictors = {size: predictor.with_batch_size(size) for size in sizes}
    for each in predictors.values():
        each.predict(texts[:256])  # warm: OpenVINO compiles per input shape
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(args.rounds):
        for size, each in predictors.items():
            start = time.perf_counter()
            each.predict(texts)
            rates[size].append(len(texts) / (time.perf_counter() - start))
    print(f"{variant}: {len(predictor.sessions)} session(s), plan batch size {plan.batch_size}")
    for size in sizes:
        print(f"batches of {size:3d}: median {statistics.median(rates[size]):6.1f} texts/s, "
              f"rounds {', '.join(f'{r:.1f}' for r in rates[size])}")


if __name__ == "__main__":
    main()
