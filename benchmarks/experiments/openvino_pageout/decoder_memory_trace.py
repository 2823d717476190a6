"""Resident memory of an OpenVINO decoder step graph call by call: which calls make the CPU plugin hold more.

    python benchmarks/experiments/openvino_pageout/decoder_memory_trace.py VARIANT/model.xml [--heads 12]

Fixed calls first (a prompt, the same again, the first cached step, the largest prompt and step), then 40 cached steps
of random batch 1-4 and past 1-127 (below the largest seen), one call at batch 8 x past 255, and 20 more small steps.
Ids are all 1 (inside any vocabulary); the caches are zeros: memory, not answers, is measured.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

from kiln.engines import create_engine
from kiln.engines.base import EngineOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for generation_memory
from generation_memory import status_mib as rss_mib  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", type=Path)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-size", type=int, default=64)
    args = parser.parse_args()
    engine = create_engine("openvino", args.graph, EngineOptions(intra_op_threads=2))
    print(f"loaded: {rss_mib()} MiB", flush=True)

    def call(batch: int, tokens: int, past: int) -> None:
        feed = {}
        for name in engine.input_names:
            if name == "input_ids":
                feed[name] = np.ones((batch, tokens), np.int64)
            elif name == "attention_mask":
                feed[name] = np.ones((batch, past + tokens), np.int64)
            elif name == "position_ids":
                feed[name] = np.tile(np.arange(past, past + tokens), (batch, 1)).astype(np.int64)
            else:  # a past key or value
                feed[name] = np.zeros((batch, args.heads, past, args.head_size), np.float32)
        engine.run(feed)

    for shape in [(1, 4, 0), (1, 4, 0), (1, 1, 4), (4, 112, 0), (4, 1, 127), (1, 4, 0)]:
        call(*shape)
        print(f"(batch, tokens, past) {shape}: {rss_mib()} MiB", flush=True)
    rng = random.Random(0)
    for i in range(40):
        call(rng.choice([1, 2, 3, 4]), 1, rng.randint(1, 127))
        if i % 10 == 9:
            print(f"{i + 1} varied small steps: {rss_mib()} MiB", flush=True)
    call(8, 1, 255)
    print(f"(8, 1, 255): {rss_mib()} MiB", flush=True)
    for _ in range(20):
        call(rng.choice([1, 2, 3, 4]), 1, rng.randint(1, 127))
    print(f"20 more small steps: {rss_mib()} MiB", flush=True)


if __name__ == "__main__":
    main()
