"""A static-embedding table as an engine (kiln distill --static): each token's row, no network at all.

The task's own mean pooling over the attention mask then makes a text's vector: the mean of its tokens' rows, as
sentence-transformers' StaticEmbedding (an EmbeddingBag) computes it, since the artifact's tokenizer adds no
special tokens. numpy only: one gather per batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.errors import ArtifactError


class StaticEngine:
    name = "static"
    input_names = ("input_ids", "attention_mask")
    output_names = ("last_hidden_state",)
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

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"last_hidden_state": self.table[inputs["input_ids"]]}

    def warmup(self) -> None:
        self.run({"input_ids": np.zeros((1, 1), dtype=np.int64)})
