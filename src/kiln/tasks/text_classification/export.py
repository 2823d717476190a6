"""text-classification's export part: the sequence classifier's logits, its labels read from the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.data.texts import builtin_pairs, parity_texts
from kiln.tasks.export import TaskExport
from kiln.tasks.inputs import TextPair


class TextClassificationExport(TaskExport):
    auto_class = "AutoModelForSequenceClassification"
    output_names = ("logits",)
    sequence_outputs = frozenset()

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        return {"id2label": {int(k): str(v) for k, v in (hf_config.id2label or {}).items()},
                "problem_type": getattr(hf_config, "problem_type", None)}

    @classmethod
    def parity_inputs(cls) -> list[Any]:
        return [*parity_texts(), *(TextPair(a, b) for a, b in builtin_pairs(8))]
