"""Speed and fidelity of a `kiln optimize` artifact's chosen variant against PyTorch fp32 eager.

The issue's protocol: the bundled MiniLM, 2 threads, batch 32 over 1,024 texts of 10-200 tokens,
length-sorted, tokenization excluded, everything measured in one run. Baseline and variant are timed in
alternating rounds (the machine's speed drifts by up to +-20%) and the median of the per-round ratios is
reported, with every round's figures in the JSON output.

    python benchmarks/optimize_speed.py kiln-out [--variant NAME] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from kiln.artifact import Artifact
from kiln.choices import TaskName
from kiln.engines import EngineOptions
from kiln.engines.torch_eager import TorchEngine
from kiln.export.wrapper import TaskModule
from kiln.runtime import Predictor
from kiln.texts import length_mix


def pytorch_baseline(threads: int, attn: str) -> TorchEngine:
    """The vanilla model: transformers' AutoModel with its default attention (sdpa) or eager attention."""
    import transformers

    from kiln.source import bundled_model_dir

    model = transformers.AutoModel.from_pretrained(bundled_model_dir(), attn_implementation=attn).eval()
    module = TaskModule(model, ("input_ids", "attention_mask", "token_type_ids"), ("last_hidden_state",))
    return TorchEngine(module, EngineOptions(intra_op_threads=threads))


def throughput(predictor: Predictor, encodings, sort: bool) -> float:
    start = time.perf_counter()
    predictor.run_features(encodings, sort=sort)
    return len(encodings) / (time.perf_counter() - start)


def latency_ms(engine, encoder, tokens: int = 128, runs: int = 30) -> float:
    words = " ".join(["kiln"] * 400)
    ids = encoder.encode([words])[0]
    assert len(ids.ids) >= tokens
    batch = encoder.collate([ids])
    batch = {k: v[:, :tokens].copy() for k, v in batch.items()}
    engine.run(batch)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        engine.run(batch)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


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

    art = Artifact.open(args.artifact)
    if art.task_config.task is not TaskName.FEATURE_EXTRACTION:
        sys.exit("this benchmark measures feature-extraction artifacts (cosine to PyTorch)")
    from kiln.optimize.job import engine_options
    from kiln.optimize.context import BuiltVariant

    name = art.variant_name(args.variant)
    record = art.variant(name)
    built = BuiltVariant(**{k: record[k] for k in ("name", "engine", "path", "files", "recipe", "options")})
    from kiln.engines import create_engine

    variant_engine = create_engine(built.engine, art.path / built.path, engine_options(built, args.threads))
    encoder = art.encoder()
    texts = length_mix(args.texts, 10, 200, seed=7, token_count=lambda t: len(encoder.encode([t])[0].ids))
    encodings = encoder.encode(texts)
    lengths = [len(e.ids) for e in encodings]
    baselines = {"sdpa": pytorch_baseline(args.threads, "sdpa"), "eager": pytorch_baseline(args.threads, "eager")}
    predictors = {k: Predictor(art.task_config, encoder, e, batch_size=args.batch_size) for k, e in baselines.items()}
    predictors[name] = Predictor(art.task_config, encoder, variant_engine, batch_size=args.batch_size)

    reference = np.stack(predictors["sdpa"].run_features(encodings))
    got = np.stack(predictors[name].run_features(encodings))
    cosine = (reference * got).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(got, axis=1)

    rounds = []
    for r in range(args.rounds):
        row = {}
        for key, predictor in predictors.items():
            row[f"{key}_sorted"] = throughput(predictor, encodings, sort=True)
            row[f"{key}_unsorted"] = throughput(predictor, encodings, sort=False)
            row[f"{key}_b1_ms"] = latency_ms(predictor.engine, encoder)
        rounds.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)

    def ratio(num: str, den: str) -> float:
        return statistics.median(row[num] / row[den] for row in rounds)

    result = {
        "variant": name, "threads": args.threads, "batch_size": args.batch_size, "texts": len(texts),
        "tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min()),
        "median": {k: statistics.median(row[k] for row in rounds) for k in rounds[0]},
        "speedup_sorted_vs_sdpa": ratio(f"{name}_sorted", "sdpa_sorted"),
        "speedup_sorted_vs_eager": ratio(f"{name}_sorted", "eager_sorted"),
        "latency_ratio_vs_sdpa": ratio(f"{name}_b1_ms", "sdpa_b1_ms"),
        "latency_ratio_vs_eager": ratio(f"{name}_b1_ms", "eager_b1_ms"),
        "rounds": rounds,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
