"""Run inside PyLate's own venv (make pylate): encode queries and documents with PyLate's ColBERT, score them.

    python pylate_encode.py MODEL_DIR IN.json OUT.npz [MODEL_DIR OUT.npz ...] [--time]

IN.json: {"queries": [...], "documents": [...]}. OUT.npz: per query q{i} its token vectors and q{i}_ids, per
document d{i} and d{i}_ids, "scores" (queries x documents, PyLate's colbert_scores: MaxSim, each document alone) and
"scores_padded" (the same over one padded batch of documents, as PyLate ranks them). With --time,
prints {"documents_per_s": ...}: PyLate encoding the documents end to end on 2 threads, batches of 32, best of 3.
More MODEL_DIR OUT.npz pairs encode the same IN.json with other models in the same process (each process spends
seconds importing torch and sentence-transformers).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from pylate import models
from pylate.scores import colbert_scores


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--time"]
    model_dir, given, out = args[:3]
    data = json.loads(open(given, encoding="utf-8").read())
    for more_dir, more_out in zip(args[3::2], args[4::2]):
        np.savez(more_out, **encode(more_dir, data))
    model = models.ColBERT(model_name_or_path=model_dir, device="cpu")
    np.savez(out, **encode(model_dir, data, model))
    if "--time" in sys.argv[4:]:
        torch.set_num_threads(2)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            model.encode(data["documents"], is_query=False, batch_size=32)
            best = min(best, time.perf_counter() - start)
        print(json.dumps({"documents_per_s": len(data["documents"]) / best}))


def encode(model_dir: str, data: dict, model=None) -> dict[str, np.ndarray]:
    model = model or models.ColBERT(model_name_or_path=model_dir, device="cpu")
    arrays: dict[str, np.ndarray] = {}
    embedded = {}
    for kind, is_query in (("q", True), ("d", False)):
        texts = data["queries" if is_query else "documents"]
        full = model.encode(texts, is_query=is_query, output_value=None, batch_size=4)
        vectors = model.encode(texts, is_query=is_query, batch_size=4)
        embedded[kind] = [torch.as_tensor(v) for v in vectors]
        for i, v in enumerate(vectors):
            arrays[f"{kind}{i}"] = np.asarray(v, dtype=np.float32)
            kept = np.asarray(full["masks"][i]).astype(bool)
            arrays[f"{kind}{i}_ids"] = np.asarray(full["input_ids"][i])[kept]
    pad = torch.nn.utils.rnn.pad_sequence
    queries = pad(embedded["q"], batch_first=True)
    # MaxSim of each document on its own (no padding: the definition), and as PyLate scores a padded batch of
    # documents, where a padded position counts as similarity 0 (its mask multiplies the scores), so a query token
    # whose every real similarity is negative gets 0 instead of its best match.
    arrays["scores"] = torch.cat([colbert_scores(queries, d[None]) for d in embedded["d"]], dim=1).numpy()
    arrays["scores_padded"] = colbert_scores(queries, pad(embedded["d"], batch_first=True),
                                             documents_mask=pad([torch.ones(len(d)) for d in embedded["d"]],
                                                                batch_first=True)).numpy()
    return arrays


if __name__ == "__main__":
    main()
