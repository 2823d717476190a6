"""text-generation's export part: the decoding step with its KV cache as the graph, kiln's own fused step graph
(onnx-fused), and the variants that keep generation within tolerance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.data.texts import builtin_sentences, joined
from kiln.decoder.chat import chat_template
from kiln.decoder.graph import (
    CacheShape,
    dynamic_axes,
    make_decoder_module,
    positions,
)
from kiln.decoder.stopping import eos_ids
from kiln.tasks.export import DECODER_FUSION, GenerativeExport
from kiln.tasks.files import read_json


@dataclass(frozen=True)
class Graph:
    """A task's own export graph: the torch module, example inputs, and dynamic axes by input/output name."""

    module: Any
    example: tuple[Any, ...]
    axes: dict[str, dict[int, str]]
    # The exporter's constant folding writes a transposed copy of a tied output matrix (GPT-2 small: 622 MiB of graph
    # against 475, and the export peaked at 2890 MiB against 2450); ONNX Runtime and OpenVINO fold it at load anyway.
    fold_constants: bool = True


class TextGenerationExport(GenerativeExport):
    auto_class = "AutoModelForCausalLM"
    output_names = ("logits",)
    sequence_outputs = frozenset({"logits"})
    # Dynamic int8 (ONNX Runtime, per channel) and weight-only int8 (NNCF): static activation ranges of a KV cache
    # that grows step by step are not what calibration on whole texts sees. onnx-fused is kiln's own step graph with
    # fused attention and the cache updated in place (kiln.exporting.fused_decoder); it replaces onnx-fp32 by default,
    # whose export stays as the artifact's reference and OpenVINO's source.
    variants = ("onnx-fp32", "onnx-fused", "onnx-int8-dynamic", "onnx-int4-weights", "openvino-fp32",
                "openvino-int8-weights", "openvino-int4-weights")
    fusion = DECODER_FUSION

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        eos = getattr(hf_config, "eos_token_id", None)
        generation = model_dir / "generation_config.json"
        if generation.is_file():
            eos = read_json(generation).get("eos_token_id", eos)
        return {"eos_ids": eos_ids(eos), "cache": CacheShape.of(hf_config).to_dict(), "chat": chat_template(tokenizer)}

    @classmethod
    def graph(cls, source: Any, example: tuple[Any, ...]) -> Graph:
        """The decoding step over the model; the example is a two-row batch with a 3-token past."""
        import torch

        shape = CacheShape.of(source.model.config)
        ids, mask = example[0], example[1]
        past_length = 3
        past = tuple(torch.randn(ids.shape[0], shape.heads, past_length, shape.head_size)
                     for _ in range(2 * shape.layers))
        full_mask = torch.cat([torch.ones(ids.shape[0], past_length, dtype=mask.dtype), mask], dim=1)
        position_ids = torch.from_numpy(positions(full_mask.numpy(), ids.shape[1]))
        return Graph(make_decoder_module(source.model), (ids, full_mask, position_ids, *past), dynamic_axes(shape),
                     fold_constants=False)

    @classmethod
    def parity_inputs(cls) -> list[Any]:
        """A quarter of the built-in sentences and three paragraphs (~1,500 tokens in all, the longest ~430: past
        GPT-Neo's 256-token local-attention window). Not the encoders' set, whose 1,180-token paragraph makes
        every batch of eight a 50k-vocabulary logit row per padded position: on GPT-Neo 2.7B that set ran past
        17 minutes and 22 GiB (benchmarks/neo_2b7.py)."""
        return [*builtin_sentences()[::4], joined(3, 4), joined(44, 2), joined(10, 8)]
