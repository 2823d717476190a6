"""A task's export part: how its model is loaded and becomes a graph.

Each task folder's ``export`` module subclasses :class:`TaskExport`, and the task's spec names it
(``TaskSpec.export``). It says which transformers Auto class loads the model, the settings read from the model
directory, the module exported (the model with a head stored beside it, a decoder's step graph), the graph's
outputs and which carry a sequence axis, and which variants kiln optimize builds and how the graph is fused. It
imports nothing of the task's runtime or validation: loading and export read it alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kiln.data.texts import parity_texts

# TaskExport.fusion of the tasks whose onnx-fused graph is kiln's own decoder step graph (kiln.exporting.fused_decoder).
DECODER_FUSION = "decoder"


def batch_pad_id(tokenizer: Any, config: Any) -> int:
    """The id batches are padded with: the tokenizer's, else the model's (a decoder's may be its end-of-text)."""
    for value in (tokenizer.pad_token_id, config.pad_token_id, config.eos_token_id):
        if isinstance(value, int):
            return value
    return 0


class TaskExport:
    """Base of every task's export part: class attributes and class methods only."""

    auto_class: ClassVar[str]  # the transformers Auto class that loads a model with this task's head
    output_names: ClassVar[tuple[str, ...]]
    sequence_outputs: ClassVar[frozenset[str]]  # outputs with a sequence axis (dynamic axes for export)
    needs_trained_head: ClassVar[bool] = True  # refuse a checkpoint whose head weights are missing
    # Weight-only int8 (openvino-int8-weights) built by default: it pays where each step reads every weight for
    # little compute (decoding); an encoder's batches are compute-bound.
    weight_only_int8_pays: ClassVar[bool] = False
    # The variants kiln optimize builds for this task (None: every variant of the target); ``fusion``: how its
    # onnx-fused graph is made (kiln.optimizing.variants.FUSIONS), the graph dynamic int8 quantizes.
    variants: ClassVar[tuple[str, ...] | None] = None
    fusion: ClassVar[str] = "bert"
    # What the exported graph computes from the model's outputs (kiln.model.heads): the model's own outputs by
    # default; a task that pools inside the graph names its head (sparse embeddings: one vocabulary-sized vector
    # per text instead of one per token).
    graph_head: ClassVar[str] = "outputs"

    @classmethod
    def pad_id(cls, tokenizer: Any, config: Any) -> int:
        """The id this task's batches are padded with (:func:`batch_pad_id` unless the task needs another)."""
        return batch_pad_id(tokenizer, config)

    @classmethod
    def auto_class_for(cls, config: Mapping[str, Any]) -> str:
        """The Auto class that loads the checkpoint whose config.json is ``config`` (a causal reranker is stored as
        a language model, not a sequence classifier)."""
        return cls.auto_class

    @classmethod
    def prepare_loaded(cls, hf_model: Any, decoder: bool) -> None:
        """Settle the loaded transformers model before export (in place)."""
        if decoder and hf_model.config.pad_token_id is None:
            # GPT-2 has no padding token; its sequence classifier finds each row's last token by the pad id, so
            # batches are padded with end-of-text, as transformers' documentation does it.
            hf_model.config.pad_token_id = hf_model.config.eos_token_id

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path, tokenizer: Any) -> Any:
        """The module the task runs and exports: the transformers model itself, or with modules stored beside it
        (a ColBERT checkpoint's Dense projections), or a head made of its own (a causal reranker's yes/no row)."""
        return hf_model

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        """Extra TaskConfig fields read from the model directory, its config and its loaded (transformers)
        tokenizer (pooling, labels, special token ids)."""
        return {}

    @classmethod
    def graph(cls, source: Any, example: tuple[Any, ...]) -> Any:
        """The export graph when it is not the model's forward pass (a decoder's step with a KV cache): an object
        with ``module``, ``example`` and ``axes``; None exports the task module over ``example`` (the default)."""
        return None

    @classmethod
    def parity_inputs(cls) -> list[Any]:
        """Real inputs from one word to past the model's maximum, for export parity."""
        return parity_texts()


class GenerativeExport(TaskExport):
    """What the export parts of generative tasks (kiln.tasks.generative) share."""

    # Weight-only int8 pays where each decoding step reads every weight for little compute.
    weight_only_int8_pays = True

    @classmethod
    def prepare_loaded(cls, hf_model: Any, decoder: bool) -> None:
        """Nothing: generation left-pads each batch itself and stops on the model's own end-of-text ids."""
