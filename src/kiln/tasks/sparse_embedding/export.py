"""sparse-embedding's export part: SPLADE's max-pooled log-saturated MLM logits, pooled inside the graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.tasks.export import TaskExport


class SparseEmbeddingExport(TaskExport):
    auto_class = "AutoModelForMaskedLM"
    graph_head = "sparse-max-pool"  # kiln.model.heads: SPLADE pooling inside the graph
    output_names = ("sparse_embedding",)
    sequence_outputs = frozenset()

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        """The special tokens' ids, from tokenizer.json (their terms are zeroed)."""
        path = model_dir / "tokenizer.json"
        added = json.loads(path.read_text()).get("added_tokens", []) if path.is_file() else []
        return {"special_ids": tuple(sorted(int(t["id"]) for t in added if t.get("special"))),
                "dimension": int(hf_config.vocab_size)}
