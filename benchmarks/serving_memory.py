"""What a served model's sessions hold in memory, and whether it stays bounded.

Two parts, each run in fresh processes so one's memory never counts in the other's:
  * ``sessions ARTIFACT`` (an ONNX Runtime variant): N single-thread sessions as ``kiln serve`` opens them (views of
    one loaded model) against N sessions each loading the model, alternated; each session's thread runs batches of
    ``--batch`` texts of 8 to ``--longest`` tokens (every fourth the longest). Resident memory after loading and
    after the batches, and sequences a second.
  * ``shapes MODEL_XML`` (an OpenVINO decoder step graph, e.g. an optimize output's ``openvino-int8-weights``): a step
    at every past length in turn at batches 1 and 3 (a new shape each call), three passes over the same shapes,
    with oneDNN's primitive cache at its default (1,024) and at ``--cache-capacity`` (kiln's 64); resident memory
    with freed heap handed back after each pass, and its time.
  * ``decode OUTPUT --variant NAME`` (an OpenVINO decoder variant of an optimize output): ``--rounds`` rounds of
    generation as kiln serves it (``kiln.load(...).generate``: batches of 1-4 prompts of 8-400 tokens, 48 new
    tokens each; every round new lengths), through kiln's steps (the cache in whole buckets of 32 positions) and
    through steps fed one shape per past length (``ArraySteps``), each in a fresh process; resident memory after
    each round, freed heap handed back.

    python benchmarks/serving_memory.py sessions kiln-out/best [--sessions 16] [--rounds 3]
    python benchmarks/serving_memory.py shapes kiln-out/openvino-int8-weights/model.xml [--steps 300]
    python benchmarks/serving_memory.py decode kiln-out --variant openvino-int8-weights [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil


def resident_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run_sessions(path: Path, layout: str, count: int, batches: int, batch: int, longest: int) -> dict:
    """One process's figures: ``count`` sessions opened as kiln does (``shared``) or each loading (``separate``)."""
    from kiln.engines import create_engine, open_sessions
    from kiln.engines.base import EngineOptions

    options = EngineOptions(intra_op_threads=1)
    before = resident_mib()
    sessions = (open_sessions("onnxruntime", path, options, count) if layout == "shared" else
                [create_engine("onnxruntime", path, options) for _ in range(count)])
    loaded = resident_mib()
    names = sessions[0].input_names

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for b in range(batches):
            length = longest if b % 4 == 0 else int(rng.integers(8, longest))
            feed = {"input_ids": rng.integers(1000, 2000, (batch, length)),
                    "attention_mask": np.ones((batch, length), np.int64),
                    "token_type_ids": np.zeros((batch, length), np.int64)}
            sessions[k].run({n: feed[n] for n in names})

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(work, range(count)))
    seconds = time.perf_counter() - start
    return {"layout": layout, "load_mib": loaded - before, "resident_mib": resident_mib(),
            "seq_per_s": count * batches * batch / seconds}


def run_shapes(path: Path, steps: int) -> dict:
    """One process's figures: three passes of decoder steps over the same shapes (new in the first pass only)."""
    from kiln.engines import create_engine
    from kiln.engines.base import EngineOptions
    from kiln.system.memory import trim_heap

    engine = create_engine("openvino", path, EngineOptions())
    past = [i for i in engine.compiled_model.inputs if i.get_any_name().startswith("past_key_values")]
    heads, size = past[0].get_partial_shape()[1].get_length(), past[0].get_partial_shape()[3].get_length()

    def feed(rows: int, length: int) -> dict[str, np.ndarray]:
        arrays = {"input_ids": np.ones((rows, 1), np.int64), "attention_mask": np.ones((rows, length + 1), np.int64),
                  "position_ids": np.full((rows, 1), length, np.int64)}
        arrays.update({p.get_any_name(): np.zeros((rows, heads, length, size), np.float32) for p in past})
        return arrays

    engine.run(feed(1, 4))
    trim_heap()
    start_mib, passes = resident_mib(), []
    for _ in range(3):
        start = time.perf_counter()
        for length in range(8, 8 + steps):
            for rows in (1, 3):
                engine.run(feed(rows, length))
        seconds = time.perf_counter() - start
        trim_heap()  # freed heap handed back: what stays is what something holds
        passes.append({"seconds": seconds, "grown_mib": resident_mib() - start_mib})
    return {"start_mib": start_mib, "passes": passes}


def run_decode(path: Path, variant: str, layout: str, rounds: int) -> dict:
    """One process's figures: ``rounds`` rounds of batched generation; ``layout`` "buckets" (kiln's steps) or
    "lengths" (numpy steps: the graph fed the cache at every past length)."""
    import kiln
    from kiln.decoder import steps
    from kiln.system.memory import trim_heap

    if layout == "lengths":
        steps.STEPPERS["openvino"] = steps.ArraySteps
    predictor = kiln.load(path, variant)
    rng = np.random.default_rng(0)
    words = "the of and to in is for that with on as by this be are from".split()
    predictor.generate(["a short warm-up"], max_new_tokens=2)
    trim_heap()
    start_mib, grown, seconds = resident_mib(), [], 0.0
    for _ in range(rounds):
        for batch in (1, 2, 3, 4):
            prompts = [" ".join(rng.choice(words, int(rng.integers(8, 400)))) for _ in range(batch)]
            start = time.perf_counter()
            predictor.generate(prompts, max_new_tokens=48)
            seconds += time.perf_counter() - start
        trim_heap()
        grown.append(round(resident_mib() - start_mib))
    return {"layout": layout, "start_mib": start_mib, "grown_mib": grown, "seconds": seconds}


def child(argv: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *argv], check=True, capture_output=True, text=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("sessions", "shapes", "decode"))
    parser.add_argument("path", type=Path, help="sessions, decode: an artifact or optimize output; shapes: an "
                        "OpenVINO IR")
    parser.add_argument("--variant", help="decode: the OpenVINO decoder variant (default: the output's best)")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--batches", type=int, default=32, help="per session")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--longest", type=int, default=208)
    parser.add_argument("--rounds", type=int, default=3, help="sessions: alternated pairs; decode: rounds")
    parser.add_argument("--steps", type=int, default=300, help="past lengths stepped through (2 shapes each)")
    parser.add_argument("--cache-capacity", type=int, default=64,
                        help="shapes: oneDNN's primitive cache capacity to compare with its default, 1024 "
                        "(default: kiln's for decoders)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="shared", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        if args.part == "decode":
            result = run_decode(args.path, args.variant, args.layout, args.rounds)
        elif args.part == "sessions":
            result = run_sessions(args.path, args.layout, args.sessions, args.batches, args.batch, args.longest)
        else:
            result = run_shapes(args.path, args.steps)
        print(json.dumps(result))
        return
    if args.part == "sessions":
        from kiln.artifact.directory import Artifact

        artifact = Artifact.open(args.path)
        record = artifact.variant()
        if record.engine != "onnxruntime":
            parser.error(f"sessions: the artifact's variant runs on {record.engine}; name an ONNX Runtime variant")
        model = artifact.path / record.path
        common = ["sessions", str(model), "--sessions", str(args.sessions), "--batches", str(args.batches),
                  "--batch", str(args.batch), "--longest", str(args.longest)]
        for _ in range(args.rounds):
            for layout in ("separate", "shared"):
                r = child([*common, "--layout", layout])
                print(f"{args.sessions} x 1-thread sessions, {layout:8s}: load +{r['load_mib']:.0f} MiB, resident "
                      f"{r['resident_mib']:.0f} MiB after {args.batches} batches of {args.batch} each, "
                      f"{r['seq_per_s']:.1f} seq/s", flush=True)
    elif args.part == "decode":
        variant = ["--variant", args.variant] if args.variant else []
        for layout in ("lengths", "buckets"):
            r = child(["decode", str(args.path), *variant, "--rounds", str(args.rounds), "--layout", layout])
            print(f"{layout:8s}: from {r['start_mib']:.0f} MiB, grown after each round (MiB) {r['grown_mib']}, "
                  f"{r['seconds']:.1f} s generating", flush=True)
    else:
        for capacity in (1024, args.cache_capacity):  # oneDNN's default, and kiln's for decoders
            env = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(capacity)}
            r = child(["shapes", str(args.path), "--steps", str(args.steps)], env)
            print(f"oneDNN primitive cache {capacity}: from {r['start_mib']:.0f} MiB, "
                  + "; ".join(f"pass {k} {p['seconds']:.1f} s, +{p['grown_mib']:.0f} MiB"
                              for k, p in enumerate(r["passes"], 1)), flush=True)


if __name__ == "__main__":
    main()
