"""ONNX export with dynamic batch and sequence axes (TorchScript-based exporter)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from kiln.choices import ExternalData
from kiln.export.wrapper import TaskModule

DEFAULT_OPSET = 17
PROTOBUF_LIMIT = 2 * 1024**3  # a single ONNX protobuf cannot exceed 2 GB
EXTERNAL_DATA_SUFFIX = ".data"


def export_onnx(
    module: TaskModule,
    example: tuple[torch.Tensor, ...],
    path: Path,
    *,
    opset: int = DEFAULT_OPSET,
    external_data: ExternalData = ExternalData.AUTO,
) -> list[Path]:
    """Export ``module`` to ``path``; returns the files written (the model, and its weights file if any).

    The legacy exporter (``dynamo=False``) with eager attention yields the attention pattern that ONNX
    Runtime's transformer fusions recognise; the dynamo exporter's SDPA graph is not fused.
    """
    import onnx

    axes = {name: {0: "batch", 1: "sequence"} for name in (*module.input_names, *module.output_names)}
    for name in module.output_names:
        if name in ("logits",) and _is_sequence_level(module):
            axes[name] = {0: "batch"}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The tracer warns about every Python-level shape check in transformers' code; the parity check
        # that follows every export is what actually proves the graph is shape-independent.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, example, buffer, dynamo=False, opset_version=opset,
            input_names=list(module.input_names), output_names=list(module.output_names),
            dynamic_axes=axes, do_constant_folding=True,
        )
    model = onnx.load_from_string(buffer.getvalue())
    size = model.ByteSize()
    external = external_data is ExternalData.ALWAYS or (external_data is ExternalData.AUTO and size > PROTOBUF_LIMIT)
    if external:
        data_name = path.name + EXTERNAL_DATA_SUFFIX
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=0)
        return [path, path.parent / data_name]
    onnx.save_model(model, str(path))
    return [path]


def _is_sequence_level(module: TaskModule) -> bool:
    """Sequence classification logits have no sequence axis; token classification logits do."""
    return type(module.model).__name__.endswith("ForSequenceClassification")
