"""Real English prose that ships with Python itself: the reference manual's topic texts (``pydoc_data``).

kiln's own 50 sentences are too few and too alike to calibrate int8 ranges on: a peer NNCF pipeline
calibrated on them reached min cosine 0.985 on unseen text against 0.994 when calibrated on text like the
test set (issue 10). The Python documentation is thousands of sentences of varied, real technical prose
that needs no download. It is split in two disjoint halves, by paragraph: one to calibrate on, one that
agreement is measured on, so a variant is always judged on text its calibration never saw.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Literal

Split = Literal["calibration", "held-out"]

_CODE_MARKS = ("::=", ">>>", "...", "def ", "class ", "import ", "=", "(", "[", "{", "\\")


def is_prose(paragraph: str) -> bool:
    """A paragraph of sentences, not a code sample, grammar rule or table."""
    words = paragraph.split()
    if len(words) < 6 or not paragraph.rstrip().endswith((".", "?", "!", ":")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    # Inline literals ("x[i]", "f()") are common in prose; a paragraph made of them is code.
    marks = sum(paragraph.count(m) for m in _CODE_MARKS)
    return letters / len(paragraph) > 0.9 and marks <= len(words) / 12


@lru_cache(maxsize=1)
def documentation_paragraphs() -> tuple[str, ...]:
    """Prose paragraphs of the running Python's reference topics, whitespace collapsed, in topic order."""
    from pydoc_data.topics import topics

    paragraphs = []
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(block.split())
            if is_prose(text):
                paragraphs.append(text)
    return tuple(paragraphs)


def paragraphs(split: Split) -> tuple[str, ...]:
    """Every other paragraph: the two splits share no paragraph and cover every topic alike."""
    every = documentation_paragraphs()
    return every[0::2] if split == "calibration" else every[1::2]


def split_sentences(paragraph: str) -> list[str]:
    """A paragraph cut at sentence ends (a full stop, ! or ? before a capital or a quote)."""
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'*])", paragraph) if s]


def sentences(split: Split) -> tuple[str, ...]:
    """The split's paragraphs cut at sentence ends."""
    return tuple(s for p in paragraphs(split) for s in split_sentences(p))


def fingerprint() -> str:
    """Short content hash, recorded in recipes: another Python version ships other documentation."""
    return hashlib.sha256("\n".join(documentation_paragraphs()).encode()).hexdigest()[:16]
