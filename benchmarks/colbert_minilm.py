"""A ColBERT-shaped model from the bundled MiniLM: kiln optimize --task multi-vector, and kiln against PyLate.

No ColBERT checkpoint is downloadable here, so one is made in PyLate's layout: the bundled all-MiniLM-L6-v2's
encoder, the [Q]/[D] markers added to its tokenizer (embeddings resized, as PyLate does), and a random 384 -> 128
projection (seed 0); PyLate's defaults otherwise (query length 32, document length 180, [MASK] expansion, the
punctuation skiplist). Random projection: the scores mean nothing, but every variant must reproduce them, which is
what the gate and the drift measure.

    python benchmarks/colbert_minilm.py [--out benchmarks/colbert.minilm.json] [--skip-optimize]

1. ``kiln optimize DIR --task multi-vector`` (default CPU variants): per variant the gate's figures (MaxSim rank
   agreement per query, token-vector cosine), the batch drift and the speed-up (its summary.md is copied beside
   the JSON);
2. on 32 held-out queries x 256 held-out documents, kiln's onnx-fp32 and best variants against PyLate 1.6.0 (its
   own venv, ``make pylate``): the largest token-vector difference and MaxSim score difference, and documents per second
   end to end (tokenization included, 2 threads, best of 3) for PyLate's encode and kiln's predictor.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

ROOT = Path(__file__).resolve().parents[1]
PYLATE = ROOT / ".venv-pylate" / "bin" / "python"


def build(directory: Path) -> Path:
    """The ColBERT-shaped MiniLM in PyLate's layout."""
    import string

    import torch
    import transformers
    from safetensors.torch import save_file

    from kiln.source.loading import bundled_model_dir

    shutil.copytree(bundled_model_dir(), directory)
    for stale in ("modules.json", "1_Pooling", "2_Normalize"):
        target = directory / stale
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    model = transformers.AutoModel.from_pretrained(directory)
    torch.manual_seed(0)  # the markers' new embedding rows are drawn at random: the same model on every run
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    (directory / "1_Dense").mkdir()
    (directory / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": 384, "out_features": 128, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
    save_file({"linear.weight": torch.randn(128, 384) / 384**0.5}, str(directory / "1_Dense" / "model.safetensors"))
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 179, "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
        "document_length": 180, "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation), "do_query_expansion": True}))
    return directory


def inputs() -> tuple[list[str], list[str]]:
    """32 held-out documentation sentences as queries, 256 others as the documents every query is scored on."""
    from kiln.data import corpus

    sentences = list(corpus.sentences("held-out"))
    return sentences[:32], sentences[100:356]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", "--out", dest="out", type=Path, default=OUT / "colbert_minilm.json")
    parser.add_argument("--work", type=Path, default=Path("/tmp/colbert-minilm"))
    parser.add_argument("--skip-optimize", action="store_true", help="reuse WORK/optimized")
    args = parser.parse_args()

    import kiln
    from kiln.system.cpu import cpu_info

    model_dir, optimized = args.work / "model", args.work / "optimized"
    if not args.skip_optimize:
        shutil.rmtree(args.work, ignore_errors=True)
        args.work.mkdir(parents=True)
        build(model_dir)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kiln", "optimize", str(model_dir), "--task", "multi-vector", "-o",
                        str(optimized), "--force"], check=True)
        print(f"kiln optimize: {time.perf_counter() - start:.0f} s", flush=True)
    results = json.loads((optimized / "results.json").read_text())
    queries, documents = inputs()
    result: dict = {"cpu": cpu_info().to_dict(), "best": results["best"], "variants": {
        o["name"]: {"status": o["status"], "reason": o["reason"],
                    "figures": (o.get("agreement") or {}).get("figures"),
                    "ms_per_sequence": (o.get("timing") or {}).get("seconds", 0) * 1000
                    / max((o.get("timing") or {}).get("sequences", 1), 1) if o.get("timing") else None}
        for o in results["outcomes"]}}
    shutil.copy(optimized / "summary.md", args.out.with_suffix(".summary.md"))

    with tempfile.TemporaryDirectory() as scratch:
        given, got = Path(scratch) / "in.json", Path(scratch) / "out.npz"
        given.write_text(json.dumps({"queries": queries, "documents": documents}))
        run = subprocess.run([str(PYLATE), str(ROOT / "tests" / "peers" / "pylate_encode.py"), str(model_dir),
                              str(given), str(got), "--time"], capture_output=True, text=True, check=True)
        pylate = dict(np.load(got))
        result["pylate_documents_per_s"] = float(json.loads(run.stdout.strip().splitlines()[-1])["documents_per_s"])
    for variant in ("onnx-fp32", results["best"]):
        predictor = kiln.load(optimized, variant, threads=2)
        q = predictor.predict(queries, is_query=True)
        d = predictor.predict(documents)
        vector_diff = max(float(np.abs(a - pylate[f"q{i}"]).max()) for i, a in enumerate(q))
        vector_diff = max(vector_diff, *(float(np.abs(a - pylate[f"d{i}"]).max()) for i, a in enumerate(d)))
        from kiln.scoring import maxsim

        scores = np.stack([maxsim(query, d) for query in q])
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            predictor.predict(documents)
            best = min(best, time.perf_counter() - start)
        result[variant] = {"max_vector_diff_vs_pylate": vector_diff,
                           "max_score_diff_vs_pylate": float(np.abs(scores - pylate["scores"]).max()),
                           "max_score_diff_vs_pylate_padded_batch":
                               float(np.abs(scores - pylate["scores_padded"]).max()),
                           "documents_per_s": len(documents) / best}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
