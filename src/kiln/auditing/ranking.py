"""What `kiln audit` measures of a reranker deployment's scores against the original cross-encoder, and which
cause explains a gap.

The audit sends queries with several texts each (texts of one length per query, from short to past the
model's maximum) and compares, per query, the served ranking with the original's (Kendall tau, top-1, top-3)
and the served scores with the original's. Every cause is tested by measurement:
- activation: which turn of the original's logits the served scores are (sigmoid, softmax, the raw logit);
  it leaves a one-logit model's ranking alone but changes what a threshold on the score means;
- pair order: whether the server encodes (text, query) instead of (query, text);
- truncation: the pair length at which the original's scores match the served ones best on long pairs;
- batch drift: a text scored alone against the same text inside its query's request.
A cause *explains* the gap when the original, computed that way, agrees with the deployment within tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kiln.auditing.protocols import Endpoint, rerank
from kiln.auditing.reference import TRUNCATIONS, position_limit, truncations
from kiln.auditing.result import AuditResult, Finding, buckets
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank.export import relevant_index
from kiln.tasks.rerank.validation import TOP, rank_agreement

ACTIVATIONS = ("sigmoid", "softmax", "raw")
ORDERS = ("query, text", "text, query")
PER_QUERY = 8


@dataclass(frozen=True)
class ScoreRecipe:
    activation: str  # sigmoid | softmax | raw (the relevant logit)
    max_length: int
    order: str = ORDERS[0]

    def describe(self) -> str:
        return f"{self.activation} scores of ({self.order}) pairs truncated at {self.max_length} tokens"

    def but(self, **changes: Any) -> ScoreRecipe:
        return replace(self, **changes)


class ScoreReference:
    """The source cross-encoder run eagerly in fp32; logits cached per (length, order, pairs)."""

    def __init__(self, source: Any, batch_size: int = 16) -> None:
        import torch

        self.model, self.tokenizer, self.batch_size = source.model.eval(), source.tokenizer, batch_size
        config = source.task_config
        labels = int(getattr(source.model.config, "num_labels", 1))
        self.column = relevant_index(config.id2label) if labels > 1 else 0
        self.configured = ScoreRecipe("sigmoid" if labels == 1 else "softmax", config.max_length)
        self.limit = position_limit(source)
        self.activations = ACTIVATIONS if labels > 1 else ("sigmoid", "raw")
        self._torch = torch
        self._cache: dict[tuple[int, str, tuple[tuple[str, str], ...]], np.ndarray] = {}
        self.pair_prompt = config.pair_prompt  # a causal reranker's: its chat template renders each pair

    def _encode(self, first: Sequence[str], second: Sequence[str], max_length: int | None) -> dict[str, Any]:
        """Token ids of pairs as the original reads them: the tokenizer's pair encoding, or for a causal reranker
        its chat template rendered by transformers (not kiln's split of it: the audit checks that too), closing
        tokens restored over a cut pair's last ones as sentence-transformers does."""
        cut = {"truncation": True, "max_length": max_length} if max_length else {}
        if self.pair_prompt is None:
            return self.tokenizer(list(first), list(second), add_special_tokens=True, **cut)
        texts = [self.tokenizer.apply_chat_template([{"role": "query", "content": q}, {"role": "document",
                                                                                         "content": d}],
                                                    tokenize=False) for q, d in zip(first, second)]
        encoded = self.tokenizer(texts, add_special_tokens=False, **cut)
        encoded["input_ids"] = [self.pair_prompt.closed(ids) if max_length and len(ids) == max_length else ids
                                for ids in encoded["input_ids"]]
        return encoded

    def token_counts(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens per (query, text) pair, special tokens included, untruncated."""
        encoded = self._encode([q for q, _ in pairs], [t for _, t in pairs], None)
        return [len(ids) for ids in encoded["input_ids"]]

    def scores(self, pairs: Sequence[tuple[str, str]], recipe: ScoreRecipe) -> np.ndarray:
        logits = self._logits(tuple(pairs), recipe.max_length, recipe.order)
        relevant = logits[:, self.column]
        if recipe.activation == "raw":
            return relevant
        if recipe.activation == "sigmoid":
            return 1 / (1 + np.exp(-relevant))
        shifted = np.exp(logits - logits.max(1, keepdims=True))
        return (shifted / shifted.sum(1, keepdims=True))[:, self.column]

    def _logits(self, pairs: tuple[tuple[str, str], ...], max_length: int, order: str) -> np.ndarray:
        key = (max_length, order, pairs)
        if key not in self._cache:
            torch = self._torch
            parts = []
            for i in range(0, len(pairs), self.batch_size):
                chunk = pairs[i : i + self.batch_size]
                first, second = zip(*(p if order == ORDERS[0] else p[::-1] for p in chunk))
                enc = self.tokenizer.pad(self._encode(first, second, max_length), return_tensors="pt")
                with torch.inference_mode():
                    parts.append(self.model(**enc).logits.float().numpy().reshape(len(chunk), -1))
            self._cache[key] = np.concatenate(parts).astype(np.float64)
        return self._cache[key]


def builtin_queries(reference: ScoreReference, count: int) -> list[RerankQuery]:
    """``count // 8`` queries (built-in sentences), each over its pair partner and 7 held-out texts of one length;
    the lengths run from short to past the model's maximum, so truncation shows."""
    from kiln.data import corpus
    from kiln.data.texts import builtin_pairs, texts_of_lengths

    queries = max(2, count // PER_QUERY)
    top = reference.configured.max_length + 64
    step = max(1, (top - 8) // queries)

    def tokens(text: str) -> int:  # the text alone, special tokens included
        return len(reference.tokenizer(text)["input_ids"])

    out = []
    for i, (query, partner) in enumerate(builtin_pairs(queries, seed=7)):
        texts = texts_of_lengths([8 + i * step] * (PER_QUERY - 1), seed=11 + i, token_count=tokens,
                                 source=corpus.sentences("held-out"))
        out.append(RerankQuery(query, (partner, *texts)))
    return out


def queries_from_lines(lines: Sequence[str], where: str) -> list[RerankQuery]:
    """``query<TAB>text`` lines; consecutive lines with the same query are one query's texts."""
    from kiln.errors import UsageError

    grouped: dict[str, list[str]] = {}
    for number, line in enumerate(lines, 1):
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise UsageError(f"{where} line {number}: a reranker audit line is a query and a text separated by a tab")
        grouped.setdefault(parts[0], []).append(parts[1])
    queries = [RerankQuery(q, tuple(t)) for q, t in grouped.items() if len(t) >= 2]
    if len(queries) < 2:
        raise UsageError(f"{where} needs at least 2 queries with 2 or more texts each (got {len(queries)})")
    return queries


@dataclass(frozen=True)
class _Comparison:
    taus: np.ndarray  # per query
    top1: float
    top_k: float
    max_diff: float  # served score vs the recipe's, over every pair
    mean_diff: float


def _compare(served: list[np.ndarray], original: list[np.ndarray]) -> _Comparison:
    taus, figures = rank_agreement(zip(original, served))  # what kiln optimize's gate reads for a reranker
    diffs = np.abs(np.concatenate(served) - np.concatenate(original))
    return _Comparison(taus, figures["top1_agreement"], figures[f"top{TOP}_overlap"], float(diffs.max()),
                       float(diffs.mean()))


def diagnose(endpoint: Endpoint, reference: ScoreReference, queries: Sequence[RerankQuery], tolerance: float,
             model: str, task: str, alone: int = 3) -> AuditResult:
    configured = reference.configured
    pairs_of = [[(q.query, t) for t in q.texts] for q in queries]
    flat = [p for pairs in pairs_of for p in pairs]
    served = [rerank(endpoint, q.query, q.texts) for q in queries]

    def original(recipe: ScoreRecipe, which: Sequence[int] | None = None) -> list[np.ndarray]:
        chosen = range(len(queries)) if which is None else which
        scores = reference.scores([p for i in chosen for p in pairs_of[i]], recipe)
        return list(np.split(scores, np.cumsum([len(pairs_of[i]) for i in chosen])[:-1]))

    def mean_diff(recipe: ScoreRecipe, which: Sequence[int] | None = None) -> float:
        chosen = range(len(queries)) if which is None else which
        return float(np.abs(np.concatenate([served[i] for i in chosen]) - np.concatenate(original(recipe, which)))
                     .mean())

    base = _compare(served, original(configured))
    findings, recipe = [], configured

    by_activation = {a: mean_diff(configured.but(activation=a)) for a in reference.activations}
    activation = min(by_activation, key=by_activation.get)
    if by_activation[configured.activation] - by_activation[activation] > 1e-4:
        recipe = recipe.but(activation=activation)
    findings.append(Finding("activation", f"{activation} (mean |score diff| {by_activation[activation]:.2e}; "
                            f"configured {configured.activation}: {by_activation[configured.activation]:.2e})",
                            recipe.activation != configured.activation, by_activation[activation]))

    by_order = {o: mean_diff(recipe.but(order=o)) for o in ORDERS}
    order = min(by_order, key=by_order.get)
    if by_order[configured.order] - by_order[order] > 1e-4:
        recipe = recipe.but(order=order)
    findings.append(Finding("pair order", f"({order}) (mean |score diff| {by_order[order]:.2e}; ({configured.order})"
                            f": {by_order[configured.order]:.2e})", recipe.order != configured.order,
                            by_order[order]))

    lengths = [max(reference.token_counts(pairs)) for pairs in pairs_of]
    long_ones = [i for i, n in enumerate(lengths) if n > TRUNCATIONS[1]]
    if long_ones:
        candidates = truncations(configured.max_length, reference.limit, max(lengths))
        by_length = {t: mean_diff(recipe.but(max_length=t), long_ones) for t in candidates}
        length = min(by_length, key=by_length.get)
        if by_length[configured.max_length] - by_length[length] > 1e-4:
            recipe = recipe.but(max_length=length)
        findings.append(Finding("truncation", f"{recipe.max_length} tokens (mean |score diff| {by_length[length]:.2e}"
                                f" on the {len(long_ones)} queries with pairs over {TRUNCATIONS[1]} tokens; at the "
                                f"configured {configured.max_length}: {by_length[configured.max_length]:.2e})",
                                recipe.max_length != configured.max_length, by_length[length]))

    few = range(min(alone, len(queries)))
    singles = np.array([rerank(endpoint, queries[i].query, [t])[0] for i in few for t in queries[i].texts])
    drift = float(np.abs(singles - np.concatenate([served[i] for i in few])).max())
    findings.append(Finding("batch drift", "none: the same scores alone and with the query's other texts"
                            if drift == 0 else f"max |score diff| {drift:.1e} between a text scored alone and with "
                            f"its query's {PER_QUERY - 1} other texts", drift > tolerance / 10, drift))

    floor = 1 - tolerance
    activation_differs = recipe.activation != configured.activation
    within = float(base.taus.mean()) >= floor and base.top_k >= floor and not activation_differs
    explained: tuple[str, ...] = ()
    explained_min = None
    if recipe != configured:  # the original computed the way the deployment seems to: does it agree then?
        applied = _compare(served, original(recipe))
        explained_min = float(applied.taus.min())
        changed = [c for c, field in (("activation", "activation"), ("pair order", "order"),
                                      ("truncation", "max_length")) if getattr(recipe, field) != getattr(configured,
                                                                                                         field)]
        if float(applied.taus.mean()) >= floor and applied.top_k >= floor and applied.max_diff <= tolerance:
            explained = tuple(changed)
    figures = {"mean_kendall_tau": float(base.taus.mean()), "top1_agreement": base.top1,
               f"top{TOP}_overlap": base.top_k, "max_score_diff": base.max_diff, "mean_score_diff": base.mean_diff}
    return AuditResult(endpoint.url, endpoint.protocol.value, task, model, configured.describe(), len(flat),
                       tolerance, "kendall tau", float(base.taus.min()), float(base.taus.mean()), floor,
                       buckets(lengths, base.taus), tuple(findings), explained, explained_min, within, figures,
                       judged="mean")
