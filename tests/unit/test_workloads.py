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



def test_texts_are_cut_where_bisection_cuts_them_in_fewer_encodes():
    """Each text's cut is guessed from its words' tokens and searched from there: the most words within the target
    (what bisection finds, token counts growing with words), with a WordPiece, a byte-level BPE whose counts jump
    (letters outside its vocabulary vanish) and a Unigram tokenizer."""
    import math
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers

    from kiln.data.texts import _most_words_within, _WordCounts, builtin_sentences, texts_of_lengths
    from kiln.source.loading import bundled_model_dir

    wordpiece = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "e": 3}, [("a", "b")]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁", -1.0), ("e", -2.0), ("▁the", -1.5)], 0, False))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    words = " ".join(builtin_sentences()).split()
    rng, targets = random.Random(0), (1, 2, 3, 7, 40, 129, 300, 512, 600)
    for tokenizer in (wordpiece, bpe, unigram):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        encodes = []

        def count(text: str, tokenizer=tokenizer, encodes=encodes) -> int:
            encodes.append(text)
            return len(tokenizer.encode(text).ids)

        guesses, probes = _WordCounts(count), []
        for target in targets:
            stream = words[rng.randrange(len(words)):] + words
            lo, hi = 1, min(len(stream), target)
            while lo < hi:  # bisection
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if count(" ".join(stream[:mid])) <= target else (lo, mid - 1)
            guess = guesses.words_within(stream, target)  # each new word encoded once, alone
            before = len(encodes)
            assert _most_words_within(stream, target, count, guess) == lo
            probes.append(len(encodes) - before)
        # bisection: up to 10 each; 2 from a right guess
        assert sum(probes) <= 3 * len(probes) or tokenizer is bpe, probes
        assert all(n <= 5 + math.ceil(math.log2(t)) for n, t in zip(probes, targets)), probes
        for text, target in zip(texts_of_lengths([5, 60, 200], token_count=count), [5, 60, 200]):
            assert len(text.split()) == 1 or count(text) <= target
