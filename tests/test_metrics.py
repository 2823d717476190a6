"""Task metrics against hand-computed values and reference implementations."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.validation import metrics


def test_accuracy_and_f1():
    gold = ["pos", "pos", "neg", "neg", "pos"]
    pred = ["pos", "neg", "neg", "pos", "pos"]
    assert metrics.accuracy(gold, pred) == pytest.approx(0.6)
    scores = metrics.f1_scores(gold, pred)
    # pos: tp 2, fp 1, fn 1 -> 2/3; neg: tp 1, fp 1, fn 1 -> 1/2; positive class = "pos" (second sorted)
    assert scores["f1_binary"] == pytest.approx(2 / 3)
    assert scores["f1_macro"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert "f1_binary" not in metrics.f1_scores(["a", "b", "c"], ["a", "b", "b"])


def test_squad_em_f1_with_no_answer():
    scores = metrics.squad_scores(
        ["The Eiffel Tower", "in 1889", "", "Paris"],
        [["Eiffel Tower"], ["1889", "in 1889"], [], []],
    )
    # 1: exact after dropping the article; 2: exact on the second gold; 3: "" for no answer is right;
    # 4: an answer where there is none is wrong.
    assert scores["exact_match"] == pytest.approx(0.75)
    assert scores["f1"] == pytest.approx(0.75)
    partial = metrics.squad_scores(["the big red barn"], [["red barn door"]])
    assert partial["f1"] == pytest.approx(2 * (2 / 3) * (2 / 3) / (4 / 3))  # 2 common of 3 and 3 tokens


def test_entity_f1_like_seqeval():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "O"]]
    scores = metrics.entity_f1(gold, pred)
    # gold: PER(0-2), LOC(3), ORG(0-3); pred: PER(0-2) correct, ORG(3) wrong, ORG(0-2) wrong span
    assert scores["precision"] == pytest.approx(1 / 3)
    assert scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(1 / 3)
    assert metrics.entity_f1([["I-PER", "I-PER"]], [["B-PER", "I-PER"]])["f1"] == 1.0  # I- opens an entity


def test_spearman_matches_scipy():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    y[:5] = y[0]  # ties
    assert metrics.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert metrics.spearman([1, 1, 1], [1, 2, 3]) == 0.0
