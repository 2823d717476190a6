"""question-answering's export part: start and end logits per token."""

from __future__ import annotations

from typing import Any

from kiln.data.texts import builtin_sentences, joined
from kiln.tasks.export import TaskExport
from kiln.tasks.inputs import QAInput


class QuestionAnsweringExport(TaskExport):
    auto_class = "AutoModelForQuestionAnswering"
    output_names = ("start_logits", "end_logits")
    sequence_outputs = frozenset(output_names)

    @classmethod
    def parity_inputs(cls) -> list[Any]:
        """Question/context pairs; the longer contexts need several doc-stride windows."""
        sentences = builtin_sentences()
        return [QAInput(sentences[i], joined(i * 3, 1 + i)) for i in range(2, 14, 2)]
