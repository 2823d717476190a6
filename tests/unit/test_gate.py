"""The gate's rules, and the sensitivity search's stopping behaviour."""

from __future__ import annotations

import pytest

from kiln.errors import UsageError
from kiln.optimizing.sensitivity import RankedLayer, SearchResult, exclusion_search, paying_limit
from kiln.records.figures import Agreement
from kiln.tasks import TaskName, task_spec
from kiln.validation.gate import judge, tolerance_for


def _fe(min_cos: float, mean_cos: float) -> Agreement:
    return Agreement("min_cosine", min_cos, {"min_cosine": min_cos, "mean_cosine": mean_cos}, "cosine", ())


def test_feature_extraction_needs_min_and_mean():
    assert judge(TaskName.FEATURE_EXTRACTION, _fe(0.991, 0.997), 0.01).accepted
    low_min = judge(TaskName.FEATURE_EXTRACTION, _fe(0.889, 0.943), 0.01)
    assert not low_min.accepted and low_min.reason == "min_cosine 0.8890 < 0.9900"
    low_mean = judge(TaskName.FEATURE_EXTRACTION, _fe(0.991, 0.993), 0.01)
    assert not low_mean.accepted and low_mean.reason == "mean_cosine 0.9930 < 0.9950"


def test_task_metric_drop():
    agreement = Agreement("label_agreement", 1.0, {"label_agreement": 1.0}, "agreement", ())
    verdict = judge(TaskName.TEXT_CLASSIFICATION, agreement, 0.01, metric=0.88, reference_metric=0.90)
    assert not verdict.accepted and "0.0200 below the original's 0.9000" in verdict.reason
    assert judge(TaskName.TEXT_CLASSIFICATION, agreement, 0.01, metric=0.895, reference_metric=0.90).accepted


def test_tolerance_validation():
    qa = task_spec("question-answering").validation
    assert tolerance_for(TaskName.QUESTION_ANSWERING, None) == qa.default_tolerance == 0.02
    with pytest.raises(UsageError, match=r"tolerance must be between 0 and 1 \(got 3\)"):
        tolerance_for(TaskName.FEATURE_EXTRACTION, 3)


@pytest.mark.parametrize(("needed", "expected_calls"), [
    (1, [35, 1]), (3, [35, 1, 2, 4, 3]), (5, [35, 1, 2, 4, 8, 6, 5]), (8, [35, 1, 2, 4, 8, 6, 7]),
    (35, [35, 1, 2, 4, 8, 16, 32, 33, 34]),
])
def test_search_finds_the_smallest_passing_count(needed, expected_calls):
    calls: list[int] = []

    def attempt(excluded):
        calls.append(len(excluded))
        return len(excluded) / 36, len(excluded) >= needed

    result = exclusion_search([f"layer{i}" for i in range(36)], attempt, max_share=1.0)
    assert result.accepted and len(result.excluded) == needed
    assert result.excluded == tuple(f"layer{i}" for i in range(needed))  # worst-ranked first
    assert calls == expected_calls
    assert len(calls) == len(set(calls))  # no count is attempted twice


def test_search_tries_the_most_it_may_keep_first_and_stops_there_when_it_fails():
    """The most layers allowed in fp32 hold every smaller set's layers: when they fail, nothing smaller is tried."""
    calls: list[int] = []

    def attempt(excluded):
        calls.append(len(excluded))
        return 0.5, False

    result = exclusion_search([f"layer{i}" for i in range(36)], attempt)
    assert not result.accepted and result.excluded == ()
    assert calls == [18]


def test_search_stops_where_passing_would_keep_most_layers_in_fp32():
    """By default at most half the layers are kept in fp32: a variant needing more is rejected, not searched for."""
    calls: list[int] = []

    def attempt(excluded):
        calls.append(len(excluded))
        return len(excluded) / 36, len(excluded) >= 20

    result = exclusion_search([f"layer{i}" for i in range(36)], attempt)
    assert not result.accepted and calls == [18]


def test_search_keeps_no_more_layers_in_fp32_than_can_pay():
    """The caller's limit (paying_limit) bounds the search; a limit of 0 makes no attempt at all."""
    calls: list[int] = []

    def attempt(excluded):
        calls.append(len(excluded))
        return len(excluded) / 36, len(excluded) >= 20

    result = exclusion_search([f"layer{i}" for i in range(36)], attempt, limit=6)
    assert not result.accepted and calls == [6]
    calls.clear()

    def needs_3(excluded):
        calls.append(len(excluded))
        return len(excluded) / 36, len(excluded) >= 3

    result = exclusion_search([f"layer{i}" for i in range(36)], needs_3, limit=6)
    assert result.accepted and len(result.excluded) == 3 and calls == [6, 1, 2, 4, 3]
    calls.clear()
    assert exclusion_search([f"layer{i}" for i in range(36)], attempt, limit=0) == SearchResult((), (), False)
    assert calls == []


# The agreements openvino-int8-weights measured on GPT-2 small by layers kept in fp32 (benchmarks/optimize_profile.py
# after14: 0 -> 0.9340 ... 21 -> 0.9548), filled in linearly between the measured counts; the floor is 0.95.
_GPT2_CURVE = {0: 0.9340, 1: 0.9332, 2: 0.9332, 4: 0.9336, 8: 0.9438, 12: 0.9483, 14: 0.9479, 15: 0.9487,
               16: 0.9536, 21: 0.9548}


def _gpt2_agreement(n: int) -> float:
    below, above = max(k for k in _GPT2_CURVE if k <= n), min(k for k in _GPT2_CURVE if k >= n)
    if below == above:
        return _GPT2_CURVE[n]
    return _GPT2_CURVE[below] + (_GPT2_CURVE[above] - _GPT2_CURVE[below]) * (n - below) / (above - below)


@pytest.mark.parametrize(("curve", "start", "expected_calls"), [
    # GPT-2 small's measured curve: the doubling took 1, 2, 4, 8, 16, 12, 14, 15, 16 after the bound.
    (_gpt2_agreement, 0.9340, [21, 1, 17, 9, 14, 15, 16]),
    # An encoder that needs one layer: found by the second attempt, as the doubling found it.
    (lambda n: 0.985 + 0.01 * (n >= 1) + 0.0002 * n, 0.985, [21, 1]),
])
def test_search_aims_at_the_floor_between_its_bracketing_attempts(curve, start, expected_calls):
    """Given the agreement with nothing in fp32 and the floor, every other attempt is where the line between the
    bracketing attempts reaches the floor; fewer attempts than doubling, the same smallest passing count."""
    calls: list[int] = []

    def attempt(excluded):
        calls.append(len(excluded))
        value = curve(len(excluded))
        return value, value >= 0.95 if start < 0.95 else value >= 0.99

    floor = 0.95 if start < 0.95 else 0.99
    result = exclusion_search([f"layer{i}" for i in range(49)], attempt, limit=21, start=start, floor=floor)
    assert result.accepted and calls == expected_calls
    assert len(result.excluded) == min(n for n in range(22) if curve(n) >= floor)
    calls.clear()
    doubled = exclusion_search([f"layer{i}" for i in range(49)], attempt, limit=21)  # no start and floor: doubling
    assert doubled.excluded == result.excluded and len(calls) >= len(expected_calls)
    if start < 0.95:
        assert calls == [21, 1, 2, 4, 8, 16, 12, 14, 15]


def test_paying_limit_predicts_time_by_the_weights_kept_in_fp32():
    head, blocks = RankedLayer("head", 0.9, 400), [RankedLayer(f"b{i}", 0.1, 100) for i in range(6)]
    # fully int8 4 ms, its float graph 10 ms and the fastest accepted too: half the gain is 7 ms, i.e. half the
    # weights (500 of 1,000) may stay in fp32.
    assert paying_limit([*blocks, head], quantized_ms=4, float_ms=10, best_ms=10) == 5
    # The head first: 400 of 1,000 weights, then one block more reaches 500.
    assert paying_limit([head, *blocks], quantized_ms=4, float_ms=10, best_ms=10) == 2
    # A faster variant accepted already (6 ms): at most (6 - 4) / 2 = 1 ms of the 6 ms span, 1/6 of the weights.
    assert paying_limit([*blocks, head], quantized_ms=4, float_ms=10, best_ms=6) == 1
    # Fully int8 is no faster than what passed already: nothing to search.
    assert paying_limit([*blocks, head], quantized_ms=7, float_ms=10, best_ms=6) == 0


def test_the_cosine_bound_is_a_tolerance_bound_on_the_log_deficits():
    """The bound holds the share it claims on draws from the fitted model, and is never above the sample's least."""
    import numpy as np

    from kiln.scoring import cosine_bound, tolerance_factor

    assert tolerance_factor(128, 0.999, 0.95) == pytest.approx(3.481, abs=0.01)  # the exact noncentral-t factor
    assert tolerance_factor(8, 0.999, 0.95) == pytest.approx(5.688, rel=0.02)
    rng = np.random.default_rng(0)
    covered = []
    for _ in range(200):  # 200 samples of 40 texts, deficits log-normal: the bound holds 99.9% in ~95% of them
        sample = 1 - np.exp(rng.normal(-5.5, 0.3, 40))
        bound = cosine_bound(sample)
        assert bound <= sample.min()
        share_reached = np.mean(1 - np.exp(rng.normal(-5.5, 0.3, 20_000)) >= bound)
        covered.append(share_reached >= 0.999)
    assert 0.9 <= np.mean(covered) <= 1.0
    assert cosine_bound(np.ones(10)) == pytest.approx(1.0)  # identical outputs: no deficit, no -inf
    assert cosine_bound(np.array([0.5, -0.9, 0.99, 0.2])) == -1.0  # an opposite vector is the lowest a cosine goes
    with pytest.raises(UsageError, match="count must be at least 3"):
        tolerance_factor(2, 0.999, 0.95)


def test_a_variant_within_the_floor_on_every_text_is_refused_when_its_short_texts_bound_is_below():
    """The gate holds what 99.9% of texts of each length are predicted to reach: short texts that all pass but
    spread widely (as all-MiniLM-L6-v2's int8 queries did) fail it, whatever the longer texts do."""
    import numpy as np

    from kiln.tasks.validation import length_bound

    rng = np.random.default_rng(1)
    tight = 1 - np.exp(rng.normal(-6.5, 0.2, 60))
    wide_short = 1 - np.exp(rng.normal(-5.2, 0.35, 30))
    assert tight.min() > 0.99 and wide_short.min() > 0.99
    lengths = [100] * 60 + [8] * 30
    bound = length_bound(np.concatenate([tight, wide_short]), lengths)
    assert bound == pytest.approx(min(length_bound(tight, [100] * 60), length_bound(wide_short, [8] * 30)))
    assert bound < 0.99 < length_bound(tight, [100] * 60)
    assert length_bound(wide_short[:7], [8] * 7) is None  # too few texts of one length to fit: the minimum holds
    agreement = Agreement("min_cosine", 0.992, {"min_cosine": 0.992, "mean_cosine": 0.996, "cosine_bound": bound},
                          "cosine", ())
    verdict = judge(TaskName.FEATURE_EXTRACTION, agreement, 0.01)
    assert not verdict.accepted and verdict.reason == f"cosine_bound {bound:.4f} < 0.9900"
    accepted = judge(TaskName.FEATURE_EXTRACTION, Agreement("min_cosine", 0.995, {
        "min_cosine": 0.995, "mean_cosine": 0.998, "cosine_bound": 0.9931}, "cosine", ()), 0.01)
    assert accepted.accepted and accepted.reason == "min_cosine 0.9950 >= 0.9900, cosine_bound 0.9931 >= 0.9900"


def test_kiln_audit_states_the_gates_bound_in_the_same_words():
    from kiln.auditing.result import AuditResult

    def result(within: bool, figures: dict[str, float]) -> AuditResult:
        return AuditResult("http://x", "openai", "feature-extraction", "m", "mean pooling", 160, 0.01, "cosine",
                           0.995 if within else 0.97, 0.998, 0.99, (), (), (), None, within, figures)

    assert result(True, {"cosine_bound": 0.9931}).verdict() == (
        "within tolerance: min cosine 0.9950 >= 0.9900, mean 0.9980; a log-normal fit puts 99.9% of texts like these, "
        "of each length, at cosine >= 0.9931 (95% confidence)")
    assert "at cosine >= 0.9412 (95% confidence); no single measured cause" in \
        result(False, {"cosine_bound": 0.9412}).verdict()
    assert result(True, {}).verdict() == "within tolerance: min cosine 0.9950 >= 0.9900, mean 0.9980"


def test_searchable_int8_variants_are_judged_after_every_other_variant():
    """So a failing int8 variant meets the fastest float variant before any search (the search is skipped when its
    fully int8 graph is no faster). torch.ao's dynamic int8 has no search, so it keeps its place."""
    from kiln.optimizing.job import judging_order

    asked = ["onnx-fp32", "onnx-int8-dynamic", "onnx-int8-dynamic-rows", "openvino-int8-static", "openvino-bf16",
             "torch-int8-dynamic", "torchscript"]
    assert judging_order(asked) == ["onnx-fp32", "openvino-bf16", "torch-int8-dynamic", "torchscript",
                                    "onnx-int8-dynamic", "onnx-int8-dynamic-rows", "openvino-int8-static"]


def test_a_decoder_is_judged_on_its_greedy_text_as_well_as_its_next_tokens():
    """A variant keeping 96% of next tokens under teacher forcing can still change most of what a user reads:
    greedy text differs for good after its first different token, so only the tokens before it count."""
    from kiln.tasks.text_generation.validation import greedy_agreement

    original = [(5, 6, 7, 8), (1, 2, 3, 4), (9, 9)]
    figures = greedy_agreement(original, [(5, 6, 7, 8), (1, 2, 0, 4), (9, 9, 3)])
    # 4 + 2 (the third token differs: the fourth, equal again, no longer counts) + 2 of 10 tokens
    assert figures == {"greedy_agreement": 0.8, "greedy_identical": 1 / 3, "greedy_tokens": 10.0}
    assert greedy_agreement(original, [(5, 6), (1, 2, 3, 4), (9, 9)])["greedy_agreement"] == 0.8  # stopped early

    def decoder(next_tokens: float, greedy: float | None) -> Agreement:
        figures = {"next_token_agreement": next_tokens, "mean_logit_cosine": 0.999}
        if greedy is not None:
            figures["greedy_agreement"] = greedy
        return Agreement("next_token_agreement", next_tokens, figures, "agreement", ())

    rejected = judge(TaskName.TEXT_GENERATION, decoder(0.96, 0.65), 0.05)
    assert not rejected.accepted and rejected.reason == "greedy_agreement 0.6500 < 0.9000"
    accepted = judge(TaskName.TEXT_GENERATION, decoder(0.96, 0.94), 0.05)
    assert accepted.accepted and "greedy_agreement 0.9400 >= 0.9000" in accepted.reason
    # Figures from where no continuations were made (kiln audit's, a student's before this gate) keep their floors
    assert judge(TaskName.TEXT_GENERATION, decoder(0.96, None), 0.05).accepted
