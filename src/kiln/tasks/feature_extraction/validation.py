"""feature-extraction's validation part: cosine per input, pairwise similarity Spearman and neighbours kept;
STS Spearman as the task metric (kiln's built-in pairs, or the user's pairs or graded retrieval rows)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Judgements, Run
from kiln.scoring import spearman
from kiln.tasks.files import field
from kiln.tasks.validation import TaskValidation, length_bound


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


class FeatureExtractionValidation(TaskValidation):
    name = "feature-extraction"
    default_tolerance = 0.01
    tolerance_help = ("min cosine >= 1-t and mean cosine >= 1-t/2 on the agreement texts, and the cosine a log-normal "
                      "fit puts 99.9% of texts of each length like them at (95% confidence) >= 1-t")
    promise = ("every one of the {count} agreement texts (the built-in sentences, short queries and documentation "
               "prose up to the model's maximum length) at cosine >= {floor} to the original, so, with 95% confidence "
               "and no assumption about their spread, at least {share:.1%} of texts like them too; and a margin for "
               "the rest: a log-normal fit of each length's cosine deficits puts 99.9% of such texts at >= {floor} "
               "(cosine_bound)")
    metric = "spearman"
    eval_fields = ("sentence1", "sentence2", "score (or query, text, relevance)")
    has_builtin_eval = True

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
        # Two zero vectors are the same answer (kiln.scoring.cosine's rule): a static table's text of tokens it
        # has none of (a short query can be) embeds to zeros in every batching.
        cos[~ref.any(axis=1) & ~got.any(axis=1)] = 1.0
        figures = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())} | figures
        bound = length_bound(cos, data.lengths())
        if bound is not None:
            figures["cosine_bound"] = bound
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
        floors = [Floor(name + suffix, agreement.figures[name + suffix], floor) for suffix in suffixes
                  for name, floor in (("min_cosine", 1.0 - tolerance), ("mean_cosine", 1.0 - tolerance / 2))]
        if "cosine_bound" in agreement.figures:  # after the full size's min and mean, which name a plainer failure
            floors.insert(2, Floor("cosine_bound", agreement.figures["cosine_bound"], 1.0 - tolerance, stated=True))
        return floors

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
