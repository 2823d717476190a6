"""Rank agreement of a real cross-encoder's variants: MiniLM fine-tuned to rerank, then kiln optimize on it.

No cross-encoder ships offline, so one is made: the bundled all-MiniLM-L6-v2 with a one-logit head, trained for one
epoch (binary cross-entropy) to tell, for a paragraph's first sentence of the Python reference manual (the query),
the rest of that paragraph (relevant) from the rest of three other paragraphs (not relevant), on the calibration
half of the manual. The eval file holds the held-out half: each query with its own paragraph and 9 others
(relevance 1 / 0). kiln optimize then builds every default CPU variant, judges each by Kendall tau and top-3
overlap per query against the fine-tuned PyTorch model, and scores NDCG@10 and MRR with the eval file.

    python benchmarks/rerank_minilm.py [--out benchmarks/rerank.minilm.json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers

from kiln.data import corpus
from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.source.loading import bundled_model_dir

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

CACHE = Path(__file__).resolve().parent.parent / ".kiln-cache" / "rerank-minilm"


def queries(split: str) -> list[tuple[str, str]]:
    """(first sentence, the rest) of every paragraph with at least two sentences."""
    out = []
    for paragraph in corpus.paragraphs(split):  # type: ignore[arg-type]
        sentences = corpus.split_sentences(paragraph)
        if len(sentences) >= 2:
            out.append((sentences[0], " ".join(sentences[1:])))
    return out


def train_cross_encoder(directory: Path, seed: int = 0) -> Path:
    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(seed)
    rng = random.Random(seed)
    source = bundled_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
    pairs = queries("calibration")
    rows = []
    for i, (query, passage) in enumerate(pairs):
        rows.append((query, passage, 1.0))
        for j in rng.sample([k for k in range(len(pairs)) if k != i], 3):
            rows.append((query, pairs[j][1], 0.0))
    rng.shuffle(rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    model.train()
    start = time.perf_counter()
    for b in range(0, len(rows), 16):
        batch = rows[b : b + 16]
        encoded = tokenizer([r[0] for r in batch], [r[1] for r in batch], padding=True, truncation=True,
                            max_length=128, return_tensors="pt")
        logits = model(**encoded).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([r[2] for r in batch]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if b // 16 % 20 == 0:
            print(f"step {b // 16}/{len(rows) // 16} loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    model.eval()
    staging = Path(tempfile.mkdtemp(dir=directory.parent))
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    staging.rename(directory)
    return directory


def eval_file(path: Path, seed: int = 1) -> Path:
    rng = random.Random(seed)
    pairs = queries("held-out")[:60]
    rows = []
    for i, (query, passage) in enumerate(pairs):
        candidates = [(passage, 1)] + [(pairs[j][1], 0) for j in rng.sample([k for k in range(len(pairs)) if k != i],
                                                                           9)]
        rng.shuffle(candidates)
        rows += [{"query": query, "text": text, "relevance": relevance} for text, relevance in candidates]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", "--out", dest="out", type=Path, default=OUT / "rerank_minilm.json")
    parser.add_argument("--artifact", type=Path, default=Path("rerank-out"))
    args = parser.parse_args()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    model = train_cross_encoder(CACHE)
    with tempfile.TemporaryDirectory() as scratch:
        qrels = eval_file(Path(scratch) / "qrels.jsonl")
        summary = OptimizeJob(OptimizeConfig(model=str(model), task="text-ranking", output=args.artifact,
                                             eval_file=qrels, overwrite=True), print).run()
    rows = {}
    for o in summary.outcomes:
        rows[o.name] = {"status": o.status, "reason": o.reason,
                        "agreement": dict(o.agreement.figures) if o.agreement else None,
                        "metric": o.metric, "ms_per_sequence": o.timing.ms_per_sequence if o.timing else None}
    result = {"model": "all-MiniLM-L6-v2 + 1-logit head, 1 epoch on the reference manual's calibration half",
              "reference_metric": summary.reference_metric, "pytorch_ms_per_sequence":
              summary.reference_timing.ms_per_sequence, "best": summary.best, "variants": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
