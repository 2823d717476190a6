"""The inputs of tasks that take more than one text (a pair to classify, a query with the texts to rank for it, a
question with its context), and a text already tokenized."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextPair:
    """Two texts classified together (sentence pairs, NLI premise/hypothesis, query/passage)."""

    text: str
    text_pair: str


@dataclass(frozen=True)
class RerankQuery:
    """One query and the texts to rank for it."""

    query: str
    texts: tuple[str, ...]


@dataclass(frozen=True)
class QAInput:
    question: str
    context: str


@dataclass(frozen=True)
class TokenIds:
    """A text its caller tokenized: the model's own vocabulary ids, special tokens where the caller put them (what
    OpenAI's and TEI's embedding APIs accept besides text)."""

    ids: tuple[int, ...]
