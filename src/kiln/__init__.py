"""kiln: turn a Hugging Face encoder into a fast, small, verified inference artifact, then serve it."""

from __future__ import annotations

from kiln.artifact.directory import Artifact, load
from kiln.choices import Aggregation, ExportFormat, Pooling, Precision
from kiln.decoder.generate import Generated
from kiln.engines import ENGINES, Engine, EngineOptions, create_engine
from kiln.errors import (
    ArtifactError,
    KilnError,
    ModelLoadError,
    ParityError,
    UnsupportedModelError,
    UsageError,
)
from kiln.runtime.predictor import Predictor
from kiln.tasks import (
    Answer,
    Entity,
    LabelScore,
    QAInput,
    Ranked,
    RerankQuery,
    SparseVector,
    TaskConfig,
    TaskName,
    TaskSpec,
    TextPair,
)
from kiln.tasks.chunking import Chunking

__version__ = "0.1.0"


def __getattr__(name: str):
    """hf_model, hf_tokenizer and pipeline import torch and transformers: loaded on first use, so `import kiln`
    (and serving an ONNX or OpenVINO artifact) stays free of both."""
    if name in ("hf_model", "hf_tokenizer", "pipeline"):
        from kiln.integrations import transformers as integration

        return getattr(integration, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")

__all__ = [
    "ENGINES",
    "Aggregation",
    "Answer",
    "Artifact",
    "ArtifactError",
    "Chunking",
    "Engine",
    "EngineOptions",
    "Entity",
    "ExportFormat",
    "Generated",
    "KilnError",
    "LabelScore",
    "ModelLoadError",
    "ParityError",
    "Pooling",
    "Precision",
    "Predictor",
    "QAInput",
    "Ranked",
    "RerankQuery",
    "SparseVector",
    "TaskConfig",
    "TaskName",
    "TaskSpec",
    "TextPair",
    "UnsupportedModelError",
    "UsageError",
    "create_engine",
    "hf_model",
    "hf_tokenizer",
    "load",
    "pipeline",
]
