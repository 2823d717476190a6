"""Bulk embedding throughput: kiln embed in one process and on a local Ray cluster, against the offline predictor.

The corpus is 100,000 mixed-length real English texts made from the docstrings of the standard library and the
installed packages and the reference manual's topics (no download): text i joins 1-3 consecutive sentences from
an offset that walks the sentence list, so lengths vary from a few words to past the model's 256 tokens. Three
runs over the same corpus and artifact, one after another in this process:

1. the offline predictor: ``kiln.load(ARTIFACT).predict`` over windows of 1,024 texts (no files written);
2. ``kiln embed`` in this process (run_embed): the same windows, Parquet parts of 10,000 rows;
3. ``kiln embed --ray local``: Ray started here with every usable core, one actor per core (1 thread each).

Every run's vectors are compared with run 1's (max abs difference). Results -> benchmarks/embed_corpus.json.

    python benchmarks/embed_corpus.py --artifact kiln-out [--texts 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln
from kiln.bulk.job import EmbedConfig, run_embed
from kiln.bulk.parts import read_output
from kiln.data import corpus
from kiln.data.docstrings import docstring_sentences

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree


def texts(count: int) -> list[str]:
    sentences = list(docstring_sentences(packages=("numpy", "scipy", "transformers", "torch")))
    sentences += list(corpus.sentences("calibration")) + list(corpus.sentences("held-out"))
    n = len(sentences)
    return [" ".join(sentences[(7919 * i + k) % n] for k in range(1 + i % 3)) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--json", "--out", dest="out", type=Path, default=OUT / "embed_corpus.json")
    args = parser.parse_args()
    data = texts(args.texts)
    cores = len(os.sched_getaffinity(0))
    predictor = kiln.load(args.artifact)
    encoder = predictor.encoder
    sample = data[:: max(1, len(data) // 2000)]
    lengths = [len(e.ids) for e in encoder.encode(sample, truncate=False)]
    results: dict = {"artifact": str(args.artifact), "variant": kiln.Artifact.open(args.artifact).variant_name(),
                     "texts": len(data), "cores": cores, "machine": platform.processor() or platform.machine(),
                     "tokens (sampled, untruncated)": {"mean": float(np.mean(lengths)),
                                                       "p50": float(np.median(lengths)),
                                                       "p95": float(np.percentile(lengths, 95)),
                                                       "max": int(max(lengths))},
                     "runs": {}}
    with tempfile.TemporaryDirectory(prefix="kiln-embed-bench-") as scratch:
        root = Path(scratch)
        source = root / "corpus.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in data))

        start = time.perf_counter()
        offline = np.concatenate([np.stack(predictor.predict(data[s : s + 1024])) for s in range(0, len(data), 1024)])
        seconds = time.perf_counter() - start
        results["runs"]["offline predictor"] = {"seconds": seconds, "texts_per_s": len(data) / seconds}
        print(f"offline predictor: {len(data) / seconds:.1f} texts/s", flush=True)

        for folder, name, extra in (
                ("single", "kiln embed (1 process)", {}),
                ("ray", f"kiln embed --ray local ({cores} actors x 1 thread)", {"ray": "local", "threads": 1})):
            out = root / folder
            start = time.perf_counter()
            summary = run_embed(EmbedConfig(args.artifact, source, out, **extra))
            seconds = time.perf_counter() - start  # wall time: reading INPUT, Ray start-up and writing included
            table = read_output(out)
            got = np.array(table.column("vector").to_pylist(), dtype=np.float32)
            results["runs"][name] = {"seconds": seconds, "texts_per_s": len(data) / seconds,
                                     "embedding_texts_per_s": summary.texts_per_second, "parts": summary.parts,
                                     "max_abs_diff_vs_offline": float(np.abs(got - offline).max())}
            diff = results["runs"][name]["max_abs_diff_vs_offline"]
            print(f"{name}: {len(data) / seconds:.1f} texts/s (max abs diff vs offline {diff:.2e})", flush=True)
            shutil.rmtree(out)
    base = results["runs"]["offline predictor"]["texts_per_s"]
    for run in results["runs"].values():
        run["vs_offline"] = run["texts_per_s"] / base
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
