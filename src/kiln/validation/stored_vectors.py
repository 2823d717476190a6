"""What storing vectors smaller costs in retrieval: recall@10 of every (Matryoshka size, output precision) against
the full-size float32 neighbours, with memory and exact-search speed beside it, each judged against a tolerance.

The corpus is held-out documentation sentences (never the calibration texts the int8 ranges come from): the first
``queries`` search the rest. Search is exact, in numpy (see :class:`Search`): cosine for float32; int8/uint8
decoded with the artifact's per-dimension ranges first (a scalar quantizer, as faiss's SQ8 index decodes), and,
as a warning row, their raw values' inner product (sentence-transformers' buckets are offset and scaled per
dimension, so raw values rank poorly: 0.74 recall@10 against 0.98 decoded on MiniLM); Hamming distance for
binary/ubinary, and sentence-transformers' rescoring recipe: the top N x 10 by Hamming distance (N in
``RESCORES``), re-ranked by the float32 query against those documents' int8 vectors (kept on disk beside the
binary index; the memory column counts the index only).

Given the user's own judgements (kiln optimize --eval rows ``query``/``text``/``relevance``), every row also ranks
all of their texts for each of their queries, stored at that size and precision, and scores the ranking's NDCG@10
(graded gains, as kiln scores rerankers); a row then also needs its NDCG@10 within the tolerance of the full-size
float32 one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kiln.records.artifact import StoredVectors
from kiln.runtime.precision import Precision, dequantize, quantize, ranges_of
from kiln.scoring import maxsim_stacked, ndcg_of_ranking, stacked

TOP = 10
RESCORES = (4, 10)  # candidates per result for binary + rescoring (4: sentence-transformers' rescore_multiplier)


@dataclass(frozen=True)
class JudgedVectors:
    """Judgements embedded by the variant measured: float32 query and document vectors."""

    queries: np.ndarray  # [queries, d]; a late-interaction model's: a list of [tokens, d]
    documents: np.ndarray
    relevance: np.ndarray


def ndcg_at_10(found: np.ndarray, relevance: np.ndarray) -> float:
    """Mean NDCG@10 (kiln.scoring: graded gains) of each query's ranked document indices ``found``, over
    the queries with a relevant document."""
    judged = [i for i in range(len(found)) if relevance[i].max() > 0]
    return float(np.mean([ndcg_of_ranking(found[i], relevance[i], TOP) for i in judged])) if judged else 0.0


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's ``k`` highest scores, best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _bits(packed: np.ndarray) -> np.ndarray:
    """Packed binary/ubinary vectors as 0/1 floats (binary's bytes are shifted by -128)."""
    raw = packed.astype(np.int16) + 128 if packed.dtype == np.int8 else packed
    return np.unpackbits(raw.astype(np.uint8), axis=1).astype(np.float32)


class Search:
    """How stored vectors are searched (the ``search`` column)."""

    COSINE = "cosine"  # float32
    DECODED = "decoded cosine"  # int8/uint8 decoded with the artifact's ranges first (what faiss's SQ8 index does)
    RAW = "raw inner product"  # int8/uint8 values used as they are: shown because it is the easy mistake
    HAMMING = "hamming"  # binary/ubinary
    # sentence-transformers' recipe: the binary index finds N x 10 candidates, which the float32 query re-ranks
    # against the same documents' int8 vectors (kept on disk, read for the candidates only)
    RESCORED = "hamming + int8 rescoring ({}x)"


def _searcher(precision: Precision, search: str, docs: np.ndarray, float_docs: np.ndarray, ranges: np.ndarray
              ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """(stored queries, float queries) -> top-10 document indices per query. ``docs``: the stored documents;
    ``float_docs``: the same before quantization (rescoring reads their int8 form)."""
    def decode(int8: np.ndarray) -> np.ndarray:  # each bucket's middle
        return dequantize(int8, Precision.INT8, ranges)

    if search.startswith(Search.HAMMING):
        bits = _bits(docs)
        on_disk = decode(quantize(float_docs, Precision.INT8, ranges)) if search != Search.HAMMING else None
        multiplier = next((m for m in RESCORES if search == Search.RESCORED.format(m)), 0)

        def hamming(queries: np.ndarray, float_queries: np.ndarray) -> np.ndarray:
            q = _bits(queries)
            agree = q @ bits.T + (1 - q) @ (1 - bits).T  # dimensions whose bits match: d - Hamming distance
            if on_disk is None:
                return _top(agree, TOP)
            candidates = _top(agree, TOP * multiplier)
            rescored = np.einsum("qd,qkd->qk", float_queries, on_disk[candidates])
            return np.take_along_axis(candidates, _top(rescored, TOP), axis=1)

        return hamming
    if search == Search.COSINE:
        units = _unit(docs)
        return lambda queries, float_queries: _top(_unit(queries) @ units.T, TOP)
    as_int8 = (lambda x: x) if precision is Precision.INT8 else (lambda x: (x.astype(np.int16) - 128))
    if search == Search.RAW:
        values = as_int8(docs).astype(np.float32)
        return lambda queries, float_queries: _top(as_int8(queries).astype(np.float32) @ values.T, TOP)
    decoded = decode(as_int8(docs))
    return lambda queries, float_queries: _top(decode(as_int8(queries)) @ decoded.T, TOP)


# Output precision -> how its vectors are searched (a row each).
SEARCHES = {Precision.FLOAT32: (Search.COSINE,), Precision.INT8: (Search.DECODED, Search.RAW),
            Precision.UINT8: (Search.DECODED, Search.RAW),
            Precision.BINARY: (Search.HAMMING, *(Search.RESCORED.format(m) for m in RESCORES)),
            Precision.UBINARY: (Search.HAMMING, *(Search.RESCORED.format(m) for m in RESCORES))}


def _timed(search: Callable[[], np.ndarray], queries: int, budget_s: float = 0.2) -> float:
    """Queries per second of ``search`` (all queries at once), best of repeats within the budget."""
    best, spent = float("inf"), 0.0
    while spent < budget_s or best == float("inf"):
        start = time.perf_counter()
        search()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return queries / max(best, 1e-9)


def measure(vectors: np.ndarray, queries: int, calibration: np.ndarray, sizes: Sequence[int],
            precisions: Sequence[Precision], tolerance: float, normalize: bool,
            judged: JudgedVectors | None = None) -> tuple[StoredVectors, ...]:
    """Every (size, precision) of ``vectors`` (the first ``queries`` rows search the others), full size first;
    with ``judged``, each one's NDCG@10 on the user's judgements too.

    ``normalize``: the model normalises, so a cut vector is re-normalised before it is quantized, as served.
    """
    full = vectors.shape[1]
    docs, asked = vectors[queries:].astype(np.float32), vectors[:queries].astype(np.float32)
    truth = _top(_unit(asked) @ _unit(docs).T, TOP)  # the full-size float32 neighbours (cosine)
    rows: list[StoredVectors] = []
    for size in dict.fromkeys([full, *sorted(sizes, reverse=True)]):
        cut = size != full

        def shape(v: np.ndarray, cut: bool = cut, size: int = size) -> np.ndarray:
            """As served: cut to the size, re-normalised when the model normalises."""
            return _unit(v[:, :size]) if cut and normalize else v[:, :size].astype(np.float32)

        d, q = shape(docs), shape(asked)
        ranges = ranges_of(calibration, size if cut else None, normalize and cut)
        for precision in dict.fromkeys([Precision.FLOAT32, *precisions]):
            stored, asked_q = quantize(d, precision, ranges), quantize(q, precision, ranges)
            for how in SEARCHES[precision]:
                search = _searcher(precision, how, stored, d, ranges)
                found = search(asked_q, q)
                recall = float(np.mean([len(set(a) & set(b)) / TOP for a, b in zip(found, truth)]))
                per_s = _timed(lambda s=search, a=asked_q, f=q: s(a, f), len(q))
                ndcg = _judged_ndcg(judged, shape, precision, how, ranges) if judged is not None else None
                floor_ndcg = rows[0].ndcg_at_10 if rows else ndcg  # the full-size float32 row comes first
                accepted = recall >= 1 - tolerance and (ndcg is None or floor_ndcg - ndcg <= tolerance)
                size_bytes = precision.bytes_per_vector(size)
                rows.append(StoredVectors(size, precision.value, how, recall, size_bytes,
                                          size_bytes * 1e6 / 2**20, per_s, accepted, ndcg))
    return tuple(rows)


# How a late-interaction model's stored token vectors are searched: MaxSim of the float32 query's vectors (queries
# are encoded at search time, as ColBERT's PLAID compresses only the documents) against the documents' vectors
# decoded from their precision.
TOKEN_SEARCHES = {Precision.FLOAT32: "maxsim", Precision.INT8: "maxsim, decoded", Precision.UINT8: "maxsim, decoded",
                  Precision.BINARY: "maxsim over +-1 bits", Precision.UBINARY: "maxsim over +-1 bits"}


def measure_token_vectors(queries: Sequence[np.ndarray], documents: Sequence[np.ndarray], calibration: np.ndarray,
                          precisions: Sequence[Precision], tolerance: float,
                          judged: JudgedVectors | None = None) -> tuple[StoredVectors, ...]:
    """Every output precision of a late-interaction model's document token vectors: recall@10 of the float32
    MaxSim neighbours of ``queries`` (their token vectors) among ``documents``, memory per token vector and exact
    MaxSim search speed; with ``judged`` (lists of token vectors), NDCG@10 on the user's judgements too."""
    all_ranges = ranges_of(calibration)
    corpus = stacked(documents)  # stacked once: each precision stores the same tokens
    judged_corpus = stacked(judged.documents) if judged is not None else None

    def searcher(stack: tuple[np.ndarray, np.ndarray], precision: Precision
                 ) -> Callable[[Sequence[np.ndarray]], np.ndarray]:
        tokens, starts = stack
        ranges = all_ranges if precision.calibrated else None
        tokens = dequantize(quantize(tokens, precision, ranges), precision, ranges, tokens.shape[1])
        return lambda asked: _top(np.stack([maxsim_stacked(q, tokens, starts) for q in asked]), TOP)

    size = documents[0].shape[1]
    truth: np.ndarray | None = None
    rows: list[StoredVectors] = []
    for precision in dict.fromkeys([Precision.FLOAT32, *precisions]):
        search = searcher(corpus, precision)
        found = search(queries)
        truth = found if truth is None else truth  # float32 comes first: its neighbours are the truth
        recall = float(np.mean([len(set(a) & set(b)) / TOP for a, b in zip(found, truth)]))
        per_s = _timed(lambda s=search: s(queries), len(queries))
        ndcg = ndcg_at_10(searcher(judged_corpus, precision)(judged.queries), judged.relevance) \
            if judged is not None else None
        floor_ndcg = rows[0].ndcg_at_10 if rows else ndcg  # the float32 row comes first
        accepted = recall >= 1 - tolerance and (ndcg is None or floor_ndcg - ndcg <= tolerance)
        size_bytes = precision.bytes_per_vector(size)
        rows.append(StoredVectors(size, precision.value, TOKEN_SEARCHES[precision], recall, size_bytes,
                                  size_bytes * 1e6 / 2**20, per_s, accepted, ndcg))
    return tuple(rows)


def _judged_ndcg(judged: JudgedVectors, shape: Callable[[np.ndarray], np.ndarray], precision: Precision, how: str,
                 ranges: np.ndarray) -> float:
    """NDCG@10 of the user's queries searching their documents stored at this size and precision."""
    d, q = shape(judged.documents), shape(judged.queries)
    search = _searcher(precision, how, quantize(d, precision, ranges), d, ranges)
    return ndcg_at_10(search(quantize(q, precision, ranges), q), judged.relevance)


def retrieval_corpus(limit: int = 1100) -> list[str]:
    """Held-out documentation sentences: the retrieval corpus (its first 100 are the queries)."""
    from kiln.data import corpus

    return list(corpus.sentences("held-out"))[:limit]
