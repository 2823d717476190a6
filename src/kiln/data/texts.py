"""kiln's built-in texts (written for kiln): parity, calibration and default evaluation inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def builtin_sentences() -> tuple[str, ...]:
    text = resources.files("kiln.data").joinpath("sentences.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def joined(start: int, count: int) -> str:
    """``count`` consecutive built-in sentences from ``start`` (wrapping), as one paragraph."""
    sentences = builtin_sentences()
    return " ".join(sentences[(start + i) % len(sentences)] for i in range(count))


def parity_texts() -> list[str]:
    """Real sentences from 1 to ~50 words plus paragraphs up to ~600 words (past most models' maximum)."""
    sentences = list(builtin_sentences())
    return sentences[::2] + [joined(30, 2), joined(44, 2), joined(3, 4), joined(10, 8), joined(20, 16)]


def length_mix(count: int, low: int = 10, high: int = 200, *, seed: int = 0,
               token_count: Callable[[str], int] | None = None, source: Sequence[str] | None = None) -> list[str]:
    """``count`` texts cut from ``source`` (default: the built-in sentences), lengths uniform in [low, high]."""
    import random

    rng = random.Random(seed)
    return texts_of_lengths([rng.randint(low, high) for _ in range(count)], seed=seed, token_count=token_count,
                            source=source)


def texts_of_lengths(targets: Sequence[int], *, seed: int = 0, token_count: Callable[[str], int] | None = None,
                     source: Sequence[str] | None = None) -> list[str]:
    """One text per target length, a run of consecutive words of ``source`` (default: the built-in sentences).

    With ``token_count`` (text -> tokens, special tokens included) each text is cut to hit its target
    token length exactly where word boundaries allow; without it, at ~1.3 tokens per word.
    """
    import random

    rng = random.Random(seed)
    words = " ".join(builtin_sentences() if source is None else source).split()
    high = max(targets, default=1)
    texts = []
    counted = _WordCounts(token_count) if token_count is not None else None
    for target in targets:
        start = rng.randrange(len(words))
        stream = (words[start:] + words) * (1 + high // max(1, len(words)))
        if counted is None:
            texts.append(" ".join(stream[: max(1, round(target / 1.3))]))
            continue
        cut = _most_words_within(stream, target, counted.count, guess=counted.words_within(stream, target))
        texts.append(" ".join(stream[:cut]))
    return texts


class _WordCounts:
    """A text's tokens estimated as the sum of its words' (each encoded once, after a space as inside a text): exact
    where the tokenizer splits at spaces first and a word's tokens do not depend on its neighbours (WordPiece; byte-
    level BPE but for the text's first word). Only the search's first guess: its probes encode the real text."""

    def __init__(self, token_count: Callable[[str], int]) -> None:
        self.count = token_count
        self.special = token_count("")
        self.tokens: dict[str, int] = {}

    def words_within(self, stream: Sequence[str], target: int) -> int:
        total = self.special
        for k, word in enumerate(stream):
            tokens = self.tokens.get(word)
            if tokens is None:
                tokens = self.tokens[word] = max(0, self.count(" " + word) - self.special)
            total += tokens
            if total > target:
                return k
        return len(stream)


def _most_words_within(stream: Sequence[str], target: int, token_count: Callable[[str], int], guess: float) -> int:
    """The most words of ``stream`` whose encoding stays within ``target`` tokens (1 if even one word is over).

    A search that probes where the last probe's tokens per word put the cut (bisecting after four probes): the same
    answer as bisection (token counts grow with words), in 2 encodes from a right guess where bisection took 8-9.
    Building texts by bisection took 3.8 of a tiny model's 10 s optimize (cProfile, 7,552 encodes)."""
    lo, hi = 1, min(len(stream), target)  # a word is at least one token
    probe, probes = round(guess), 0
    while lo < hi:
        probe = min(max(probe, lo + 1), hi)
        tokens = token_count(" ".join(stream[:probe]))
        probes += 1
        if tokens <= target:
            lo = probe
        else:
            hi = probe - 1
        if probes >= 4:  # the estimates are not closing in: halve what is left
            probe = (lo + hi + 1) // 2
        else:  # where this probe's tokens per word put the target; just under it, the next word decides
            probe = probe + round((target - tokens) * probe / max(tokens, 1))
    return lo


def builtin_pairs(count: int = 16, seed: int = 0) -> list[tuple[str, str]]:
    """Sentence pairs from the built-in sentences (neighbours, and a sentence with a longer paragraph)."""
    sentences = builtin_sentences()
    n = len(sentences)
    return [(sentences[(seed + 5 * i) % n],
             sentences[(seed + 5 * i + 1) % n] if i % 2 else joined(seed + 3 * i, 1 + i % 6)) for i in range(count)]
