"""Reranking with a cross-encoder: score every (query, text) pair, sort the texts by score.

The model is a sequence classifier on pairs with one logit (MS MARCO cross-encoders), or two where the second
(or the one named relevant/positive/entailment) is "relevant". Scores are the sigmoid of that logit, or the
softmax probability of the relevant label; ``raw_scores`` gives the logit itself. One query with N texts is N
features: the batcher packs them with other requests' pairs.
Agreement: per query, Kendall's tau between the original's and the variant's scores and the overlap of their
top 3 (gate: mean tau and mean overlap >= 1 - t). Task metric: NDCG@10 and MRR from an eval file of
(query, text, relevance) rows. Route: POST /rerank (TEI's request shape).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.data import corpus
from kiln.data.texts import builtin_pairs, builtin_sentences, length_mix
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Run
from kiln.runtime.features import Prepared
from kiln.scoring import kendall_tau, ndcg_at_k, ranking, reciprocal_rank
from kiln.tasks.base import TaskSpec, sigmoid, softmax
from kiln.tasks.files import field
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank.export import RerankExport, relevant_index

TOP = 3  # agreement's top-k overlap


@dataclass(frozen=True)
class Ranked:
    index: int  # position of the text in the request
    score: float
    text: str | None = None  # with return_documents


@dataclass(frozen=True)
class RerankOptions:
    top_n: int | None = None  # None: every text
    return_documents: bool = False
    raw_scores: bool = False
    truncate: bool = True


def as_rerank_query(item: Any, index: int = 0) -> RerankQuery:
    if isinstance(item, RerankQuery):
        texts: Any = item.texts
        query: Any = item.query
    elif isinstance(item, Mapping) and set(item) == {"query", "texts"}:
        query, texts = item["query"], item["texts"]
    else:
        raise UsageError(f"rerank inputs must be {{'query': …, 'texts': [...]}} or kiln.RerankQuery (input {index} "
                         f"is {type(item).__name__} {str(item)[:60]!r})")
    if not isinstance(query, str) or isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise UsageError(f"rerank input {index}: the query must be a string and texts a list of strings")
    if not texts:
        raise UsageError(f"rerank input {index}: texts must hold at least one text")
    return RerankQuery(query, tuple(texts))


def _queries_over(texts: list[str], per_query: int = 8) -> list[RerankQuery]:
    """Built-in sentences as queries, each over the next ``per_query`` of ``texts``."""
    queries = builtin_sentences()
    return [RerankQuery(queries[i % len(queries)], tuple(texts[i : i + per_query]))
            for i in range(0, len(texts), per_query)]


def rank_agreement(per_query: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, dict[str, float]]:
    """How a variant's scores rank each query's texts against the original's: per query Kendall's tau (returned,
    for the length buckets), and the figures the gate reads (mean and min tau, top-3 overlap, top-1 agreement)."""
    taus, overlaps, top1 = [], [], []
    for a, b in per_query:
        k = min(TOP, len(a))
        taus.append(kendall_tau(a, b))
        overlaps.append(len(set(ranking(a)[:k]) & set(ranking(b)[:k])) / k)
        top1.append(float(ranking(a)[0] == ranking(b)[0]))
    tau = np.array(taus)
    return tau, {"mean_kendall_tau": float(tau.mean()), "min_kendall_tau": float(tau.min()),
                 f"top{TOP}_overlap": float(np.mean(overlaps)), "top1_agreement": float(np.mean(top1))}


class Rerank(TaskSpec):
    export = RerankExport
    name = "text-ranking"
    ranks = True
    default_tolerance = 0.05
    tolerance_help = f"mean Kendall tau per query >= 1-t and mean top-{TOP} overlap >= 1-t"
    metric = "ndcg@10"
    eval_fields = ("query", "text", "relevance")

    def options(self, top_n: int | None = None, return_documents: bool = False, raw_scores: bool = False,
                truncate: bool = True) -> RerankOptions:
        if top_n is not None and top_n < 1:
            raise UsageError(f"top_n must be at least 1, or None for every text (got {top_n})")
        return RerankOptions(top_n, return_documents, raw_scores, truncate)

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [as_rerank_query(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder, options: RerankOptions) -> Prepared:
        pairs = [(q.query, text) for q in inputs for text in q.texts]
        owners = tuple(i for i, q in enumerate(inputs) for _ in q.texts)
        encodings = encoder.encode(pairs, truncate=options.truncate)
        truncated = [False] * len(inputs)
        for owner, enc in zip(owners, encodings):
            truncated[owner] = truncated[owner] or len(enc.overflowing) > 0
        return Prepared(tuple(inputs), tuple(encodings), owners, tuple(truncated))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        return list(outputs["logits"].astype(np.float32))

    def scores(self, logits: Sequence[np.ndarray], raw: bool = False) -> np.ndarray:
        """Relevance of each pair from its logits: the relevant logit, its sigmoid, or its softmax probability."""
        stacked = np.stack(logits).reshape(len(logits), -1)
        column = relevant_index(self.config.id2label) if stacked.shape[1] > 1 else 0
        if raw:
            return stacked[:, column]
        return sigmoid(stacked[:, 0]) if stacked.shape[1] == 1 else softmax(stacked)[:, column]

    # A shadowed (query, text) pair alone has no ranking: its figure is how close its 0-1 relevance score stays.
    live_figure = "score_agreement"

    def live_agreement(self, served: Any, reference: Any) -> float:
        return 1.0 - float(abs(self.scores([served])[0] - self.scores([reference])[0]))

    light_finalize = True

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: RerankOptions,
                 encoder) -> list[list[Ranked]]:
        scores = self.scores(reduced, options.raw_scores)
        per_query: dict[int, list[float]] = defaultdict(list)
        for owner, score in zip(prepared.owners, scores):
            per_query[owner].append(float(score))
        results = []
        for i, query in enumerate(prepared.inputs):
            order = ranking(per_query[i])[: options.top_n]
            results.append([Ranked(j, per_query[i][j], query.texts[j] if options.return_documents else None)
                            for j in order])
        return results

    @classmethod
    def agreement_inputs(cls, encoder, count: int = 128) -> list[Any]:
        """``count // 8`` queries (built-in sentences) with 8 texts each: its pair partner and real sentences
        of 10 tokens to the maximum from the held-out half of Python's documentation."""
        queries = count // 8
        texts = length_mix(queries * 7, 10, encoder.max_length, seed=2, token_count=encoder.token_count,
                           source=corpus.sentences("held-out"))
        return [RerankQuery(a, (b, *texts[7 * i : 7 * i + 7])) for i, (a, b) in enumerate(builtin_pairs(queries))]

    @classmethod
    def calibration_inputs(cls, encoder, count: int = 128) -> list[Any]:
        return _queries_over(length_mix(count, 10, encoder.max_length, seed=1, token_count=encoder.token_count,
                                        source=corpus.sentences("calibration")))

    @classmethod
    def timing_inputs(cls, encoder, count: int = 256) -> list[Any]:
        return _queries_over(length_mix(count, 10, min(200, encoder.max_length), seed=3,
                                        token_count=encoder.token_count))

    @classmethod
    def inputs_from_lines(cls, lines: list[str], flag: str) -> list[Any]:
        """``query<TAB>text`` per line."""
        pairs = [line.split("\t") for line in lines]
        bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
        if bad is not None:
            raise UsageError(f"{flag} line {bad + 1}: a rerank line is a query and a text separated by a tab")
        return [RerankQuery(q, (t,)) for q, t in pairs]

    @classmethod
    def sample_input(cls, text: str) -> Any:
        return RerankQuery(text, (text,))

    # -- validation ---------------------------------------------------------------------------------------
    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        owners = np.array(data.prepared.owners)
        ref, got = (np.stack(run.reduced).reshape(len(owners), -1) for run in (data.reference, variant))
        column = relevant_index(data.config.id2label) if data.config and ref.shape[1] > 1 else 0
        ref, got = ref[:, column], got[:, column]  # the relevant logit: its order is the ranking
        tau, figures = rank_agreement((ref[owners == q], got[owners == q]) for q in range(len(data.prepared.inputs)))
        figures["max_logit_diff"] = float(np.abs(ref - got).max())
        return Agreement.of("mean_kendall_tau", figures, data.lengths(), tau, "kendall tau")

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        return [Floor("mean_kendall_tau", agreement.figures["mean_kendall_tau"], 1.0 - tolerance),
                Floor(f"top{TOP}_overlap", agreement.figures[f"top{TOP}_overlap"], 1.0 - tolerance)]

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        return (field(row, "query", where), field(row, "text", where)), field(row, "relevance", where, float)

    @classmethod
    def read_eval(cls, path: Path) -> EvalSet:
        """Rows of (query, text, relevance) grouped by query, in first-seen order."""
        rows = super().read_eval(path)
        grouped: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for (query, text), relevance in zip(rows.inputs, rows.labels):
            grouped[query].append((text, relevance))
        return EvalSet(cls.name, rows.source, tuple(RerankQuery(q, tuple(t for t, _ in g)) for q, g in grouped.items()),
                       tuple(tuple(r for _, r in g) for g in grouped.values()))

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        """NDCG@10 (graded) and MRR (relevance > 0 is relevant), averaged over queries."""
        ndcg, mrr = [], []
        for ranked, relevance in zip(predictor.predict(list(data.inputs)), data.labels):
            scores = [0.0] * len(relevance)
            for r in ranked:
                scores[r.index] = r.score
            ndcg.append(ndcg_at_k(scores, relevance, 10))
            mrr.append(reciprocal_rank(scores, relevance))
        return {"ndcg@10": float(np.mean(ndcg)), "mrr": float(np.mean(mrr))}

    @classmethod
    def eval_inputs(cls, data: EvalSet) -> list[Any]:
        return list(data.inputs)
