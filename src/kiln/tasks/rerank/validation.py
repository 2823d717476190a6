"""text-ranking's validation part: each query's ranking kept (Kendall tau, top-3 overlap); MRR and NDCG@10 as the
task metric."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kiln.data import corpus
from kiln.data.texts import builtin_pairs, builtin_sentences, length_mix
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Run
from kiln.scoring import kendall_tau, ndcg_at_k, ranking, reciprocal_rank
from kiln.tasks.files import field
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank.export import relevant_index
from kiln.tasks.validation import TaskValidation

TOP = 3  # agreement's top-k overlap


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


class RerankValidation(TaskValidation):
    name = "text-ranking"
    default_tolerance = 0.05
    tolerance_help = f"mean Kendall tau per query >= 1-t and mean top-{TOP} overlap >= 1-t"
    metric = "ndcg@10"
    eval_fields = ("query", "text", "relevance")
    # A shadowed (query, text) pair alone has no ranking: its figure is how close its 0-1 relevance score stays.
    live_figure = "score_agreement"

    @classmethod
    def live_agreement(cls, handler: Any, served: Any, reference: Any) -> float:
        return 1.0 - float(abs(handler.scores([served])[0] - handler.scores([reference])[0]))

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
