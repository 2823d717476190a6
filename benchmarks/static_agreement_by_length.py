"""Why a static student's pairwise-similarity Spearman depends on the texts: by token length, against its teacher.

    python benchmarks/static_agreement_by_length.py /tmp/minilm-static2/artifact

The bundled MiniLM (PyTorch fp32) against the static artifact on kiln optimize's 128 agreement texts (all, the
shorter half, the longer half) and on 300 held-out documentation sentences (what benchmarks/static_minilm.py uses).
"""

from __future__ import annotations

import sys

import numpy as np

import kiln
from kiln.model.reference import reference_predictor
from kiln.model.source import load_source
from kiln.tasks import task_spec
from kiln.validation.metrics import spearman
from kiln.validation.stored_vectors import retrieval_corpus


def main() -> None:
    reference = reference_predictor(load_source(None, "feature-extraction"))
    static = kiln.load(sys.argv[1])

    def unit(x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def pairwise(texts: list[str]) -> float:
        a, b = unit(reference.predict(texts)), unit(static.predict(texts))
        upper = np.triu_indices(len(texts), 1)
        return spearman((a @ a.T)[upper], (b @ b.T)[upper])

    def tokens(texts: list[str]) -> np.ndarray:
        return np.array([len(e.ids) for e in reference.encoder.encode(texts)])

    texts = task_spec("feature-extraction").agreement_inputs(reference.encoder)
    lengths = tokens(texts)
    order = np.argsort(lengths, kind="stable")
    half = len(texts) // 2
    print(f"agreement texts: {len(texts)}, tokens median {np.median(lengths):g} (min {lengths.min()}, max "
          f"{lengths.max()})")
    print(f"  all {pairwise(texts):.4f}; shorter half {pairwise([texts[i] for i in order[:half]]):.4f}; longer half "
          f"{pairwise([texts[i] for i in order[half:]]):.4f}")
    held = retrieval_corpus()[:300]
    print(f"held-out sentences: 300, tokens median {np.median(tokens(held)):g}: {pairwise(held):.4f}")


if __name__ == "__main__":
    main()
