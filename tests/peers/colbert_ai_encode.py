"""Run inside the original ColBERT's own venv (make colbert-ai): encode queries and documents with colbert-ai's
Checkpoint, score them with its colbert_score.

    python colbert_ai_encode.py CHECKPOINT_DIR IN.json OUT.npz

IN.json: {"queries": [...], "documents": [...]}. OUT.npz: per query q{i} its token vectors (queryFromText: every
position up to query_maxlen, [MASK]-expanded), per document d{i} (docFromText with keep_dims=False: the kept tokens,
punctuation and padding dropped), and "scores" (queries x documents: colbert_score, MaxSim).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from colbert.infra import ColBERTConfig
from colbert.modeling.checkpoint import Checkpoint
from colbert.modeling.colbert import ColBERT, colbert_score


def main() -> None:
    checkpoint_dir, given, out = sys.argv[1:4]
    data = json.loads(open(given, encoding="utf-8").read())
    # ColBERT's constructor compiles its segmented_maxsim C++ kernel with g++ (torch.utils.cpp_extension), which only
    # colbert_score_packed calls; colbert_score, compared here, is plain torch. Marked loaded, the compile is skipped:
    # on a fresh clone it was most of this script's 136 s in CI (28 s once compiled and cached).
    ColBERT.loaded_extensions = True
    checkpoint = Checkpoint(checkpoint_dir, colbert_config=ColBERTConfig(), verbose=0)
    arrays: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        queries = checkpoint.queryFromText(data["queries"])
        documents = checkpoint.docFromText(data["documents"], keep_dims=False)
    for i, q in enumerate(queries):
        arrays[f"q{i}"] = q.float().numpy()
    for i, d in enumerate(documents):
        arrays[f"d{i}"] = d.float().numpy()
    # colbert_score over the documents padded into one batch, with their mask (padding cannot win a max here)
    padded = torch.nn.utils.rnn.pad_sequence([d.float() for d in documents], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(d)) for d in documents], batch_first=True)
    config = ColBERTConfig()
    arrays["scores"] = np.stack([colbert_score(q[None].float(), padded, mask, config=config).numpy()
                                 for q in queries])
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
