"""kiln: turn a Hugging Face encoder into a fast, small, verified inference artifact, then serve it."""

from __future__ import annotations

from kiln.artifact import Artifact, load
from kiln.choices import Aggregation, ExportFormat, Pooling, Precision, TaskName
from kiln.engines import ENGINES, Engine, EngineOptions, create_engine
from kiln.errors import (
    ArtifactError,
    KilnError,
    ModelLoadError,
    ParityError,
    UnsupportedModelError,
    UsageError,
)
from kiln.runtime import Predictor
from kiln.taskconfig import TaskConfig
from kiln.tasks import Answer, Entity, LabelScore, QAInput

__version__ = "0.1.0"

__all__ = [
    "ENGINES",
    "Aggregation",
    "Answer",
    "Artifact",
    "ArtifactError",
    "Engine",
    "EngineOptions",
    "Entity",
    "ExportFormat",
    "KilnError",
    "LabelScore",
    "ModelLoadError",
    "ParityError",
    "Pooling",
    "Precision",
    "Predictor",
    "QAInput",
    "TaskConfig",
    "TaskName",
    "UnsupportedModelError",
    "UsageError",
    "create_engine",
    "load",
]
