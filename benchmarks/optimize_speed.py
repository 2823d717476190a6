"""Speed and fidelity of a `kiln optimize` artifact's chosen variant against PyTorch fp32 eager.

The issue's protocol: the bundled MiniLM, 2 threads, batch 32 over 1,024 texts of 10-200 tokens,
length-sorted (unsorted also reported), tokenization excluded, everything measured in one run.

Each engine lives in its own worker process (torch's OpenMP threads keep spinning after a call and slow
whatever runs next in the same process; a served kiln variant never has torch beside it). Workers take
turns, one at a time, for ``--rounds`` rounds; each round times every engine once, and the median of the
per-round ratios is reported, with every round's figures in the JSON output.

    python benchmarks/optimize_speed.py kiln-out [--variant NAME] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

import numpy as np

BASELINES = {"pytorch-sdpa": "sdpa", "pytorch-eager": "eager"}


def _engine(kind: str, artifact: str, variant: str | None, threads: int):
    from kiln.artifact.directory import Artifact
    from kiln.engines import EngineOptions

    art = Artifact.open(artifact)
    if kind in BASELINES:  # the vanilla model: AutoModel with transformers' default (sdpa) or eager attention
        import transformers

        from kiln.engines.torch_eager import TorchEngine
        from kiln.model.module import TaskModule
        from kiln.source.loading import bundled_model_dir

        transformers.utils.logging.disable_progress_bar()
        model = transformers.AutoModel.from_pretrained(bundled_model_dir(), attn_implementation=BASELINES[kind])
        module = TaskModule(model.eval(), tuple(art.manifest.tokenizer.input_names), ("last_hidden_state",))
        return art, TorchEngine(module, EngineOptions(intra_op_threads=threads))
    record = art.variant(variant)
    return art, art.engine(variant, EngineOptions.for_variant(record, threads))


def worker(conn, kind: str, artifact: str, variant: str | None, threads: int, texts: int, batch: int) -> None:
    from kiln.data.texts import length_mix
    from kiln.runtime.predictor import Predictor
    from kiln.runtime.timing import best_seconds
    from kiln.tasks import task_handler

    art, engine = _engine(kind, artifact, variant, threads)
    encoder = art.encoder()
    sample = length_mix(texts, 10, 200, seed=7, token_count=encoder.token_count)
    encodings = encoder.encode(sample)
    predictor = Predictor(task_handler(art.task_config), encoder, engine, batch_size=batch)
    predictor.run_features(encodings[:batch])  # warm-up
    one = encoder.collate(encoder.encode([" ".join(["kiln"] * 400)]))
    one = {k: v[:, :128].copy() for k, v in one.items()}  # exactly 128 tokens
    while (command := conn.recv()) != "stop":
        if command == "embed":
            conn.send(np.stack(predictor.run_features(encodings)))
            continue
        if command == "lengths":
            conn.send([len(e.ids) for e in encodings])
            continue
        row: dict[str, Any] = {}
        for sort in (True, False):  # kiln's one timing harness, one pass each
            row["sorted" if sort else "unsorted"] = len(encodings) / best_seconds(predictor, encodings, rounds=1,
                                                                                sort=sort)
        engine.run(one)
        latencies = []
        for _ in range(30):
            start = time.perf_counter()
            engine.run(one)
            latencies.append(time.perf_counter() - start)
        row["b1_ms"] = 1000 * statistics.median(latencies)
        conn.send(row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--variant", default=None, help="default: the artifact's best variant")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from kiln.artifact.directory import Artifact

    art = Artifact.open(args.artifact)
    name = art.variant_name(args.variant)
    if art.task_config.task.value != "feature-extraction":
        sys.exit("this benchmark measures feature-extraction artifacts (cosine to PyTorch)")
    ctx = mp.get_context("spawn")
    workers = {}
    for kind in (*BASELINES, name):
        parent, child = ctx.Pipe()
        process = ctx.Process(target=worker, args=(child, kind, args.artifact, args.variant, args.threads,
                                                   args.texts, args.batch_size), daemon=True)
        process.start()
        workers[kind] = (parent, process)

    def ask(kind: str, command: str):
        workers[kind][0].send(command)
        return workers[kind][0].recv()

    lengths = ask(name, "lengths")
    reference, got = ask("pytorch-sdpa", "embed"), ask(name, "embed")
    cosine = (reference * got).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(got, axis=1)
    rounds = []
    for r in range(args.rounds):
        row = {}
        for kind in workers:
            row.update({f"{kind}_{k}": v for k, v in ask(kind, "measure").items()})
        rounds.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    for parent, process in workers.values():
        parent.send("stop")
        process.join(timeout=30)

    def ratio(num: str, den: str) -> float:
        return statistics.median(row[num] / row[den] for row in rounds)

    result = {
        "variant": name, "threads": args.threads, "batch_size": args.batch_size, "texts": args.texts,
        "tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min()),
        "median": {k: statistics.median(row[k] for row in rounds) for k in rounds[0]},
        **{f"speedup_{s}_vs_{b}": ratio(f"{name}_{s}", f"{b}_{s}") for s in ("sorted", "unsorted") for b in BASELINES},
        **{f"latency_ratio_vs_{b}": ratio(f"{name}_b1_ms", f"{b}_b1_ms") for b in BASELINES},
        "rounds": rounds,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
