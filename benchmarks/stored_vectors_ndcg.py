"""NDCG@10 of each stored size x precision on real retrieval judgements, no download: the bundled MiniLM.

The judgements come from the held-out half of Python's reference manual (the half kiln never calibrates on): each
paragraph's first sentence is a query and the rest of that paragraph its one relevant text (relevance 1); every
other paragraph's rest is in the corpus too (unlisted: relevance 0), so each query ranks all of them. kiln optimize
then measures the stored-vector table (recall@10 of the float32 neighbours, and NDCG@10 on these judgements) with
the rows as --eval (the task metric reads them as scored pairs).

    python benchmarks/stored_vectors_ndcg.py [--queries N] [--variants onnx-fp32] [-o /tmp/minilm-ndcg]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.data import corpus


def judgements(count: int | None, seed: int = 0) -> list[dict]:
    """(query, its own paragraph's rest, 1) for ``count`` held-out paragraphs, plus one (query, another rest, 0)
    each so every rest is in the corpus."""
    pairs = []
    for paragraph in corpus.paragraphs("held-out"):  # type: ignore[arg-type]
        sentences = corpus.split_sentences(paragraph)
        if len(sentences) >= 2 and len(sentences[0]) > 20:
            pairs.append((sentences[0], " ".join(sentences[1:])))
    pairs = list(dict((q, (q, t)) for q, t in pairs).values())  # one paragraph per distinct query
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:count]
    rows = [{"query": q, "text": t, "relevance": 1} for q, t in pairs]
    rests = [t for _, t in pairs]
    rows += [{"query": q, "text": rests[(i + 1) % len(rests)], "relevance": 0} for i, (q, _) in enumerate(pairs)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=None, help="default: every usable paragraph")
    parser.add_argument("--variants", default="onnx-fp32")
    parser.add_argument("--precisions", default="int8,binary")
    parser.add_argument("--matryoshka-dims", default="256,128")
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/minilm-ndcg"))
    args = parser.parse_args()
    rows = judgements(args.queries)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "judgements.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        queries, texts = len({r["query"] for r in rows}), len({r["text"] for r in rows})
        print(f"{len(rows)} rows: {queries} queries, {texts} texts", flush=True)
        subprocess.run([sys.executable, "-m", "kiln", "optimize", "--variants", args.variants, "--precisions",
                        args.precisions, "--matryoshka-dims", args.matryoshka_dims, "--eval", str(path),
                        "--retrieval-tolerance", "0.03", "-o", str(args.output), "--force"], check=True)
    summary = (args.output / "summary.md").read_text()
    print(summary[summary.index("## Stored vectors"):])


if __name__ == "__main__":
    main()
