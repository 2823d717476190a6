"""What running each text alone (the simplest way to make a per-batch int8 scale batch-invariant) costs.

    python benchmarks/alone_cost.py ARTIFACT [--variants a,b] [--texts 256]

Times each variant on the same length mix (10-200 tokens, tokenization excluded) in length-sorted batches of 32
and one text at a time (no padding), best of 3, on the machine's threads.
"""

from __future__ import annotations

import argparse
import time

from kiln.artifact.directory import Artifact
from kiln.data.texts import length_mix


def best_of(run, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--variants", default="onnx-int8-dynamic,openvino-int8-static")
    parser.add_argument("--texts", type=int, default=256)
    args = parser.parse_args()
    art = Artifact.open(args.artifact)
    texts = length_mix(args.texts, 10, 200, seed=3, token_count=art.encoder().token_count)
    for name in args.variants.split(","):
        predictor = art.predictor(name)
        encodings = predictor.encoder.encode(texts)
        alone = predictor.with_batch_size(1)
        predictor.run_features(encodings[:8])  # warm-up
        batched = best_of(lambda p=predictor, e=encodings: p.run_features(e))
        single = best_of(lambda p=alone, e=encodings: p.run_features(e))
        print(f"{name:<24} sorted batches of 32: {len(texts) / batched:6.1f} texts/s; one at a time: "
              f"{len(texts) / single:6.1f} texts/s ({batched / single:.2f}x)")


if __name__ == "__main__":
    main()
