"""Long inputs as overlapping token windows, for tasks that pool one result from several (embeddings, labels).

A text longer than ``size`` tokens becomes windows of ``size`` tokens of text (special tokens added to each),
each starting ``size - overlap`` tokens after the previous one: the tokenizer cuts them from one encoding of
the whole text (its truncation with a stride), so no token is lost and only ``overlap`` tokens are repeated.
Each window knows its character span in the original text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tokenizers import Encoding

from kiln.errors import UsageError
from kiln.runtime.features import Prepared


@dataclass(frozen=True)
class Chunking:
    size: int  # tokens of text per window (special tokens not counted)
    overlap: int = 0  # tokens each window repeats from the previous one
    mode: str | None = None  # how the windows' results combine (the task's modes; None: its default)


def as_chunking(value: Any, modes: Sequence[str]) -> Chunking | None:
    """A checked Chunking from a Chunking, a request's ChunkingModel or a dict with size, overlap and mode;
    ``modes`` are the task's ways of combining windows, the first the default."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):  # a request's ChunkingModel (kiln.tasks.wire.http)
        value = value.model_dump()
    if isinstance(value, dict) and "size" in value and set(value) <= {"size", "overlap", "mode"}:
        value = Chunking(**value)
    if not isinstance(value, Chunking):
        raise UsageError(f"chunking must be {{'size': …, 'overlap': …, 'mode': …}} or kiln.Chunking (got {value!r})")
    chunking = value if value.mode is not None else replace(value, mode=modes[0])
    if chunking.mode not in modes:
        raise UsageError(f"chunking mode must be one of: {', '.join(modes)} (got {chunking.mode!r})")
    if chunking.size < 1:
        raise UsageError(f"chunking size must be at least 1 (got {chunking.size})")
    if not 0 <= chunking.overlap < chunking.size:
        raise UsageError(f"chunking overlap must be at least 0 and less than size {chunking.size} "
                         f"(got {chunking.overlap})")
    return chunking


def chunked(inputs: Sequence[Any], encoder: Any, chunking: Chunking) -> Prepared:
    """One feature per window of each text; nothing is truncated."""
    if chunking.size > encoder.room:
        raise UsageError(f"chunking size must be at most {encoder.room}, the tokens of text that fit the model's "
                         f"window (got {chunking.size})")
    encodings: list[Encoding] = []
    owners: list[int] = []
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            raise UsageError(f"chunking splits single texts; input {i} is a {type(text).__name__}")
        windows = encoder.encode_chunks(text, size=chunking.size, overlap=chunking.overlap)
        encodings += windows
        owners += [i] * len(windows)
    return Prepared(tuple(inputs), tuple(encodings), tuple(owners), (False,) * len(inputs))


def span(encoding: Encoding) -> tuple[int, int]:
    """The character span of a window's text tokens in the original text."""
    offsets = [o for o, special in zip(encoding.offsets, encoding.special_tokens_mask) if not special]
    return (offsets[0][0], offsets[-1][1]) if offsets else (0, 0)


def by_owner(prepared: Prepared, values: Sequence[Any]) -> list[list[Any]]:
    """``values`` (one per feature) grouped per input, in window order."""
    groups: list[list[Any]] = [[] for _ in prepared.inputs]
    for owner, value in zip(prepared.owners, values):
        groups[owner].append(value)
    return groups

