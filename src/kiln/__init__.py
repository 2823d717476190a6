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


# Loaded on first use: these import torch and transformers, so `import kiln` (and serving an ONNX or OpenVINO
# artifact) stays free of both. name -> (module, attribute).
_LAZY = {
    "hf_model": ("kiln.integrations.transformers", "hf_model"),
    "hf_tokenizer": ("kiln.integrations.transformers", "hf_tokenizer"),
    "pipeline": ("kiln.integrations.transformers", "pipeline"),
    # Building artifacts: the functions the CLI's commands are made of. optimize, export and bench are packages
    # made callable (kiln.system.modules): the package is returned, and calling it runs the function.
    "optimize": ("kiln", "optimize"),
    "export": ("kiln", "export"),
    "bench": ("kiln", "bench"),
    "distill": ("kiln.compress.distill", "distill"),
    "prune": ("kiln.compress.prune", "prune"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        if module == "kiln":  # a callable package: importing it binds it on this module
            return importlib.import_module(f"kiln.{attribute}")
        return getattr(importlib.import_module(module), attribute)
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
    "bench",
    "create_engine",
    "distill",
    "export",
    "hf_model",
    "hf_tokenizer",
    "load",
    "optimize",
    "pipeline",
    "prune",
]
