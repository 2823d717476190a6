"""Sentence embeddings: pooling and normalization as the model's sentence-transformers config says.

Agreement: cosine to the original per input (the gate: min >= 1 - t, mean >= 1 - t/2), plus pairwise
similarity Spearman and top-10 neighbour recall; a student in its own space (a static table) is gated on the
pairwise Spearman instead. Task metric: STS Spearman (kiln's built-in pairs by default; retrieval rows with graded
relevance also give NDCG@10 per stored size and precision).
Routes: POST /embed and the OpenAI-compatible POST /v1/embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from kiln.choices import Pooling, TruncationSide, parse_choice
from kiln.errors import UsageError
from kiln.runtime.features import Prepared, one_per_input
from kiln.runtime.precision import Precision, parse_precision, quantize, ranges_for, refuse_rejected
from kiln.tasks.base import TaskSpec
from kiln.tasks.chunking import Chunking, as_chunking, by_owner, chunked, span
from kiln.tasks.feature_extraction.export import FeatureExtractionExport
from kiln.tasks.feature_extraction.validation import FeatureExtractionValidation
from kiln.tasks.inputs import TokenIds


@dataclass(frozen=True)
class EmbedOptions:
    truncate: bool = True
    truncation_side: TruncationSide = TruncationSide.RIGHT  # which end an over-long input loses (TEI's direction)
    dimensions: int | None = None  # cut each vector to its first ``dimensions`` values (Matryoshka)
    chunking: Chunking | None = None  # long texts as windows: their mean, or every window
    precision: Precision = Precision.FLOAT32  # then quantized (kiln.runtime.precision)
    prompt: str = ""  # put before each input (the model's named prompt, or the caller's own text)
    ranges: np.ndarray | None = dataclass_field(default=None, compare=False)  # int8/uint8: per-dimension [min; max]
    normalize: bool = False  # unit vectors (options() defaults it to the model's own: its Normalize module)
    tokens: bool = False  # each input's per-token vectors, unpooled (TEI's /embed_all), instead of its embedding


@dataclass(frozen=True)
class Window:
    start: int  # character span of the window's text
    end: int
    embedding: np.ndarray


@dataclass(frozen=True)
class Chunked:
    """A long text's embedding (the mean of its windows') and every window's (chunking mode "windows")."""

    embedding: np.ndarray
    windows: tuple[Window, ...]


CHUNK_MODES = ("mean", "windows")
POOLED_INSIDE = ("per-token vectors: this artifact's engine pools inside (a static table has no token states); ask "
                 "for pooled embeddings")


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def _pool_mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)


def _pool_cls(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return hidden[:, 0]


def _pool_max(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask[..., None].astype(bool), hidden, -np.inf).max(axis=1)


def _pool_last(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The state at each row's last attended position, whichever side the row is padded on."""
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1].astype(bool), axis=1)
    return hidden[np.arange(len(hidden)), last]


POOLERS = {Pooling.MEAN: _pool_mean, Pooling.CLS: _pool_cls, Pooling.MAX: _pool_max, Pooling.LASTTOKEN: _pool_last}


class FeatureExtraction(TaskSpec):
    validation = FeatureExtractionValidation
    export = FeatureExtractionExport
    decoders = True
    name = "feature-extraction"
    embeds = True
    needs_offsets = False  # only chunking reads spans, and it tokenizes on its own (chunking.chunked)

    def __init__(self, config) -> None:
        super().__init__(config)
        self._pool = POOLERS[config.pooling]
        # int8/uint8 ranges per output size, from output_calibration (which the predictor sets once, before use)
        self._ranges_by_size: dict[int | None, np.ndarray] = {}

    def options(self, truncate: bool = True, dimensions: int | None = None, chunking: Any = None,
                precision: str | Precision = Precision.FLOAT32, prompt_name: str | None = None,
                prompt: str | None = None, normalize: bool | None = None,
                truncation_side: str | TruncationSide = TruncationSide.RIGHT, tokens: bool = False) -> EmbedOptions:
        """``normalize``: unit vectors or the pooled ones (TEI's field); None: as the model's sentence-transformers
        config says (its Normalize module). ``truncation_side``: which end of an over-long input is cut.
        ``tokens``: each input's per-token vectors (the encoder's last hidden state at every token of the input,
        special tokens included, padding left out: TEI's /embed_all, sentence-transformers' token embeddings)."""
        side = parse_choice(TruncationSide, truncation_side, "truncation_side")
        precision = parse_precision(precision)
        if tokens:
            self._check_tokens(dimensions=dimensions is not None, chunking=chunking is not None,
                               precision=precision is not Precision.FLOAT32, normalize=bool(normalize))
        size = self.config.dimension
        if dimensions is not None and (dimensions < 1 or (size is not None and dimensions > size)):
            raise UsageError(f"dimensions must be between 1 and the model's size {size} (got {dimensions})"
                             if size else f"dimensions must be at least 1 (got {dimensions})")
        refuse_rejected(self.stored_vectors, dimensions or size, precision)
        normalize = self.config.normalize if normalize is None else normalize
        if precision.calibrated and normalize != self.config.normalize:
            raise UsageError(f"precision {precision.value}: its ranges were calibrated on the model's own vectors "
                             f"({'unit' if self.config.normalize else 'not normalized'}); leave normalize as the "
                             "model has it, or ask for float32")
        ranges = self._ranges(precision, dimensions) if precision.calibrated else None
        text = self.config.prompt_text(prompt_name, prompt)
        windows = as_chunking(chunking, CHUNK_MODES)
        if text and windows is not None:
            raise UsageError(f"chunking: a prompt ({text!r}) would open the first window only; embed the windows "
                             "yourself with the prompt before each, or leave the prompt out")
        return EmbedOptions(truncate=truncate, truncation_side=side, dimensions=dimensions,
                            chunking=windows, precision=precision, ranges=ranges, prompt=text, normalize=normalize,
                            tokens=tokens)

    def _check_tokens(self, **asked: bool) -> None:
        """Per-token vectors are the encoder's own: refuse what applies to a pooled embedding, and a model whose
        graph projects its token states (kiln applies sentence-transformers' Dense modules to every token)."""
        if given := [name for name, on in asked.items() if on]:
            raise UsageError(f"{', '.join(given)}: applies to a pooled embedding; per-token vectors are the "
                             "encoder's last hidden state as it is")
        if self.config.projected:
            raise UsageError("per-token vectors: this model's Dense projections run on every token state inside "
                             "kiln's graph, so its token states are not the encoder's; ask for pooled embeddings")

    def token_outputs(self, options: EmbedOptions) -> bool:
        return options.tokens

    def check_token_engine(self, engine: Any) -> None:
        if "last_hidden_state" not in engine.output_names:
            raise UsageError(POOLED_INSIDE)

    def token_states(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        if "last_hidden_state" not in outputs:
            raise UsageError(POOLED_INSIDE)
        states, real = outputs["last_hidden_state"], arrays["attention_mask"].astype(bool)
        return [states[row][real[row]].astype(np.float32) for row in range(len(states))]

    def _ranges(self, precision: Precision, dimensions: int | None) -> np.ndarray:
        """int8/uint8 ranges for vectors of ``dimensions``, made once per size: every int8 request asks for them.
        Served vectors are cut, then re-normalised only when the model normalises (``truncated``)."""
        if dimensions not in self._ranges_by_size:
            self._ranges_by_size[dimensions] = ranges_for(precision, self.output_calibration, "precision", dimensions,
                                                          self.config.normalize and dimensions is not None)
        return self._ranges_by_size[dimensions]

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        """Texts, or token-id sequences (``TokenIds``), not both in one call."""
        if inputs and all(isinstance(item, TokenIds) for item in inputs):
            return list(inputs)
        return super().check_inputs(inputs)

    def prepare(self, inputs: Sequence[Any], encoder, options: EmbedOptions) -> Prepared:
        if inputs and isinstance(inputs[0], TokenIds):
            return self._prepare_ids(inputs, encoder, options)
        if options.chunking is not None:
            return chunked(inputs, encoder, options.chunking)
        if options.prompt:  # as sentence-transformers does: the prompt's text, then the input's, tokenized together
            inputs = [options.prompt + text for text in inputs]
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate, offsets=self.needs_offsets,
                                                    side=options.truncation_side))

    def _prepare_ids(self, inputs: Sequence[TokenIds], encoder, options: EmbedOptions) -> Prepared:
        """Token ids as text-embeddings-inference takes them: decoded with their special tokens, then encoded
        without adding any, so the model reads the caller's sequence (cut to its maximum unless truncate is off).
        No prompt is put before them (the caller chose every token) and they are not windowed."""
        if options.chunking is not None:
            raise UsageError("chunking splits texts into windows; token ids are already the model's input: pass "
                             "texts to chunk, or leave chunking out")
        size = encoder.tokenizer.get_vocab_size()
        for i, item in enumerate(inputs):
            if not item.ids:
                raise UsageError(f"input {i}: token ids must not be empty")
            if (bad := next((t for t in item.ids if not 0 <= t < size), None)) is not None:
                raise UsageError(f"input {i}: token id {bad} is not in the model's vocabulary (size {size})")
        texts = [encoder.tokenizer.decode(list(item.ids), skip_special_tokens=False) for item in inputs]
        return one_per_input(inputs, encoder.encode(texts, truncate=options.truncate, special_tokens=False,
                                                    side=options.truncation_side))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        # An engine that pools itself (the static table: a mean over each text's own tokens, no padded tensor)
        # gives the sentence embedding; any other gives token states, pooled as the model's config says.
        # Pooled, not normalized: a request may ask for the vectors before the model's Normalize module (TEI's
        # normalize: false); finalize normalizes as the request's options say.
        pooled = outputs["sentence_embedding"].astype(np.float32, copy=False) if "sentence_embedding" in outputs \
            else self._pool(outputs["last_hidden_state"].astype(np.float32, copy=False), attention_mask)
        return list(pooled)

    def comparable(self, reduced: Any) -> np.ndarray:
        """The model's own vector (unit where it normalizes): what parity and batch drift compare."""
        vector = np.asarray(reduced, dtype=np.float32).reshape(-1)
        return _unit(vector) if self.config.normalize else vector

    light_finalize = True

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: EmbedOptions, encoder) -> list[Any]:
        if options.tokens:  # each input's per-token vectors, as the encoder gave them
            return list(reduced)
        # Normalize, truncate, re-normalise, then quantize: sentence-transformers' order.
        def own(vector: np.ndarray) -> np.ndarray:
            return _unit(vector) if options.normalize else vector

        def cut(vector: np.ndarray) -> np.ndarray:
            if options.dimensions is not None:
                vector = self.truncated(vector, options.dimensions, options.normalize)
            return vector if options.precision is Precision.FLOAT32 else \
                quantize(vector, options.precision, options.ranges)

        if options.chunking is None:
            return [cut(own(v)) for v in reduced]
        results: list[Any] = []
        spans = by_owner(prepared, [span(e) for e in prepared.encodings])
        for pooled, where in zip(by_owner(prepared, reduced), spans):
            windows = [own(v) for v in pooled]
            mean = own(np.mean(windows, axis=0))
            if options.chunking.mode == "windows":
                results.append(Chunked(cut(mean), tuple(Window(s, e, cut(v)) for (s, e), v in zip(where, windows))))
            else:
                results.append(cut(mean))
        return results

    def truncated(self, vector: np.ndarray, dimensions: int, normalize: bool | None = None) -> np.ndarray:
        """The first ``dimensions`` values, re-normalised when the vectors are unit (``normalize``; None: as the
        model normalises), so a unit vector stays one."""
        if dimensions > len(vector):  # an artifact that does not record its size learns it here
            raise UsageError(f"dimensions must be between 1 and the model's size {len(vector)} (got {dimensions})")
        cut = vector[:dimensions]
        return _unit(cut) if (self.config.normalize if normalize is None else normalize) else cut


