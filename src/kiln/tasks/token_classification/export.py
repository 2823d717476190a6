"""token-classification's export part: the token classifier's logits per token, its labels from the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.tasks.export import TaskExport


class TokenClassificationExport(TaskExport):
    auto_class = "AutoModelForTokenClassification"
    output_names = ("logits",)
    sequence_outputs = frozenset(output_names)

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        return {"id2label": {int(k): str(v) for k, v in (hf_config.id2label or {}).items()}}
