"""Task metrics: SQuAD against the official v2.0 script's rules, entity F1 from seqeval, classification scores."""

from __future__ import annotations

import collections
import re
import string

import numpy as np
import pytest

from kiln import scoring
from kiln.records.figures import EvalSet
from kiln.tasks import Entity, TaskConfig, task_spec


# The official SQuAD v2.0 evaluation script's answer functions, transcribed (evaluate-v2.0.py).
def _official_normalize(s):
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_tokens(s):
    return _official_normalize(s).split() if s else []


def _official_exact(a_gold, a_pred):
    return int(_official_normalize(a_gold) == _official_normalize(a_pred))


def _official_f1(a_gold, a_pred):
    gold_toks, pred_toks = _official_tokens(a_gold), _official_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _official(prediction, answers):
    gold = [a for a in answers if _official_normalize(a)] or [""]
    return max(_official_exact(a, prediction) for a in gold), max(_official_f1(a, prediction) for a in gold)


CASES = [
    ("The Eiffel Tower", ["Eiffel Tower"]),
    ("in 1889", ["1889", "in 1889"]),
    ("", []),
    ("Paris", []),
    ("the big red barn", ["red barn door"]),
    ("", ["the"]),  # a gold that normalises to "" is dropped, so "" is right
    ("a", ["a", "b"]),
    ("Denver Broncos", ["Denver Broncos", "Broncos"]),
    ("Broncos!", ["denver broncos"]),
    ("  extra   spaces ", ["extra spaces"]),
    ("don't", ["dont"]),
    ("New York City", ["York"]),
    ("zero overlap", ["nothing shared"]),
]


@pytest.mark.parametrize(("prediction", "answers"), CASES)
def test_squad_scorer_matches_the_official_script(prediction, answers):
    ours = scoring.squad_scores([prediction], [answers])
    em, f1 = _official(prediction, answers)
    assert ours["exact_match"] == em
    assert ours["f1"] == pytest.approx(f1, abs=1e-12)


class _TaggingPredictor:
    """Answers token-classification calls with given per-word tags (words joined by single spaces)."""

    def __init__(self, tags):
        self.tags = tags

    def predict(self, texts, **options):
        out = []
        for text, tags in zip(texts, self.tags):
            start, entities = 0, []
            for word, tag in zip(text.split(" "), tags):
                entities.append(Entity(tag, 1.0, word, start, start + len(word), index=len(entities)))
                start += len(word) + 1
            out.append(entities)
        return out


def test_entity_f1_is_seqeval():
    from seqeval.metrics import f1_score

    gold = (("B-PER", "I-PER", "O", "B-LOC"), ("B-ORG", "I-ORG", "I-ORG", "O"), ("I-PER", "I-PER", "O", "O"))
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "O"], ["B-PER", "I-PER", "O", "O"]]
    data = EvalSet("token-classification", "test", tuple(("w",) * 4 for _ in gold), gold)
    scores = task_spec("token-classification").validation.evaluate(_TaggingPredictor(pred), data)
    assert scores["f1"] == pytest.approx(f1_score([list(g) for g in gold], pred))
    # An I- without a B- opens an entity (seqeval's default, conlleval rules): the third sentence matches.
    assert scores["f1"] == pytest.approx(2 / 4)


class _LabelPredictor:
    def __init__(self, labels, id2label):
        from kiln.tasks import LabelScore

        self.results = [[LabelScore(label, 1.0)] for label in labels]
        self.config = TaskConfig("text-classification", 8, id2label=id2label)

    def predict(self, inputs, **options):
        return self.results


def test_classification_accuracy_and_mrpc_f1():
    id2label = {0: "not_equivalent", 1: "equivalent"}
    gold = ("1", "1", "0", "0", "1")  # numeric labels are read through id2label, as MRPC files hold them
    predicted = ["equivalent", "not_equivalent", "not_equivalent", "equivalent", "equivalent"]
    data = EvalSet("text-classification", "test", tuple("x" for _ in gold), gold)
    scores = task_spec("text-classification").validation.evaluate(_LabelPredictor(predicted, id2label), data)
    assert scores["accuracy"] == pytest.approx(0.6)
    assert scores["f1"] == pytest.approx(2 / 3)  # positive = label 1 ("equivalent"): tp 2, fp 1, fn 1
    assert scores["f1_macro"] == pytest.approx((2 / 3 + 1 / 2) / 2)


def test_spearman_is_scipys():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    y[:5] = y[0]  # ties
    assert scoring.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert scoring.spearman([1, 1, 1], [1, 2, 3]) == 0.0


def test_last_token_pooling_takes_each_rows_last_real_token_whichever_side_it_is_padded_on():
    from kiln.choices import Pooling
    from kiln.tasks.feature_extraction.task import POOLERS

    hidden = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    right = np.array([[1, 1, 0, 0], [1, 1, 1, 1]])  # kiln's padding: the last real token is at mask.sum() - 1
    left = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])  # a decoder's left padding: the last position
    np.testing.assert_array_equal(POOLERS[Pooling.LASTTOKEN](hidden, right), hidden[[0, 1], [1, 3]])
    np.testing.assert_array_equal(POOLERS[Pooling.LASTTOKEN](hidden, left), hidden[[0, 1], [3, 3]])
