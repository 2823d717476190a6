"""The fp32 PyTorch reference built from a loaded source model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kiln.choices import Precision
from kiln.data.texts import builtin_sentences
from kiln.engines.base import EngineOptions
from kiln.engines.torch_eager import TorchEngine
from kiln.model.module import TaskModule
from kiln.runtime.predictor import Predictor
from kiln.runtime.tokenization import TextEncoder
from kiln.source.loading import SourceModel, pad_token_id
from kiln.tasks import task_handler, task_spec


def source_encoder(source: SourceModel) -> TextEncoder:
    return TextEncoder(
        source.tokenizer.backend_tokenizer, max_length=source.task_config.max_length,
        pad_id=pad_token_id(source), input_names=source.input_names,
    )


def task_module(source: SourceModel, *, cast_inputs: bool = False) -> TaskModule:
    spec = task_spec(source.task_config.task)
    return TaskModule(source.model, source.input_names, spec.export.output_names, cast_inputs=cast_inputs,
                      head=spec.export.graph_head)


def reference_predictor(
    source: SourceModel, precision: Precision = Precision.FP32, *, batch_size: int = 32, threads: int | None = None,
    device: str = "cpu",
) -> Predictor:
    """The original in PyTorch. ``threads`` matters: torch's thread count is process-global, so without it the
    reference would run on whatever count the last torch-based variant set."""
    engine = TorchEngine(task_module(source), EngineOptions(precision=precision, intra_op_threads=threads,
                                                            device=device))
    return Predictor(task_handler(source.task_config), source_encoder(source), engine, batch_size=batch_size)


def timing_predictor(source: SourceModel, *, batch_size: int = 32, threads: int | None = None,
                     device: str = "cpu") -> Predictor:
    """The original as speed-ups are quoted against: its own forward pass, or for a task with its own graph (a
    decoder's step with a KV cache) that graph run eagerly in PyTorch, so both sides do the same work; on the
    ``device`` the variants are timed on."""
    graph = task_spec(source.task_config.task).export.graph(source, example_inputs(source))
    if graph is None:
        return reference_predictor(source, batch_size=batch_size, threads=threads, device=device)
    engine = TorchEngine(graph.module, EngineOptions(intra_op_threads=threads, device=device))
    return Predictor(task_handler(source.task_config), source_encoder(source), engine, batch_size=batch_size)


def example_inputs(source: SourceModel, *, int32: bool = False) -> tuple[torch.Tensor, ...]:
    """A padded batch of two real sentences of different lengths, for export and tracing."""
    encoder = source_encoder(source)
    sentences = builtin_sentences()
    arrays = encoder.collate(encoder.encode([sentences[4], sentences[20]]))
    dtype = torch.int32 if int32 else torch.int64
    return tuple(torch.from_numpy(arrays[n]).to(dtype) for n in source.input_names)


def set_vanilla_attention(model) -> str:
    """Switch the original to transformers' default SDPA attention where the architecture has it.

    kiln loads models with eager attention because that is what exports and fuses; speed-ups are quoted
    against the faster default so they are not inflated. Returns the implementation now in use.
    """
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError, AttributeError):  # architectures without an SDPA path stay eager
        return "eager"
    return "sdpa"


@contextmanager
def vanilla_attention(model) -> Iterator[str]:
    """:func:`set_vanilla_attention` for the duration of a block (eager again afterwards)."""
    attention = set_vanilla_attention(model)
    try:
        yield attention
    finally:
        if attention == "sdpa":
            model.set_attn_implementation("eager")
