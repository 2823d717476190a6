"""The task registry: one handler per task name."""

from __future__ import annotations

from collections.abc import Callable

from kiln.choices import TaskName
from kiln.taskconfig import TaskConfig
from kiln.tasks.base import Prepared, TaskHandler
from kiln.tasks.feature_extraction import FeatureExtraction
from kiln.tasks.question_answering import Answer, QAInput, QuestionAnswering
from kiln.tasks.text_classification import LabelScore, TextClassification
from kiln.tasks.token_classification import Entity, TokenClassification

TASKS: dict[TaskName, Callable[[TaskConfig], TaskHandler]] = {
    TaskName.FEATURE_EXTRACTION: FeatureExtraction,
    TaskName.TEXT_CLASSIFICATION: TextClassification,
    TaskName.TOKEN_CLASSIFICATION: TokenClassification,
    TaskName.QUESTION_ANSWERING: QuestionAnswering,
}


def task_handler(config: TaskConfig) -> TaskHandler:
    return TASKS[config.task](config)


__all__ = ["TASKS", "Answer", "Entity", "LabelScore", "Prepared", "QAInput", "TaskHandler", "task_handler"]
