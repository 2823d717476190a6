"""Agreement: how closely a variant reproduces the fp32 original's task outputs, per length bucket."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import TaskName
from kiln.parity import LENGTH_BUCKETS
from kiln.runtime import Predictor
from kiln.tasks.base import Prepared, softmax
from kiln.validation import metrics


@dataclass
class Run:
    """One predictor's outputs on the agreement inputs: per-feature reduced outputs and final results."""

    reduced: list[Any]
    results: list[Any]


@dataclass
class AgreementInputs:
    prepared: Prepared
    reference: Run

    @classmethod
    def build(cls, reference: Predictor, inputs: Sequence[Any]) -> AgreementInputs:
        prepared = reference.prepare(inputs)
        return cls(prepared, run(reference, prepared))

    def lengths(self) -> list[int]:
        """Token length of each input (its longest feature)."""
        out = [0] * len(self.prepared.inputs)
        for owner, enc in zip(self.prepared.owners, self.prepared.encodings):
            out[owner] = max(out[owner], len(enc.ids))
        return out


def run(predictor: Predictor, prepared: Prepared) -> Run:
    options = predictor.handler.options()
    reduced = predictor.run_features(prepared.encodings)
    return Run(reduced, predictor.handler.finalize(prepared, reduced, options, predictor.encoder,
                                                   predictor.config))


@dataclass
class Agreement:
    primary: str  # the figure the gate checks (higher is better, 1.0 = identical)
    value: float
    figures: dict[str, float]
    buckets: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"primary": self.primary, "value": self.value, "figures": self.figures, "buckets": self.buckets}


def _buckets(lengths: list[int], per_item: np.ndarray, name: str) -> list[dict[str, Any]]:
    index = np.array([next(i for i, hi in enumerate(LENGTH_BUCKETS) if n <= hi) for n in lengths])
    out = []
    for b in sorted(set(index.tolist())):
        chosen = per_item[index == b]
        lo = LENGTH_BUCKETS[b - 1] + 1 if b else 1
        out.append({"tokens": f"{lo}-{LENGTH_BUCKETS[b]}", "count": int(chosen.size),
                    f"mean_{name}": float(chosen.mean()), f"min_{name}": float(chosen.min())})
    return out


def _feature_extraction(data: AgreementInputs, variant: Run) -> Agreement:
    ref = np.stack(data.reference.results).astype(np.float64)
    got = np.stack(variant.results).astype(np.float64)
    ref_n = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    got_n = got / np.linalg.norm(got, axis=1, keepdims=True)
    cos = (ref_n * got_n).sum(1)
    sim_ref, sim_got = ref_n @ ref_n.T, got_n @ got_n.T
    upper = np.triu_indices(len(ref), k=1)
    k = min(10, len(ref) - 1)
    np.fill_diagonal(sim_ref, -np.inf)
    np.fill_diagonal(sim_got, -np.inf)
    top_ref = np.argsort(-sim_ref, axis=1)[:, :k]
    top_got = np.argsort(-sim_got, axis=1)[:, :k]
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(top_ref, top_got)]) if k else 1.0
    figures = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
               "pairwise_spearman": metrics.spearman(sim_ref[upper], sim_got[upper]),
               f"top{k}_neighbour_recall": float(recall)}
    return Agreement("min_cosine", figures["min_cosine"], figures, _buckets(data.lengths(), cos, "cosine"))


def _probabilities(reduced: list[np.ndarray]) -> np.ndarray:
    return softmax(np.stack(reduced))


def _text_classification(data: AgreementInputs, variant: Run) -> Agreement:
    ref, got = _probabilities(data.reference.reduced), _probabilities(variant.reduced)
    agree = (ref.argmax(1) == got.argmax(1)).astype(np.float64)
    figures = {"label_agreement": float(agree.mean()), "max_probability_diff": float(np.abs(ref - got).max())}
    return Agreement("label_agreement", figures["label_agreement"], figures,
                     _buckets(data.lengths(), agree, "agreement"))


def _token_classification(data: AgreementInputs, variant: Run) -> Agreement:
    per_item, total, same = [], 0, 0
    for enc, ref, got in zip(data.prepared.encodings, data.reference.reduced, variant.reduced):
        real = ~np.array(enc.special_tokens_mask, dtype=bool)
        equal = ref.argmax(-1)[real] == got.argmax(-1)[real]
        total, same = total + int(real.sum()), same + int(equal.sum())
        per_item.append(float(equal.mean()) if equal.size else 1.0)
    figures = {"tag_agreement": same / total if total else 1.0}
    return Agreement("tag_agreement", figures["tag_agreement"], figures,
                     _buckets(data.lengths(), np.array(per_item), "agreement"))


def _question_answering(data: AgreementInputs, variant: Run) -> Agreement:
    ref = [r[0].answer if r else "" for r in data.reference.results]
    got = [r[0].answer if r else "" for r in variant.results]
    per_item = np.array([metrics.squad_scores([g], [[r]])["f1"] for r, g in zip(ref, got)])
    figures = metrics.squad_scores(got, [[r] for r in ref])
    figures = {"answer_exact_match": figures["exact_match"], "answer_f1": figures["f1"]}
    return Agreement("answer_f1", figures["answer_f1"], figures, _buckets(data.lengths(), per_item, "f1"))


AGREEMENT: dict[TaskName, Callable[[AgreementInputs, Run], Agreement]] = {
    TaskName.FEATURE_EXTRACTION: _feature_extraction,
    TaskName.TEXT_CLASSIFICATION: _text_classification,
    TaskName.TOKEN_CLASSIFICATION: _token_classification,
    TaskName.QUESTION_ANSWERING: _question_answering,
}


def measure_agreement(task: TaskName, data: AgreementInputs, candidate: Predictor) -> Agreement:
    return AGREEMENT[task](data, run(candidate, data.prepared))
