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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import TruncationSide, parse_choice
from kiln.errors import UsageError
from kiln.records.task import PairPrompt
from kiln.runtime.features import Prepared
from kiln.runtime.tokenization import Features
from kiln.scoring import ranking
from kiln.tasks.arrays import sigmoid, softmax
from kiln.tasks.base import TaskSpec
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank.export import RerankExport, relevant_index
from kiln.tasks.rerank.validation import RerankValidation


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
    truncation_side: TruncationSide = TruncationSide.RIGHT  # which end an over-long pair loses (TEI's direction)
    max_tokens_per_doc: int | None = None  # each text cut to its first tokens before pairing (Cohere's field)


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


def prompted_pairs(prompt: PairPrompt, pairs: Sequence[tuple[str, str]], encoder, truncate: bool) -> list[Features]:
    """A causal reranker's pairs in its prompt template, tokenized as one text each without added special tokens
    (the template holds its own). A pair cut to the model's maximum gets the template's closing tokens back over
    its last ones, as sentence-transformers restores them: the score is read at the last position."""
    encodings = encoder.encode([prompt.render(q, d) for q, d in pairs], truncate=truncate, offsets=False,
                               special_tokens=False)
    features = []
    for enc in encodings:
        cut = len(enc.overflowing) > 0
        ids = prompt.closed(list(enc.ids)) if cut else list(enc.ids)
        features.append(Features(ids, [0] * len(ids), [1] * len(ids), truncated=cut))
    return features


def first_tokens(texts: Sequence[str], encoder, count: int) -> list[str]:
    """Each text cut after its ``count``-th token of the model's tokenizer (none added): the characters up to that
    token's end, so the cut text tokenizes to those tokens and the pair is built from text as ever."""
    encodings = encoder.encode(list(texts), truncate=False, special_tokens=False)
    return [text[: enc.offsets[count - 1][1]] if len(enc.ids) > count else text
            for text, enc in zip(texts, encodings)]


class Rerank(TaskSpec):
    validation = RerankValidation
    export = RerankExport
    name = "text-ranking"
    ranks = True
    decoders = True  # a causal reranker (Qwen3-Reranker), or a decoder's sequence classifier

    def options(self, top_n: int | None = None, return_documents: bool = False, raw_scores: bool = False,
                truncate: bool = True, truncation_side: str | TruncationSide = TruncationSide.RIGHT,
                max_tokens_per_doc: int | None = None) -> RerankOptions:
        """``truncation_side``: which end of an over-long pair is cut (its longer text first, at that end);
        ``max_tokens_per_doc``: each text is first cut to that many of its own tokens (Cohere's rerank field; the
        pair is then cut to the model's maximum as ever). A returned document is the whole text."""
        if top_n is not None and top_n < 1:
            raise UsageError(f"top_n must be at least 1, or None for every text (got {top_n})")
        if max_tokens_per_doc is not None and max_tokens_per_doc < 1:
            raise UsageError(f"max_tokens_per_doc must be at least 1, or None for no limit (got {max_tokens_per_doc})")
        side = parse_choice(TruncationSide, truncation_side, "truncation_side")
        if side is TruncationSide.LEFT and self.config.pair_prompt is not None:
            raise UsageError("truncation_side left: a causal reranker's pair is its prompt template, whose score is "
                             "read after its closing tokens; cut at the start, its instruction would go. Use right "
                             "(its end is cut and the closing tokens restored)")
        return RerankOptions(top_n, return_documents, raw_scores, truncate, side, max_tokens_per_doc)

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [as_rerank_query(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder, options: RerankOptions) -> Prepared:
        pairs = [(q.query, text) for q in inputs for text in q.texts]
        if options.max_tokens_per_doc is not None:
            cut = first_tokens([text for _, text in pairs], encoder, options.max_tokens_per_doc)
            pairs = [(query, text) for (query, _), text in zip(pairs, cut)]
        owners = tuple(i for i, q in enumerate(inputs) for _ in q.texts)
        prompt = self.config.pair_prompt
        encodings = encoder.encode(pairs, truncate=options.truncate, side=options.truncation_side) if prompt is None \
            else prompted_pairs(prompt, pairs, encoder, options.truncate)
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

