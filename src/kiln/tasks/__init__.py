"""The task registry: a task name -> its spec. A task is one folder, ``kiln/tasks/<name>/``: ``task.py`` holds its
compute (a :class:`TaskSpec`) and ``wire.py`` its wire part (found by kiln.tasks.wire by that name). Adding a task is
that folder and one line here."""

from __future__ import annotations

from enum import Enum

from kiln.errors import UsageError
from kiln.records.task import TaskConfig
from kiln.runtime.features import Prepared
from kiln.tasks.base import TaskSpec
from kiln.tasks.export import DECODER_FUSION, TaskExport
from kiln.tasks.feature_extraction.task import FeatureExtraction
from kiln.tasks.hybrid_embedding.task import HybridEmbedding, HybridVectors
from kiln.tasks.inputs import QAInput, RerankQuery, TextPair
from kiln.tasks.multi_vector.task import MultiVector
from kiln.tasks.question_answering.task import Answer, QuestionAnswering
from kiln.tasks.rerank.task import Ranked, Rerank
from kiln.tasks.sparse_embedding.task import SparseEmbedding, SparseVector
from kiln.tasks.text_classification.task import LabelScore, TextClassification
from kiln.tasks.text_generation.task import TextGeneration
from kiln.tasks.token_classification.task import Entity, TokenClassification

TASKS: dict[str, type[TaskSpec]] = {spec.name: spec for spec in (
    FeatureExtraction,
    TextClassification,
    TokenClassification,
    QuestionAnswering,
    Rerank,
    SparseEmbedding,
    MultiVector,
    HybridEmbedding,
    TextGeneration,
)}
DEFAULT_TASK = FeatureExtraction.name  # what the bundled sentence-embedding model does

# The CLI's choices, generated from the registry: TaskName.TEXT_CLASSIFICATION == "text-classification".
TaskName = Enum("TaskName", {name.upper().replace("-", "_"): name for name in TASKS}, type=str)  # type: ignore[misc]


def task_spec(name: str | Enum) -> type[TaskSpec]:
    """The spec registered for ``name``, or a UsageError listing the tasks there are."""
    key = name.value if isinstance(name, Enum) else str(name)
    if key not in TASKS:
        raise UsageError(f"task must be one of: {', '.join(TASKS)} (got {key!r})")
    return TASKS[key]


# The tasks whose onnx-fused graph is kiln's own decoder step graph (for --format onnx-fused's help and errors).
FUSED_DECODER_TASKS = tuple(name for name, spec in TASKS.items() if spec.export.fusion == DECODER_FUSION)


def task_handler(config: TaskConfig) -> TaskSpec:
    """The task's per-call instance for one model's settings."""
    return task_spec(config.task)(config)


__all__ = ["DECODER_FUSION", "DEFAULT_TASK", "FUSED_DECODER_TASKS", "TASKS", "Answer", "Entity", "HybridVectors",
           "LabelScore", "Prepared", "QAInput", "Ranked", "RerankQuery", "SparseVector", "TaskConfig", "TaskExport",
           "TaskName", "TaskSpec", "TextPair", "task_handler", "task_spec"]
