"""Offline throughput of one variant at several batch sizes: does the server's batch size cost speed?

    python benchmarks/offline_batch_sizes.py ARTIFACT [--variant NAME] [--sizes 4,8,16,32,64] [--rounds 2]

1,024 texts of 10-200 tokens (the peers' and serve_load's mix), tokenized once, length-sorted batches of each size
through kiln's predictor as kiln.load runs it (its sessions x threads); every size once per round, rounds
interleaved so drift in the machine's speed hits every size alike. Prints texts/s per (round, size).
"""

from __future__ import annotations

import argparse
import time

from kiln.artifact.directory import Artifact
from kiln.data.texts import length_mix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--variant", default=None, help="default: the artifact's best")
    parser.add_argument("--sizes", default="4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    art = Artifact.open(args.artifact)
    # as kiln.load runs it: serving.json where kiln bench wrote one, else its split of the cores
    predictor = art.predictor(args.variant, art.serving_plan(args.variant, split_cores=True))
    texts = length_mix(1024, 10, 200, seed=3, token_count=art.encoder().token_count)
    encodings = predictor.encoder.encode(texts)
    predictor.run_features(encodings[:64])  # warm-up
    for round_ in range(args.rounds):
        for size in (int(s) for s in args.sizes.split(",")):
            sized = predictor.with_batch_size(size)
            start = time.perf_counter()
            sized.run_features(encodings)
            print(f"round {round_ + 1}, batch {size}: {len(encodings) / (time.perf_counter() - start):.1f} texts/s",
                  flush=True)


if __name__ == "__main__":
    main()
