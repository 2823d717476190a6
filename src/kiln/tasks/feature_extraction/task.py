"""Sentence embeddings: pooling and normalization as the model's sentence-transformers config says.

Agreement: cosine to the original per input (the gate: min >= 1 - t, mean >= 1 - t/2), plus pairwise
similarity Spearman and top-10 neighbour recall; a student in its own space (a static table) is gated on the
pairwise Spearman instead. Task metric: STS Spearman (kiln's built-in pairs by default; retrieval rows with graded
relevance also give NDCG@10 per stored size and precision).
Routes: POST /embed and the OpenAI-compatible POST /v1/embeddings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from importlib import resources
from typing import Any

import numpy as np

from kiln.choices import Pooling
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Judgements, Run
from kiln.runtime.features import Prepared
from kiln.runtime.precision import Precision, parse_precision, quantize, ranges_for, refuse_rejected
from kiln.scoring import spearman
from kiln.tasks.base import TaskSpec
from kiln.tasks.chunking import Chunking, as_chunking, by_owner, chunked, span
from kiln.tasks.feature_extraction.export import FeatureExtractionExport
from kiln.tasks.files import field


@dataclass(frozen=True)
class EmbedOptions:
    truncate: bool = True
    dimensions: int | None = None  # cut each vector to its first ``dimensions`` values (Matryoshka)
    chunking: Chunking | None = None  # long texts as windows: their mean, or every window
    precision: Precision = Precision.FLOAT32  # then quantized (kiln.runtime.precision)
    ranges: np.ndarray | None = dataclass_field(default=None, compare=False)  # int8/uint8: per-dimension [min; max]


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


def _pool_mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)


def _pool_cls(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return hidden[:, 0]


def _pool_max(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask[..., None].astype(bool), hidden, -np.inf).max(axis=1)


POOLERS = {Pooling.MEAN: _pool_mean, Pooling.CLS: _pool_cls, Pooling.MAX: _pool_max}


class FeatureExtraction(TaskSpec):
    export = FeatureExtractionExport
    decoders = True
    name = "feature-extraction"
    embeds = True
    default_tolerance = 0.01
    tolerance_help = "min cosine >= 1-t and mean cosine >= 1-t/2"
    metric = "spearman"
    eval_fields = ("sentence1", "sentence2", "score (or query, text, relevance)")
    needs_offsets = False  # only chunking reads spans, and it tokenizes on its own (chunking.chunked)
    has_builtin_eval = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self._pool = POOLERS[config.pooling]
        # int8/uint8 ranges per output size, from output_calibration (which the predictor sets once, before use)
        self._ranges_by_size: dict[int | None, np.ndarray] = {}

    def options(self, truncate: bool = True, dimensions: int | None = None, chunking: Any = None,
                precision: str | Precision = Precision.FLOAT32) -> EmbedOptions:
        size = self.config.dimension
        if dimensions is not None and (dimensions < 1 or (size is not None and dimensions > size)):
            raise UsageError(f"dimensions must be between 1 and the model's size {size} (got {dimensions})"
                             if size else f"dimensions must be at least 1 (got {dimensions})")
        precision = parse_precision(precision)
        refuse_rejected(self.stored_vectors, dimensions or size, precision)
        ranges = self._ranges(precision, dimensions) if precision.calibrated else None
        return EmbedOptions(truncate=truncate, dimensions=dimensions, chunking=as_chunking(chunking, CHUNK_MODES),
                            precision=precision, ranges=ranges)

    def _ranges(self, precision: Precision, dimensions: int | None) -> np.ndarray:
        """int8/uint8 ranges for vectors of ``dimensions``, made once per size: every int8 request asks for them.
        Served vectors are cut, then re-normalised only when the model normalises (``truncated``)."""
        if dimensions not in self._ranges_by_size:
            self._ranges_by_size[dimensions] = ranges_for(precision, self.output_calibration, "precision", dimensions,
                                                          self.config.normalize and dimensions is not None)
        return self._ranges_by_size[dimensions]

    def prepare(self, inputs: Sequence[Any], encoder, options: EmbedOptions) -> Prepared:
        if options.chunking is not None:
            return chunked(inputs, encoder, options.chunking)
        return super().prepare(inputs, encoder, options)

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        # An engine that pools itself (the static table: a mean over each text's own tokens, no padded tensor)
        # gives the sentence embedding; any other gives token states, pooled as the model's config says.
        pooled = outputs["sentence_embedding"].astype(np.float32, copy=False) if "sentence_embedding" in outputs \
            else self._pool(outputs["last_hidden_state"].astype(np.float32, copy=False), attention_mask)
        if self.config.normalize:
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return list(pooled)

    light_finalize = True

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: EmbedOptions, encoder) -> list[Any]:
        # Truncate, re-normalise, then quantize: sentence-transformers' order.
        def cut(vector: np.ndarray) -> np.ndarray:
            if options.dimensions is not None:
                vector = self.truncated(vector, options.dimensions)
            return vector if options.precision is Precision.FLOAT32 else \
                quantize(vector, options.precision, options.ranges)

        if options.chunking is None:
            return [cut(v) for v in reduced]
        results: list[Any] = []
        spans = by_owner(prepared, [span(e) for e in prepared.encodings])
        for windows, where in zip(by_owner(prepared, reduced), spans):
            mean = np.mean(windows, axis=0)
            if self.config.normalize:
                mean = mean / max(float(np.linalg.norm(mean)), 1e-12)
            if options.chunking.mode == "windows":
                results.append(Chunked(cut(mean), tuple(Window(s, e, cut(v)) for (s, e), v in zip(where, windows))))
            else:
                results.append(cut(mean))
        return results

    def truncated(self, vector: np.ndarray, dimensions: int) -> np.ndarray:
        """The first ``dimensions`` values, re-normalised when the model normalises (a unit vector stays one)."""
        if dimensions > len(vector):  # an artifact that does not record its size learns it here
            raise UsageError(f"dimensions must be between 1 and the model's size {len(vector)} (got {dimensions})")
        cut = vector[:dimensions]
        return cut / max(float(np.linalg.norm(cut)), 1e-12) if self.config.normalize else cut

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        ref = _unit(np.stack(data.reference.results))
        got = _unit(np.stack(variant.results))
        sim_ref, sim_got = ref @ ref.T, got @ got.T
        upper = np.triu_indices(len(ref), k=1)
        k = min(10, len(ref) - 1)
        np.fill_diagonal(sim_ref, -np.inf)
        np.fill_diagonal(sim_got, -np.inf)
        top_ref = np.argsort(-sim_ref, axis=1)[:, :k]
        top_got = np.argsort(-sim_got, axis=1)[:, :k]
        kept = np.array([len(set(a) & set(b)) / k for a, b in zip(top_ref, top_got)]) if k else np.ones(len(ref))
        figures = {"pairwise_spearman": spearman(sim_ref[upper], sim_got[upper]),
                   f"top{k}_neighbour_recall": float(kept.mean())}
        if data.own_space:
            # No cosine between two spaces (a static student's table is PCA-rotated and smaller): what carries over
            # is which texts are alike, the similarity structure, judged as a whole and per text's neighbours.
            return Agreement.of("pairwise_spearman", figures, data.lengths(), kept, f"top{k} neighbours kept")
        cos = (ref * got).sum(1)
        figures = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())} | figures
        for dims in data.config.matryoshka_dims if data.config else ():
            cut = (_unit(ref[:, :dims]) * _unit(got[:, :dims])).sum(1)
            figures |= {f"mean_cosine@{dims}": float(cut.mean()), f"min_cosine@{dims}": float(cut.min())}
        return Agreement.of("min_cosine", figures, data.lengths(), cos, "cosine")

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        """Min and mean cosine, at the full size and at every declared Matryoshka size (all are served); for a
        student in its own space, the pairwise similarity Spearman (the ranking of every pair's similarity)."""
        if "min_cosine" not in agreement.figures:
            return [Floor("pairwise_spearman", agreement.figures["pairwise_spearman"], 1.0 - tolerance)]
        suffixes = ["", *sorted({n[n.index("@"):] for n in agreement.figures if "@" in n},
                                key=lambda s: -int(s[1:]))]  # the full size first, then 256, 128, …
        return [Floor(name + suffix, agreement.figures[name + suffix], floor) for suffix in suffixes
                for name, floor in (("min_cosine", 1.0 - tolerance), ("mean_cosine", 1.0 - tolerance / 2))]

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        """STS's ``sentence1``/``sentence2``/``score``, or a reranker's retrieval rows ``query``/``text``/
        ``relevance`` (graded, 0 or more): the task metric is then the Spearman of cosine and relevance, and
        kiln optimize --precisions also ranks every text for each query (NDCG@10 per stored size and precision)."""
        if "query" in row:
            relevance = field(row, "relevance", where, float)
            if not relevance >= 0:
                raise UsageError(f"{where}: field 'relevance' must be 0 or more (got {relevance:g})")
            return (field(row, "query", where), field(row, "text", where)), relevance
        pair = (field(row, "sentence1", where), field(row, "sentence2", where))
        return pair, field(row, "score", where, float)

    @classmethod
    def retrieval_judgements(cls, data: EvalSet) -> Judgements | None:
        """The user's labelled pairs as retrieval judgements: each distinct first text a query, each distinct
        second text a document, the label its graded relevance (unlisted pairs 0). None for kiln's own STS pairs
        (too few to rank)."""
        return None if data.builtin else Judgements.of_pairs(data.source, data.inputs, data.labels)

    @classmethod
    def builtin_eval(cls) -> EvalSet:
        """kiln's own STS pairs (0-5 similarity, written for kiln)."""
        text = resources.files("kiln.data").joinpath("sts.jsonl").read_text(encoding="utf-8")
        rows = [cls.parse_row(json.loads(line), f"built-in sts.jsonl line {i}")
                for i, line in enumerate(text.splitlines(), start=1)]
        return EvalSet(cls.name, "built-in STS pairs", tuple(r[0] for r in rows), tuple(r[1] for r in rows),
                       builtin=True)

    @classmethod
    def training_rows(cls, data: EvalSet) -> tuple[list[Any], list[Any]]:
        """Both sentences of every pair, unlabelled: a similarity score is no target for one sentence; the
        teacher's embeddings are."""
        texts = cls.eval_inputs(data)
        return texts, [None] * len(texts)

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        left = _unit(np.stack(predictor.predict([a for a, _ in data.inputs])))
        right = _unit(np.stack(predictor.predict([b for _, b in data.inputs])))
        return {"spearman": spearman((left * right).sum(1), data.labels)}

    @classmethod
    def eval_inputs(cls, data: EvalSet) -> list[Any]:
        return [text for pair in data.inputs for text in pair]


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


