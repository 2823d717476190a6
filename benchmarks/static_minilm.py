"""A static student of the bundled MiniLM against the teacher's best kiln variant: quality and end-to-end speed.

    python benchmarks/static_minilm.py kiln-out/best [--static DIR] [--out benchmarks/static.minilm.json]

Distils the static model (kiln distill --static's recipe) into DIR unless it is there, then measures on the same
machine, in the same run:
- STS Spearman on kiln's built-in STS pairs, for the teacher (the artifact's best variant) and the static model;
- agreement with the teacher: Spearman of the pairwise cosines of 300 held-out documentation sentences (the two
  live in different spaces, so their vectors are not compared directly), and recall@10 of the teacher's
  neighbours (100 held-out queries among ~980 sentences);
- texts per second end to end (tokenization included) over the ~1,080 held-out sentences, best of --rounds (10):
  the teacher's best variant through kiln's predictor, the static model in numpy (a table lookup and a mean), and
  the static model's kiln artifact (DIR/artifact, the ``static`` engine) through kiln's predictor.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def _best_of(runs: int, work) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="kiln optimize output of the bundled MiniLM (its best/)")
    parser.add_argument("--static", type=Path, default=Path("/tmp/minilm-static"))
    parser.add_argument("--json", "--out", dest="out", type=Path, default=OUT / "static_minilm.json")
    parser.add_argument("--rounds", type=int, default=10, help="passes over the texts per model; the best counts "
                        "(a static pass takes ~30 ms, so a few would measure the machine's noise)")
    parser.add_argument("--model2vec", type=Path, default=None,
                        help="model2vec's own distillation of the same teacher (StaticModel.save_pretrained), "
                        "loaded with sentence-transformers' StaticEmbedding.load, measured the same way")
    args = parser.parse_args()

    import kiln
    from kiln.compress.static import StaticConfig, StaticModel, distill_static
    from kiln.scoring import spearman
    from kiln.system.cpu import cpu_info
    from kiln.tasks.feature_extraction.task import FeatureExtraction
    from kiln.validation.stored_vectors import _top, retrieval_corpus

    distilled = None
    if not (args.static / "model.safetensors").is_file():
        distilled = distill_static(StaticConfig(None, args.static), print)
        print(f"distilled in {distilled.seconds:.1f} s")
    from kiln.artifact.directory import Artifact

    teacher = kiln.load(args.artifact)
    variant = Artifact.open(args.artifact).variant_name()
    sts = FeatureExtraction.validation.builtin_eval()
    left, right = [a for a, _ in sts.inputs], [b for _, b in sts.inputs]

    def sts_spearman(embed) -> float:
        return float(spearman((_unit(embed(left)) * _unit(embed(right))).sum(1), sts.labels))

    def teacher_embed(texts):
        return np.stack(teacher.predict(texts))

    static = StaticModel(args.static)  # loaded once, as the teacher is

    def static_embed(texts):
        return static.encode(texts)

    texts = retrieval_corpus()
    t_vec = _unit(teacher_embed(texts))
    upper = np.triu_indices(300, k=1)
    truth = _top(t_vec[:100] @ t_vec[100:].T, 10)

    def against_teacher(embed) -> tuple[float, float]:
        """(pairwise-cosine Spearman on 300 sentences, recall@10 of the teacher's neighbours)."""
        vec = _unit(embed(texts))
        agreement = float(spearman((t_vec[:300] @ t_vec[:300].T)[upper], (vec[:300] @ vec[:300].T)[upper]))
        found = _top(vec[:100] @ vec[100:].T, 10)
        return agreement, float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))

    agreement, recall = against_teacher(static_embed)
    teacher_s = _best_of(args.rounds, lambda: teacher_embed(texts))
    static_s = _best_of(args.rounds, lambda: static_embed(texts))
    served = kiln.load(args.static / "artifact")  # the kiln artifact kiln distill --static writes beside the model
    artifact_s = _best_of(args.rounds, lambda: served.predict(texts))
    tokenizer_s = _best_of(args.rounds, lambda: served.prepare(texts))  # its share of the artifact's time
    result = {
        "cpu": cpu_info().to_dict(),
        "teacher": {"artifact": str(args.artifact), "variant": variant, "sts_spearman": sts_spearman(
            teacher_embed), "texts_per_s": len(texts) / teacher_s},
        "static": {"dir": str(args.static), "sts_spearman": sts_spearman(static_embed),
                   "texts_per_s": len(texts) / static_s, "pairwise_cosine_spearman_vs_teacher": agreement,
                   "recall_at_10_of_teacher_neighbours": recall,
                   "distill_seconds": distilled.seconds if distilled else None,
                   "artifact_texts_per_s": len(texts) / artifact_s,
                   "artifact_tokenization_share": tokenizer_s / artifact_s},
        "speedup": teacher_s / static_s, "artifact_speedup": teacher_s / artifact_s, "texts": len(texts),
        "rounds": args.rounds,
    }
    if args.model2vec is not None:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import StaticEmbedding

        m2v = SentenceTransformer(modules=[StaticEmbedding.load(str(args.model2vec))], device="cpu")

        def m2v_embed(texts):
            return m2v.encode(texts, batch_size=256)

        m2v_agreement, m2v_recall = against_teacher(m2v_embed)
        result["model2vec"] = {"dir": str(args.model2vec), "sts_spearman": sts_spearman(m2v_embed),
                               "pairwise_cosine_spearman_vs_teacher": m2v_agreement,
                               "recall_at_10_of_teacher_neighbours": m2v_recall}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
