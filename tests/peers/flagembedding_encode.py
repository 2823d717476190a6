"""Run inside PyLate's venv (make pylate, which installs FlagEmbedding 1.4.2 there): BGE-M3's three outputs and
scores with FlagEmbedding's own BGEM3FlagModel.

    python flagembedding_encode.py MODEL_DIR IN.json OUT.json

IN.json: {"queries": [...], "documents": [...]}. OUT.json: per text (queries, then documents) its dense vector, its
lexical weights ({token id: weight}) and its ColBERT vectors; and FlagEmbedding's scores of each query against each
document: dense (inner product), sparse (compute_lexical_matching_score) and colbert (colbert_score).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from FlagEmbedding import BGEM3FlagModel


def main() -> None:
    model_dir, given, out = sys.argv[1:4]
    data = json.loads(open(given, encoding="utf-8").read())
    model = BGEM3FlagModel(model_dir, use_fp16=False, devices="cpu", normalize_embeddings=True)
    texts = data["queries"] + data["documents"]
    # cut where kiln cuts, at the tokenizer's maximum (FlagEmbedding's own default is 512, BGE-M3's 8192); past the
    # model's positions its encode fails and retries smaller batches down to an empty one
    found = model.encode(texts, batch_size=4, max_length=model.tokenizer.model_max_length, return_dense=True,
                         return_sparse=True, return_colbert_vecs=True)
    nq = len(data["queries"])
    scores = {"dense": [], "sparse": [], "colbert": []}
    for q in range(nq):
        for d in range(nq, len(texts)):
            scores["dense"].append(float(np.dot(found["dense_vecs"][q], found["dense_vecs"][d])))
            scores["sparse"].append(float(model.compute_lexical_matching_score(found["lexical_weights"][q],
                                                                               found["lexical_weights"][d])))
            scores["colbert"].append(float(model.colbert_score(found["colbert_vecs"][q], found["colbert_vecs"][d])))
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"dense": np.asarray(found["dense_vecs"], dtype=np.float64).tolist(),
                   "sparse": [{str(k): float(v) for k, v in w.items()} for w in found["lexical_weights"]],
                   "multi": [np.asarray(v, dtype=np.float64).tolist() for v in found["colbert_vecs"]],
                   "scores": scores}, f)


if __name__ == "__main__":
    main()
