"""The offline side of serve_threads/run.py: the cores kiln.load's split plan uses while it embeds serve_load.py's
texts, threads Python knows (the caller, the sessions' threads) against the rest (the engine's own, the tokenizer's
Rust pool), from /proc per thread (issue 27).

    python benchmarks/experiments/serve_threads/offline.py kiln-out/best [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for serve_load
from serve_load import cpu_seconds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix

    artifact = Artifact.open(args.artifact)
    variant = artifact.variant_name()
    predictor = artifact.predictor(variant, artifact.serving_plan(variant, split_cores=True))
    texts = serving_mix(1024, artifact.encoder().token_count)
    predictor.predict(texts)  # warm

    def per_thread() -> dict[int, float]:
        return {int(t): cpu_seconds(os.getpid(), int(t)) for t in os.listdir("/proc/self/task")}

    for _ in range(args.rounds):
        before, start = per_thread(), time.perf_counter()
        predictor.predict(texts)
        wall, after = time.perf_counter() - start, per_thread()
        python = {t.native_id for t in threading.enumerate()}
        used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
        print(f"{len(texts) / wall:.1f} texts/s; cores: Python's threads "
              f"{sum(s for t, s in used.items() if t in python) / wall:.2f}, the rest (engine, tokenizer pool) "
              f"{sum(s for t, s in used.items() if t not in python) / wall:.2f}")


if __name__ == "__main__":
    main()
