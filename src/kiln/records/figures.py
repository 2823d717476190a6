"""Typed validation records: one run's outputs, agreement figures per length bucket, labelled data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # tasks import these records; the type alone is needed here
    from kiln.records.task import TaskConfig
    from kiln.runtime.features import Prepared

# Token-count buckets for per-length breakdowns (upper bounds, inclusive); parity uses the same.
LENGTH_BUCKETS = (16, 64, 128, 256, 512, 1 << 30)


def bucket_index(tokens: int) -> int:
    return next(i for i, hi in enumerate(LENGTH_BUCKETS) if tokens <= hi)


def bucket_label(index: int) -> str:
    lo = LENGTH_BUCKETS[index - 1] + 1 if index else 1
    hi = LENGTH_BUCKETS[index]
    return f"{lo}-{hi}" if hi < 1 << 30 else f">{lo - 1}"


@dataclass(frozen=True)
class Run:
    """One predictor's outputs on the agreement inputs: per-feature reduced outputs and final results."""

    reduced: Sequence[Any]  # a tuple, or rows held on disk (kiln.validation.spill) when they are big
    results: Sequence[Any]


@dataclass(frozen=True)
class Continuations:
    """The original's greedy continuations of a few held-out prompts (a decoder's): what a user of a variant reads,
    compared token for token where teacher-forced next tokens alone would not show it (one changed token changes
    everything generated after it)."""

    prompts: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]  # the original's greedy tokens of each prompt (to its first stop)


@dataclass(frozen=True)
class AgreementInputs:
    """The inputs every variant is compared on, prepared once, and the original's outputs on them."""

    prepared: Prepared
    reference: Run
    config: TaskConfig | None = None  # the judged model's task settings (Matryoshka sizes to report, …)
    # A student with a tokenizer and an embedding space of its own (a static table of kiln distill --static): it
    # encodes the inputs itself, and only figures that need no shared space (similarity structure, neighbours)
    # can compare it with the original.
    own_space: bool = False
    continuations: Continuations | None = None  # a decoder's, when its task validation asks for them

    def prepared_for(self, candidate: Any) -> Prepared:
        """The inputs as ``candidate`` (a Predictor) runs them: the original's tokens, or a student in its own
        space's own encoding of the same inputs."""
        return candidate.prepare(list(self.prepared.inputs)) if self.own_space else self.prepared

    def lengths(self) -> list[int]:
        """Token length of each input (its longest feature)."""
        out = [0] * len(self.prepared.inputs)
        for owner, enc in zip(self.prepared.owners, self.prepared.encodings):
            out[owner] = max(out[owner], len(enc.ids))
        return out


@dataclass(frozen=True)
class BucketFigure:
    """One per-item figure (cosine, label agreement, answer F1…) summarised over a token-length bucket."""

    tokens: str
    count: int
    mean: float
    min: float


@dataclass(frozen=True)
class Agreement:
    primary: str  # the figure the gate checks (higher is better, 1.0 = identical)
    value: float
    figures: Mapping[str, float]
    per_item: str  # what each item's figure in ``buckets`` is (cosine, agreement, f1)
    buckets: tuple[BucketFigure, ...]

    @classmethod
    def of(cls, primary: str, figures: Mapping[str, float], lengths: Sequence[int], per_item: np.ndarray,
           per_item_name: str) -> Agreement:
        """The agreement record: ``figures[primary]`` is gated; ``per_item`` is broken down by length."""
        index = np.array([bucket_index(n) for n in lengths])
        buckets = tuple(
            BucketFigure(bucket_label(b), int((index == b).sum()), float(per_item[index == b].mean()),
                         float(per_item[index == b].min()))
            for b in sorted(set(index.tolist()))
        )
        return cls(primary, float(figures[primary]), dict(figures), per_item_name, buckets)


@dataclass(frozen=True)
class Floor:
    """One figure the gate checks against its lowest allowed value."""

    figure: str
    value: float
    floor: float
    # Named in an accepted verdict beside the primary figure: what the verdict promises beyond the texts it saw.
    stated: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.floor


@dataclass(frozen=True)
class EvalSet:
    """Labelled examples of one task: model inputs and their gold labels, in file order."""

    task: str
    source: str
    inputs: tuple[Any, ...]
    labels: tuple[Any, ...]
    builtin: bool = False

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class Judgements:
    """Labelled retrieval data (a task's --eval rows read as such): queries, the documents they search, and each
    pair's graded relevance."""

    source: str
    queries: list[str]
    documents: list[str]
    relevance: np.ndarray  # (queries, documents), 0 = not relevant

    @classmethod
    def of_pairs(cls, source: str, pairs: Iterable[tuple[str, str]], labels: Iterable[float]) -> Judgements:
        """(query, text) rows and their labels: each distinct query, in first-seen order, searches every distinct
        text; a pair's relevance is its highest label (unlisted pairs 0)."""
        pairs, labels = list(pairs), list(labels)
        queries = list(dict.fromkeys(q for q, _ in pairs))
        documents = list(dict.fromkeys(t for _, t in pairs))
        q_index, d_index = {q: i for i, q in enumerate(queries)}, {d: i for i, d in enumerate(documents)}
        relevance = np.zeros((len(queries), len(documents)), dtype=np.float64)
        for (q, t), label in zip(pairs, labels):
            relevance[q_index[q], d_index[t]] = max(relevance[q_index[q], d_index[t]], label)
        return cls(source, queries, documents, relevance)
