"""Each task's outputs match transformers.pipeline / sentence-transformers on the same model and inputs."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from kiln.choices import Aggregation
from kiln.data.texts import builtin_sentences
from kiln.source.loading import load_source
from kiln.source.reference import reference_predictor
from kiln.tasks import QAInput, TaskName

NER_TEXTS = ["Anna Schmidt works for Acme Corporation in Berlin.", "Jean Dupont visited Paris and Lyon.",
             "unbelievably long tokenization words", *builtin_sentences()[5:9]]


def _pipeline(task: str, model_dir, **kwargs):
    return transformers.pipeline(task, model=str(model_dir), tokenizer=str(model_dir), device="cpu", **kwargs)


@pytest.mark.slow
def test_feature_extraction_matches_sentence_transformers(minilm_dir):
    from sentence_transformers import SentenceTransformer

    texts = list(builtin_sentences()) + [" ".join(builtin_sentences())]  # the last one is truncated at 256
    st = SentenceTransformer(str(minilm_dir), device="cpu")
    expected = st.encode(texts, convert_to_numpy=True)
    predictor = reference_predictor(load_source(None, TaskName.FEATURE_EXTRACTION))
    got = np.stack(predictor.predict(texts))
    cos = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() > 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # Normalize module honoured
    np.testing.assert_allclose(got, expected, atol=2e-5)
    # normalize=False (TEI's field): the pooled vectors, before the Normalize module (its Transformer and Pooling)
    pooled = SentenceTransformer(modules=[st[0], st[1]], device="cpu").encode(texts, convert_to_numpy=True)
    raw = np.stack(predictor.predict(texts, normalize=False))
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).min() > 0.1
    np.testing.assert_allclose(raw, pooled, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "max", "mean", "lasttoken"])
def test_feature_extraction_pooling_from_sentence_transformers_config(tiny_model, tmp_path, pooling):
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    model_dir = tmp_path / "st"
    shutil.copytree(tiny_model("bert"), model_dir)
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_" + {"cls": "cls_token", "lasttoken": "lasttoken"}.get(
            pooling, pooling + "_tokens"): True}))
    (model_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    texts = list(builtin_sentences()[:12])
    expected = SentenceTransformer(str(model_dir), device="cpu").encode(texts, convert_to_numpy=True)
    source = load_source(str(model_dir), TaskName.FEATURE_EXTRACTION)
    assert source.task_config.pooling.value == pooling and not source.task_config.normalize
    got = np.stack(reference_predictor(source).predict(texts))
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "roberta", "modernbert", "nomic_bert", "gte", "jina_embeddings_v3"])
def test_text_classification_matches_pipeline(tiny_model, arch):
    model_dir = tiny_model(arch, TaskName.TEXT_CLASSIFICATION)
    texts = list(builtin_sentences()[:16])
    expected = _pipeline("text-classification", model_dir)(texts, top_k=None)
    got = reference_predictor(load_source(str(model_dir), TaskName.TEXT_CLASSIFICATION)).predict(texts, top_k=None)
    for want, have in zip(expected, got):
        assert [w["label"] for w in want] == [h.label for h in have]
        np.testing.assert_allclose([w["score"] for w in want], [h.score for h in have], atol=1e-5)
    top1 = reference_predictor(load_source(str(model_dir), TaskName.TEXT_CLASSIFICATION)).predict(texts[:3])
    assert all(len(r) == 1 for r in top1)


@pytest.mark.parametrize("strategy", list(Aggregation))
@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta", "modernbert"])
def test_token_classification_matches_pipeline(tiny_model, arch, strategy):
    model_dir = tiny_model(arch, TaskName.TOKEN_CLASSIFICATION)
    with pytest.warns() if arch != "bert" and strategy in (Aggregation.FIRST, Aggregation.AVERAGE,
                                                           Aggregation.MAX) else _nothing():
        expected = _pipeline("token-classification", model_dir, aggregation_strategy=strategy.value)(NER_TEXTS)
    predictor = reference_predictor(load_source(str(model_dir), TaskName.TOKEN_CLASSIFICATION))
    got = predictor.predict(NER_TEXTS, aggregation=strategy)
    assert sum(len(e) for e in expected) > 0  # the random head does tag something
    for want, have in zip(expected, got):
        key = "entity" if strategy is Aggregation.NONE else "entity_group"
        assert [(w[key], w["word"], w["start"], w["end"]) for w in want] == \
            [(h.label, h.word, h.start, h.end) for h in have]
        np.testing.assert_allclose([w["score"] for w in want], [h.score for h in have], atol=1e-5)
        if strategy is Aggregation.NONE:
            assert [w["index"] for w in want] == [h.index for h in have]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _brute_force_answers(start_logits, end_logits, sequence_ids, offsets, context, max_len, top_k):
    """An independent, loop-based SQuAD span search (the transformers 4 pipeline's scoring)."""
    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    allowed = [s == 1 or i == 0 for i, s in enumerate(sequence_ids)]
    start = softmax(np.where(allowed, start_logits, -10000.0))
    end = softmax(np.where(allowed, end_logits, -10000.0))
    null = start[0] * end[0]
    spans = []
    for i in range(1, len(start)):
        for j in range(i, min(len(end), i + max_len)):
            if sequence_ids[i] == 1 and sequence_ids[j] == 1:
                spans.append((start[i] * end[j], offsets[i][0], offsets[j][1]))
    spans.sort(key=lambda s: -s[0])
    return [(context[a:b], score, a, b) for score, a, b in spans[:top_k]], null


@pytest.mark.parametrize("arch", ["bert", "roberta", "modernbert"])
def test_question_answering_matches_brute_force_reference(tiny_model, arch):
    """transformers 5 dropped its QA pipeline; kiln is checked against a plain loop over every span."""
    import torch

    model_dir = tiny_model(arch, TaskName.QUESTION_ANSWERING)
    source = load_source(str(model_dir), TaskName.QUESTION_ANSWERING)
    sentences = builtin_sentences()
    pairs = [QAInput(sentences[i], " ".join(sentences[i + 10 : i + 11 + i % 9])) for i in range(0, 14, 2)]
    predictor = reference_predictor(source)
    got = predictor.predict(pairs, top_k=3, max_answer_len=10, doc_stride=32, max_seq_len=96)
    assert any(len(predictor.prepare([p], predictor.handler.options(doc_stride=32, max_seq_len=96)).encodings) > 1
               for p in pairs)  # some contexts really span several windows
    tok = source.tokenizer
    for pair, answers in zip(pairs, got):
        enc = tok(pair.question, pair.context, truncation="only_second", max_length=96, stride=32,
                  return_overflowing_tokens=True, return_offsets_mapping=True)
        candidates = []
        for w in range(len(enc["input_ids"])):
            inputs = {k: torch.tensor([enc[k][w]]) for k in source.input_names}
            with torch.no_grad():
                out = source.model(**inputs)
            found, _ = _brute_force_answers(out.start_logits[0].numpy(), out.end_logits[0].numpy(),
                                            enc.sequence_ids(w), enc["offset_mapping"][w], pair.context, 10, 3)
            candidates.extend(found)
        candidates.sort(key=lambda c: -c[1])
        assert [(a.answer, a.start, a.end) for a in answers] == [(c[0], c[2], c[3]) for c in candidates[:3]]
        np.testing.assert_allclose([a.score for a in answers], [c[1] for c in candidates[:3]], rtol=1e-4)
        assert all(pair.context[a.start : a.end] == a.answer for a in answers)


def test_question_answering_null_answer_threshold(tiny_model):
    source = load_source(str(tiny_model("bert", TaskName.QUESTION_ANSWERING)), TaskName.QUESTION_ANSWERING)
    predictor = reference_predictor(source)
    pair = [{"question": "Where is the station?", "context": builtin_sentences()[20]}]
    best = predictor.predict(pair)[0][0]
    always_null = predictor.predict(pair, allow_null=True, null_threshold=-1.0)[0][0]
    never_null = predictor.predict(pair, allow_null=True, null_threshold=1.0)[0][0]
    assert always_null.answer == "" and (always_null.start, always_null.end) == (0, 0)
    assert never_null == best and best.answer != ""


def test_question_answering_long_question_shrinks_the_stride(tiny_model):
    source = load_source(str(tiny_model("bert", TaskName.QUESTION_ANSWERING)), TaskName.QUESTION_ANSWERING)
    predictor = reference_predictor(source)
    long_question = builtin_sentences()[10]  # 33 tokens: leaves 30 of 64 for context, less than the stride
    context = " ".join(builtin_sentences()[:6])
    options = predictor.handler.options(max_seq_len=64, doc_stride=32)
    assert len(predictor.prepare([(long_question, context)], options).encodings) > 2
    answers = predictor.predict([(long_question, context)], max_seq_len=64, doc_stride=32)
    assert answers[0] and answers[0][0].answer
    from kiln.errors import UsageError

    with pytest.raises(UsageError, match="the question takes .* of the 24 tokens of a window"):
        predictor.predict([(long_question, "short context")], max_seq_len=24, doc_stride=4)
