"""Resident memory of N ONNX Runtime sessions of one model, each with its own CPU arena or sharing the environment's.

    python benchmarks/experiments/ort_session_memory/run.py MODEL.onnx {own,shared} N [--together]

Each session (one intra-op thread, as kiln serve's default sessions) runs batches of 32 x 16/64/128/208 tokens four
times; with --together the sessions run at once, one thread each. Prints the memory added by loading and by running.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for generation_memory
from generation_memory import status_mib as rss_mib  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("arena", choices=("own", "shared"))
    parser.add_argument("sessions", type=int)
    parser.add_argument("--together", action="store_true")
    args = parser.parse_args()
    if args.arena == "shared":
        memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, -1, -1, -1))

    def session() -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        if args.arena == "shared":
            options.add_session_config_entry("session.use_env_allocators", "1")
        return ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])

    base = rss_mib()
    sessions = [session() for _ in range(args.sessions)]
    loaded = rss_mib()
    names = [i.name for i in sessions[0].get_inputs()]

    def work(s: ort.InferenceSession) -> None:
        for _ in range(4):
            for length in (16, 64, 128, 208):
                s.run(None, {n: np.ones((32, length), np.int64) for n in names})

    start = time.perf_counter()
    if args.together:
        with ThreadPoolExecutor(len(sessions)) as pool:
            list(pool.map(work, sessions))
    else:
        for s in sessions:
            work(s)
    print(f"{args.arena} arena, {args.sessions} session(s){' at once' if args.together else ''}: loading "
          f"+{loaded - base} MiB, after the runs +{rss_mib() - base} MiB, {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
