"""A static-embedding table as an engine (kiln distill --static): each token's row, no network at all.

It pools itself: a text's vector is the mean of its own tokens' rows (the attention mask's), as
sentence-transformers' StaticEmbedding (an EmbeddingBag) computes it, since the artifact's tokenizer adds no
special tokens. numpy only: padded positions gather an all-zero row appended to the table, and the sum over the
length axis adds each text's rows in order (then exact zeros), so a text's vector does not depend on what it is
batched with. About three times faster than either a gather of the real tokens with ``np.add.reduceat`` or the
task's masked mean pooling over a padded gather (what benchmarks/static_minilm.py's artifact figure moved with).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.errors import ArtifactError


class StaticEngine:
    name = "static"
    input_names = ("input_ids", "attention_mask")
    output_names = ("sentence_embedding",)
    providers = ("numpy",)
    is_padded = True
    pad_multiple = 1

    def __init__(self, path: Path) -> None:
        try:
            self.table = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ArtifactError(f"cannot read the static table {path}: {err}") from err
        if self.table.ndim != 2:
            raise ArtifactError(f"{path} is not a token table (shape {self.table.shape})")
        self.padding = self.table.shape[0]  # the id padded positions gather: an appended row of zeros
        self.table = np.vstack([self.table, np.zeros((1, self.table.shape[1]), dtype=self.table.dtype)])

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mask = inputs["attention_mask"].astype(bool)
        ids = np.where(mask, inputs["input_ids"], self.padding)
        sums = np.take(self.table, ids, axis=0).sum(axis=1)
        # An empty text is a zero vector, as EmbeddingBag's.
        return {"sentence_embedding": sums / np.maximum(mask.sum(axis=1), 1)[:, None].astype(np.float32)}

    def warmup(self) -> None:
        self.run({"input_ids": np.zeros((1, 1), dtype=np.int64), "attention_mask": np.ones((1, 1), dtype=np.int64)})
