"""Late interaction (ColBERT): one small L2-normalised vector per token, queries and documents encoded apart,
scored with MaxSim.

Checkpoints as PyLate and sentence-transformers store them: a BERT-family encoder, then the Dense projections of
modules.json (``1_Dense``…: linear, no activation), and config_sentence_transformers.json with the query and
document markers (``[Q] ``/``[D] ``, added tokens; the original ColBERT's ``[unused0]``/``[unused1]``),
``query_length``/``document_length``, query expansion with ``[MASK]`` up to ``query_length``
(``attend_to_expansion_tokens``: whether the encoder attends to them) and the skiplist (punctuation left out of a
document's vectors); or as the original ColBERT (``colbert-ai``) stores them: the encoder and a ``linear``
projection in one weights file, ``artifact.metadata`` for the rest (:class:`ColbertAiLayout`). The projection is
inside the exported graph, so every engine returns [batch, tokens, dim].

PyLate's encoding, in kiln:
- a query is ``[CLS] [Q] text [SEP]`` cut to ``query_length``, then ``[MASK]`` up to ``query_length``; every
  position is a vector (without expansion: the real tokens only);
- a document is ``[CLS] [D] text [SEP]`` cut to ``document_length``; its vectors leave out skiplist tokens.

Inputs: texts (documents, or queries with ``is_query=True``), or :class:`~kiln.tasks.rerank.task.RerankQuery` (a query
and texts to rank by MaxSim: what ``rerank()`` and ``POST /rerank`` send). Agreement: per query, Kendall's tau and
top-3 overlap of the variant's MaxSim scores against the original's (the gate), with every token vector's cosine
to the original's beside them. Task metric: NDCG@10 and MRR from (query, text, relevance) rows, as a reranker's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.runtime.features import Prepared
from kiln.runtime.precision import Precision, parse_precision, quantize, ranges_for, refuse_rejected
from kiln.runtime.tokenization import Features
from kiln.scoring import maxsim, ranking
from kiln.tasks.base import TaskSpec
from kiln.tasks.multi_vector.export import MultiVectorExport
from kiln.tasks.multi_vector.validation import MultiVectorValidation, kept_vectors
from kiln.tasks.rerank.task import Ranked, Rerank, as_rerank_query

# Token vectors kept for the output calibration (int8/uint8 ranges): a seeded sample, so the artifact stays small
# (16k x 128 float32 = 8 MiB) while every dimension's extremes come from tens of thousands of candidates.
CALIBRATION_VECTORS = 16384


@dataclass(frozen=True)
class MultiVectorOptions:
    is_query: bool = False  # plain texts are documents unless the caller says they are queries
    top_n: int | None = None  # ranking inputs: the best top_n texts
    return_documents: bool = False
    truncate: bool = True
    precision: Precision = Precision.FLOAT32  # of the token vectors returned (texts; a ranking scores float32)
    ranges: np.ndarray | None = None  # int8/uint8: from the artifact's output calibration


class MultiVector(TaskSpec):
    validation = MultiVectorValidation
    export = MultiVectorExport
    name = "multi-vector"
    needs_offsets = False
    ranks = True  # RerankQuery inputs are ranked by MaxSim (rerank(), POST /rerank)
    multi_vectors = True  # a text's result: its token vectors (kiln embed writes a list of vectors per row)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._ranges: np.ndarray | None = None  # int8/uint8 ranges, from output_calibration once asked for

    # -- per call -----------------------------------------------------------------------------------------
    def options(self, is_query: bool = False, top_n: int | None = None, return_documents: bool = False,
                truncate: bool = True, precision: str | Precision = Precision.FLOAT32) -> MultiVectorOptions:
        if top_n is not None and top_n < 1:
            raise UsageError(f"top_n must be at least 1, or None for every text (got {top_n})")
        precision = parse_precision(precision)
        refuse_rejected(self.stored_vectors, self.config.dimension, precision)
        if precision.calibrated and self._ranges is None:  # made once: every int8 request asks for them
            self._ranges = ranges_for(precision, self.output_calibration)
        return MultiVectorOptions(bool(is_query), top_n, return_documents, truncate, precision,
                                  self._ranges if precision.calibrated else None)

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        if all(isinstance(i, str) for i in inputs):
            return list(inputs)
        return [as_rerank_query(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder: Any, options: MultiVectorOptions) -> Prepared:
        texts: list[tuple[str, bool]] = []  # (text, is_query) per feature, in order
        owners: list[int] = []
        for i, item in enumerate(inputs):
            mine = [(item, options.is_query)] if isinstance(item, str) else \
                [(item.query, True), *((t, False) for t in item.texts)]
            texts += mine
            owners += [i] * len(mine)
        features: list[Features | None] = [None] * len(texts)
        for is_query in (True, False):  # one tokenizer batch per kind: they are cut to different lengths
            where = [j for j, (_, q) in enumerate(texts) if q is is_query]
            for j, feature in zip(where, self._encode(encoder, [texts[j][0] for j in where], is_query,
                                                      options.truncate)):
                features[j] = feature
        truncated = [False] * len(inputs)
        for owner, feature in zip(owners, features):
            truncated[owner] = truncated[owner] or feature.truncated
        return Prepared(tuple(inputs), tuple(features), tuple(owners), tuple(truncated))

    def _encode(self, encoder: Any, texts: list[str], is_query: bool, truncate: bool) -> list[Features]:
        """PyLate's tokenize: each text with the tokenizer's special tokens, cut to one short of the length, the
        marker inserted after the first token; a query then padded with [MASK] (expansion)."""
        if not texts:
            return []
        late = self.config.late_interaction
        length = late["query_length"] if is_query else late["document_length"]
        marker = late["query_prefix_id" if is_query else "document_prefix_id"]
        features = []
        for encoding in encoder.encode_limited(texts, length - 1 if truncate else None):
            ids = [encoding.ids[0], marker, *encoding.ids[1:]]
            types = [encoding.type_ids[0], 0, *encoding.type_ids[1:]]
            mask = [1] * len(ids)
            if is_query and late["do_query_expansion"] and len(ids) < length:
                extra = length - len(ids)
                ids += [late["expansion_id"]] * extra
                types += [0] * extra
                mask += [int(late["attend_to_expansion_tokens"])] * extra
            features.append(Features(ids, types, mask, is_query=is_query, truncated=len(encoding.overflowing) > 0))
        return features

    def reduce_arrays(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Each row's L2-normalised token vectors up to its last real position: attended, or a query's [MASK]
        expansion (not attended by default, yet a vector of the query); which ones a feature keeps is
        ``kept``'s (finalize)."""
        real = arrays["attention_mask"].astype(bool) | (arrays["input_ids"] == self.config.late_interaction[
            "expansion_id"])
        lengths = real.shape[1] - np.argmax(real[:, ::-1], axis=1)
        vectors = outputs["token_embeddings"].astype(np.float32, copy=False)
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12, None)
        return [row[:n] for row, n in zip(vectors, lengths)]

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError("multi-vector reduces whole batches (reduce_arrays): it needs the input ids")

    def kept(self, feature: Features, vectors: np.ndarray) -> np.ndarray:
        """A feature's token vectors as PyLate returns them (kiln.tasks.multi_vector.validation.kept_vectors)."""
        return kept_vectors(self.config.late_interaction, feature, vectors)

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: MultiVectorOptions,
                 encoder: Any) -> list[Any]:
        vectors = [self.kept(f, r) for f, r in zip(prepared.encodings, reduced)]
        if all(isinstance(i, str) for i in prepared.inputs):
            return vectors if options.precision is Precision.FLOAT32 else \
                [quantize(v, options.precision, options.ranges) for v in vectors]
        if options.precision is not Precision.FLOAT32:
            raise UsageError(f"precision {options.precision.value} applies to token vectors (texts); a ranking is "
                             "scored in float32")
        results, owners = [], np.array(prepared.owners)
        for i, query in enumerate(prepared.inputs):
            mine = [vectors[j] for j in np.flatnonzero(owners == i)]
            scores = maxsim(mine[0], mine[1:])
            order = ranking(scores)[: options.top_n]
            results.append([Ranked(j, float(scores[j]), query.texts[j] if options.return_documents else None)
                            for j in order])
        return results

    def output_vectors(self, predictor: Any, inputs: Sequence[Any]) -> np.ndarray:
        """The output calibration: token vectors of the calibration queries (as queries) and texts (as documents),
        a seeded sample of CALIBRATION_VECTORS of them when there are more."""
        texts = [t for item in inputs for t in ([item] if isinstance(item, str) else item.texts)]
        queries = [item.query for item in inputs if not isinstance(item, str)]
        found = predictor.predict(texts) + (predictor.predict(queries, is_query=True) if queries else [])
        vectors = np.concatenate(found).astype(np.float32)
        if len(vectors) > CALIBRATION_VECTORS:
            keep = np.random.default_rng(0).choice(len(vectors), CALIBRATION_VECTORS, replace=False)
            vectors = vectors[np.sort(keep)]
        return vectors

    def comparable(self, reduced: Any) -> np.ndarray:
        return np.asarray(reduced, dtype=np.float32).reshape(-1)

    inputs_from_lines = Rerank.inputs_from_lines
    sample_input = Rerank.sample_input


