"""text-ranking's export part: a cross-encoder's logits, and which of them means relevant."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.data.texts import builtin_pairs, builtin_sentences
from kiln.errors import UnsupportedModelError
from kiln.tasks.export import TaskExport, batch_pad_id
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank import causal
from kiln.tasks.text_classification.export import TextClassificationExport

RELEVANT_NAMES = ("relevant", "positive", "entailment", "yes", "true", "label_1", "1")


def relevant_index(id2label: Mapping[int, str]) -> int:
    """Which logit means "relevant": the only one, or the label with a relevant name, else the second."""
    if len(id2label) <= 1:
        return 0
    if len(id2label) > 2:
        raise UnsupportedModelError(f"a reranker has one logit or two (relevant or not); this model has "
                                    f"{len(id2label)} labels: {', '.join(id2label.values())}")
    named = [i for i, name in id2label.items() if str(name).lower() in RELEVANT_NAMES]
    return named[0] if len(named) == 1 else 1


class RerankExport(TaskExport):
    auto_class = TextClassificationExport.auto_class
    output_names = ("logits",)
    sequence_outputs = frozenset()

    @classmethod
    def auto_class_for(cls, config: Mapping[str, Any]) -> str:
        return "AutoModelForCausalLM" if causal.is_causal(config) else cls.auto_class

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        if causal.is_causal(hf_config.to_dict()):
            return causal.settings(model_dir, tokenizer)
        found = TextClassificationExport.settings(model_dir, hf_config, tokenizer)
        relevant_index(found["id2label"])  # refuse a many-label classifier at load time
        return found

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path, tokenizer: Any) -> Any:
        if not causal.is_causal(hf_model.config.to_dict()):
            return hf_model
        return causal.as_classifier(hf_model, causal.answer_ids(tokenizer, str(model_dir)),
                                    batch_pad_id(tokenizer, hf_model.config))

    @classmethod
    def parity_inputs(cls) -> list[Any]:
        return [RerankQuery(a, (b, a, *builtin_sentences()[i : i + 2])) for i, (a, b) in enumerate(builtin_pairs(8))]
