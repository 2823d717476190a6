"""ONNX export with dynamic batch and sequence axes (TorchScript-based exporter), any model size."""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from pathlib import Path

import torch

from kiln.choices import ExternalData
from kiln.errors import UsageError
from kiln.model.module import TaskModule

DEFAULT_OPSET = 17
PROTOBUF_LIMIT = 2 * 1024**3  # a single ONNX protobuf cannot exceed 2 GB
EXTERNAL_DATA_SUFFIX = ".data"


def export_onnx(
    module: TaskModule,
    example: tuple[torch.Tensor, ...],
    path: Path,
    *,
    sequence_outputs: frozenset[str],
    opset: int = DEFAULT_OPSET,
    external_data: ExternalData = ExternalData.AUTO,
    axes: dict[str, dict[int, str]] | None = None,
    fold_constants: bool = True,
) -> list[Path]:
    """Export ``module`` to ``path``; returns the files written (the model, and its weights file if any).

    The exporter writes to a file in a scratch directory beside ``path``, never to memory: past protobuf's
    2 GB limit it can only write weights as external files (one per tensor), which are then gathered into
    one ``model.onnx.data``. The legacy exporter (``dynamo=False``) with eager attention yields the attention
    pattern that ONNX Runtime's transformer fusions recognise; the dynamo exporter's SDPA graph is not fused.
    """
    if axes is None:  # every input, and the outputs the task spec says are per token, have batch and sequence axes
        axes = {name: {0: "batch", 1: "sequence"} for name in (*module.input_names, *sequence_outputs)}
        axes.update({name: {0: "batch"} for name in module.output_names if name not in sequence_outputs})
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=path.parent) as scratch:
        raw = Path(scratch) / "model.onnx"
        with warnings.catch_warnings():
            # The tracer warns about every Python-level shape check in transformers' code; the parity check
            # that follows every export is what actually proves the graph is shape-independent.
            warnings.simplefilter("ignore")
            # Traced without autograd: the same graph, byte for byte, and GPT-2 small's export peaked 110 MB lower
            # (2.86 GB against 2.97 in a process of its own; the export is the largest step of a decoder's optimize).
            with torch.no_grad():
                torch.onnx.export(
                    module, example, str(raw), dynamo=False, opset_version=opset,
                    input_names=list(module.input_names), output_names=list(module.output_names),
                    dynamic_axes=axes, do_constant_folding=fold_constants,
                )
        written = [p for p in Path(scratch).iterdir() if p.is_file()]
        size = sum(p.stat().st_size for p in written)
        if external_data is ExternalData.NEVER and size > PROTOBUF_LIMIT:
            raise UsageError(f"external_data never: the model is {size / 1024**3:.2f} GB, over protobuf's 2 GB "
                             "limit for one ONNX file; use --external-data auto or always")
        over = size > PROTOBUF_LIMIT
        external = external_data is ExternalData.ALWAYS or (external_data is ExternalData.AUTO and over)
        if not external and written == [raw]:
            raw.replace(path)
            return [path]
        return _rewrite(raw, path, external)


def _rewrite(raw: Path, path: Path, external: bool) -> list[Path]:
    """Save ``raw`` (and any per-tensor files beside it) as ``path``, weights in one side file when ``external``."""
    import onnx

    if external:
        return _gather(raw, path)
    model = onnx.load(str(raw), load_external_data=True)
    onnx.save_model(model, str(path))
    return [path]


def _gather(raw: Path, path: Path) -> list[Path]:
    """The exporter's per-tensor weight files (and any initializers still inside the graph) streamed into one
    ``model.onnx.data`` beside ``path``, one tensor at a time: loading a 2.7B-parameter graph's weights whole to save
    them again held another 10.6 GB beside the exporter's (GPT-Neo 2.7B, benchmarks/neo_2b7.py). Constant nodes'
    values stay in the graph (ONNX Runtime's shape inference reads them there)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(raw), load_external_data=False)
    data_name = path.name + EXTERNAL_DATA_SUFFIX
    tensors = _tensors(model.graph)
    # Each exporter file is deleted once its last tensor is copied, so the disk holds the weights about once (plus
    # one tensor), not twice: a 2.2 GB test model once filled CI's disk mid-copy.
    readers = Counter(_location(t) for t, _ in tensors if uses_external_data(t))
    with open(path.parent / data_name, "wb") as data:
        for tensor, inline in tensors:
            if uses_external_data(tensor):
                payload = _read_external(raw.parent, tensor)
                location = _location(tensor)
                readers[location] -= 1
                if not readers[location]:
                    (raw.parent / location).unlink()
            elif tensor.HasField("raw_data") and not inline:
                payload = tensor.raw_data
            else:
                continue  # typed fields, or a constant already inline
            del tensor.external_data[:]
            tensor.ClearField("raw_data")
            if inline:
                tensor.raw_data = payload
                tensor.data_location = onnx.TensorProto.DEFAULT
                continue
            offset = data.tell()
            data.write(payload)
            data.write(b"\0" * (-len(payload) % 4096))  # page-aligned, as onnx's own writer may memory-map them
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(payload)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(model, str(path))
    return [path, path.parent / data_name]


def _location(tensor) -> str:
    from onnx.external_data_helper import ExternalDataInfo

    return ExternalDataInfo(tensor).location


def _read_external(directory: Path, tensor) -> bytes:
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    with open(directory / info.location, "rb") as source:
        source.seek(info.offset or 0)
        return source.read(info.length) if info.length else source.read()


def _tensors(graph) -> list:
    """(tensor, stays inline) for every tensor of ``graph`` that can hold weights: initializers go to the side
    file, Constant nodes' values stay in the graph; subgraphs too."""
    found = [(t, False) for t in graph.initializer]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                found.append((attribute.t, True))
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                found += _tensors(sub)
    return found
