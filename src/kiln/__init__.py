"""kiln: turn a Hugging Face encoder into a fast, small, verified inference artifact, then serve it."""

from __future__ import annotations

__version__ = "0.1.0"


# Every public name is loaded on first use: `import kiln.errors` (or reading a manifest) then runs only the modules
# it needs, not the whole package, and `import kiln` stays free of torch and transformers (serving an ONNX or
# OpenVINO artifact needs neither). name -> (module, attribute).
_LAZY = {
    "Artifact": ("kiln.artifact.directory", "Artifact"),
    "load": ("kiln.artifact.directory", "load"),
    "Aggregation": ("kiln.choices", "Aggregation"),
    "ExportFormat": ("kiln.choices", "ExportFormat"),
    "Pooling": ("kiln.choices", "Pooling"),
    "Precision": ("kiln.choices", "Precision"),
    "Generated": ("kiln.decoder.generate", "Generated"),
    "ENGINES": ("kiln.engines", "ENGINES"),
    "Engine": ("kiln.engines", "Engine"),
    "EngineOptions": ("kiln.engines", "EngineOptions"),
    "create_engine": ("kiln.engines", "create_engine"),
    **{name: ("kiln.errors", name) for name in (
        "ArtifactError", "KilnError", "ModelLoadError", "ParityError", "UnsupportedModelError", "UsageError")},
    "Predictor": ("kiln.runtime.predictor", "Predictor"),
    **{name: ("kiln.tasks", name) for name in (
        "Answer", "Entity", "LabelScore", "QAInput", "Ranked", "RerankQuery", "SparseVector", "TaskConfig",
        "TaskName", "TaskSpec", "TextPair")},
    "Chunking": ("kiln.tasks.chunking", "Chunking"),
    "hf_model": ("kiln.integrations.transformers", "hf_model"),
    "hf_tokenizer": ("kiln.integrations.transformers", "hf_tokenizer"),
    "pipeline": ("kiln.integrations.transformers", "pipeline"),
    # The functions the CLI's commands are made of (kiln.api), one per command.
    **{name: ("kiln.api.build", name) for name in ("optimize", "export", "distill", "prune")},
    **{name: ("kiln.api.measure", name) for name in ("bench", "audit")},
    **{name: ("kiln.api.deploy", name) for name in ("serve", "embed", "triton")},
    **{name: ("kiln.api.inspection", name) for name in ("info", "doctor")},
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = sorted(_LAZY)  # the public names are the table's: one list, nothing to keep in step
