"""The benchmarks' text sets: fixed from run to run, within their token lengths, from their named sources."""

from __future__ import annotations

from kiln.data import corpus
from kiln.data.workloads import HIGH, LOW, held_out_mix, serving_mix


def words(text: str) -> int:  # a stand-in tokenizer: one token per word, two special tokens
    return len(text.split()) + 2


def test_the_benchmark_text_sets_are_fixed_and_within_their_lengths():
    held_out, serving = held_out_mix(64, words), serving_mix(64, words)
    assert held_out == held_out_mix(64, words) and serving == serving_mix(64, words)  # the same texts every run
    assert held_out != serving and len(held_out) == len(serving) == 64
    for text in held_out + serving:
        assert LOW - 1 <= words(text) <= HIGH  # cut at word boundaries: within a token of the target
    held_out_words = set(" ".join(corpus.sentences("held-out")).split())
    assert all(set(text.split()) <= held_out_words for text in held_out)
