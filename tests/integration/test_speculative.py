"""Speculative decoding with a draft model: the text is greedy decoding's with the target alone, whatever the draft
proposes (a distilled one-layer student, the target itself, an unrelated model with the same tokenizer), through
EOS and the token budget; a draft that cannot work is refused by name."""

from __future__ import annotations

import json

import pytest
import transformers

import kiln
from kiln.api.build import distill
from kiln.choices import ExportFormat
from kiln.data.docstrings import docstring_sentences
from kiln.decoder.speculative import Speculation, speculative_greedy
from kiln.errors import UsageError
from kiln.exporting.job import ExportConfig, run_export
from kiln.runtime.tokenization import TextEncoder
from kiln.tasks import TaskName
from kiln.testing.factory import build_tiny_model

PROMPTS = ["Return the number of items in a container, and then", "The quick", "A list of"]


def _export(directory, out):
    run_export(ExportConfig(model=str(directory), task=TaskName.TEXT_GENERATION, format=ExportFormat.ONNX,
                            output=out))
    return kiln.load(out)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, object]:
    """Predictors: a 2-layer target whose EOS is a token it often picks, its 1-layer distilled student, and an
    unrelated model of the same shape and tokenizer (another seed)."""
    root = tmp_path_factory.mktemp("speculative")
    target = _trained(build_tiny_model("gpt2", TaskName.TEXT_GENERATION, root / "target"))
    tokens = _export(target, root / "probe").generate(PROMPTS[0], max_new_tokens=24).token_ids
    eos = max(set(tokens[4:]), key=tokens[4:].count)
    for name in ("config.json", "generation_config.json"):
        if (target / name).is_file():
            config = json.loads((target / name).read_text())
            (target / name).write_text(json.dumps({**config, "eos_token_id": eos}))
    texts = root / "texts.txt"
    texts.write_text("\n".join(docstring_sentences()[:300]))
    student = distill(target, task=TaskName.TEXT_GENERATION, output=root / "student", layers=1, texts=texts,
                      epochs=2)
    other = build_tiny_model("gpt2", TaskName.TEXT_GENERATION, root / "other", seed=7)
    return {"target": _export(target, root / "target-art"), "student": _export(student.path, root / "student-art"),
            "other": _export(other, root / "other-art"), "student-art": root / "student-art",
            "target-art": root / "target-art",
            "target-dir": target, "student-dir": student.path}


def _trained(directory, steps: int = 150):
    """The tiny GPT-2 after a few seconds of language modelling on docstrings: random weights predict noise no
    student could learn; these predict text a one-layer student partly can."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    stream = np.array([i for t in docstring_sentences()[:2000] for i in tokenizer(t)["input_ids"]], dtype=np.int64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(steps):
        starts = rng.integers(0, len(stream) - 65, 16)
        x = torch.from_numpy(np.stack([stream[o : o + 64] for o in starts]))
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.mark.parametrize("draft", ["student", "target", "other"])
@pytest.mark.parametrize("draft_tokens", [1, 3, 8])
def test_output_is_the_targets_greedy_decoding(models, draft, draft_tokens):
    target = models["target"]
    for max_new in (1, 7, 30):
        want = target.generate(PROMPTS, max_new_tokens=max_new)
        got = target.generate(PROMPTS, max_new_tokens=max_new, draft=models[draft], draft_tokens=draft_tokens)
        assert got == want, (draft, draft_tokens, max_new)
    assert any(g.finish_reason == "stop" for g in target.generate(PROMPTS, max_new_tokens=30))  # EOS is reached


def test_fused_graphs_speculate_with_their_caches_cut_in_place(models, tmp_path):
    """Target and draft as fused step graphs (kiln.exporting.fused_decoder): each round's rejected guesses are cut from
    their cache buffers in place, and the text is still the target's greedy decoding."""
    from kiln.decoder.graph import CacheShape
    from kiln.decoder.steps import BufferSteps, stepper
    from kiln.engines.onnxruntime import OnnxRuntimeEngine
    from kiln.exporting.fused_decoder import build_fused_decoder

    steps = {}
    for name in ("target", "student"):
        model = transformers.AutoModelForCausalLM.from_pretrained(models[f"{name}-dir"]).eval()
        build_fused_decoder(model, tmp_path / name / "model.onnx")
        steps[name] = stepper(OnnxRuntimeEngine(tmp_path / name / "model.onnx"), CacheShape.of(model.config))
        assert isinstance(steps[name], BufferSteps)
    in_place = []
    cut = steps["target"].cut

    def counted(past, length):
        kept = cut(past, length)
        in_place.append(kept.owner is not None and kept.owner.buffers is past.owner.buffers)
        return kept
    steps["target"].cut = counted
    _speculates_as_the_target_alone(models["target"], steps)
    assert in_place and all(in_place)


def _speculates_as_the_target_alone(target, steps) -> None:
    """Speculative greedy decoding on ``steps`` (target and student steppers) gives the target's own greedy text."""
    for prompt in PROMPTS:
        want = target.generate(prompt, max_new_tokens=30).token_ids
        ids = target.encoder.encode([prompt], truncate=False)[0].ids
        got = speculative_greedy(steps["target"], steps["student"], ids, 30, frozenset(target.handler.config.eos_ids),
                                 3)
        assert tuple(got) == tuple(want), prompt


def test_openvino_steps_speculate_on_whole_buckets_with_their_caches_cut_in_place(models, tmp_path):
    """Target and draft on OpenVINO (kiln.decoder.steps.BucketSteps): every past length and every prompt the graph is
    fed is a whole bucket (few shapes, as the CPU plugin keeps memory per shape), each round's rejected guesses are
    cut from the buffers in place, and the text is still the target's greedy decoding. A state older than a cut is
    refused when stepped on again."""
    import numpy as np

    from kiln.decoder.steps import BucketSteps, stepper
    from kiln.engines.openvino import OpenVinoEngine

    graphs = {name: models[f"{name}-art"] / "onnx-fp32" / "model.onnx" for name in ("target", "student")}
    steps = {name: stepper(OpenVinoEngine(graph), models[name].engine.shape) for name, graph in graphs.items()}
    assert all(isinstance(s, BucketSteps) for s in steps.values())
    fed, in_place = [], []
    request, cut = steps["target"]._request, steps["target"].cut

    class Recorded:  # the infer request, recording the lengths it is fed
        def infer(self, feed, **kwargs):
            fed.append((feed["input_ids"].shape[1], feed["attention_mask"].shape[1]))
            return request.infer(feed, **kwargs)

    def counted(past, length):
        kept = cut(past, length)
        in_place.append(kept.owner is not None and kept.owner.bank is past.owner.bank)
        return kept
    steps["target"]._request, steps["target"].cut = Recorded(), counted
    _speculates_as_the_target_alone(models["target"], steps)
    assert in_place and all(in_place)
    bucket = BucketSteps.BUCKET
    assert fed and all(new in (1, bucket) and (total - new) % bucket == 0 for new, total in fed), fed

    target, target_steps = models["target"], steps["target"]
    ids = np.array([target.encoder.encode([PROMPTS[0]], truncate=False)[0].ids])
    width = ids.shape[1]
    _, past = target_steps.step(ids, np.ones((1, width), np.int64), np.arange(width)[None], empty_past(target_steps))
    _, later = target_steps.step(ids[:, :2], np.ones((1, width + 2), np.int64), np.arange(width, width + 2)[None], past)
    target_steps.cut(later, 2)  # below ``past``'s length: its columns after 2 are written over from here on
    with pytest.raises(RuntimeError, match="older than a cut"):
        target_steps.step(ids[:, :1], np.ones((1, width + 1), np.int64), np.array([[width]]), past)


def empty_past(steps):
    from kiln.decoder.steps import empty_past as empty

    return empty(steps.shape, 1)


def test_acceptance_follows_how_well_the_draft_knows_the_target(models):
    target = models["target"]
    steps = target.engine.steps
    runs = {}
    for name in ("target", "student", "other"):
        record = Speculation()
        for prompt in PROMPTS:
            ids = target.encoder.encode([prompt], truncate=False)[0].ids
            speculative_greedy(steps, models[name].engine.steps, ids, 30, frozenset(), 4, record)
        runs[name] = record
    assert runs["target"].acceptance == 1.0  # its own guesses: every proposal kept, k + 1 tokens per step
    assert max(runs["target"].per_round) == 5
    assert runs["target"].target_steps < runs["other"].target_steps
    assert runs["student"].acceptance > runs["other"].acceptance  # distillation taught the student the target


def test_a_draft_distilled_on_the_targets_own_text_is_accepted_more(models, tmp_path):
    """kiln distill --continuations: the teacher's greedy continuations of the training texts join them, and the
    student's guesses of the target's greedy output are kept more often than the plain student's (same texts,
    same recipe); the lineage records the data and the agreement on the teacher's own text."""
    from kiln.compress.distill import LINEAGE_FILE, OWN_TEXT_FIGURE

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(docstring_sentences()[:300]))
    events = []
    recipe = {"epochs": 6, "lr": 2e-3, "patience": 6}
    plain = distill(models["target-dir"], task=TaskName.TEXT_GENERATION, output=tmp_path / "plain", layers=1,
                    texts=texts, **recipe)
    result = distill(models["target-dir"], task=TaskName.TEXT_GENERATION, output=tmp_path / "student", layers=1,
                     texts=texts, **recipe, continuations=150,
                     progress=lambda kind, data: events.append((kind, data)))
    lineage = json.loads((result.path / LINEAGE_FILE).read_text())
    assert lineage["data"]["continuations"]["count"] == 150 and lineage["data"]["train"] == 285 + 150
    assert 0 < result.figures[OWN_TEXT_FIGURE] <= 1
    assert [d for k, d in events if k == "continuations"][-1] == {"done": 150 + 15, "total": 150 + 15}
    draft = _export(result.path, tmp_path / "art")
    target = models["target"]
    acceptance = {}
    for name, model in (("plain", _export(plain.path, tmp_path / "plain-art")), ("continuations", draft)):
        record = Speculation()
        for prompt in PROMPTS:
            ids = target.encoder.encode([prompt], truncate=False)[0].ids
            speculative_greedy(target.engine.steps, model.engine.steps, ids, 30, frozenset(), 3, record)
        acceptance[name] = record.acceptance
    assert acceptance["continuations"] > acceptance["plain"] + 0.1, acceptance


def test_continuations_are_refused_where_they_cannot_apply(tiny_model, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(docstring_sentences()[:20]))
    for model, task, count, message in (
        (tiny_model("bert", TaskName.FEATURE_EXTRACTION), TaskName.FEATURE_EXTRACTION, 5,
         "continuations adds a decoder.s own continuations .*use it with --task text-generation"),
        (tiny_model("gpt2", TaskName.TEXT_GENERATION), TaskName.TEXT_GENERATION, -1, "continuations must be 0"),
    ):
        with pytest.raises(UsageError, match=message):
            distill(model, task=task, output=tmp_path / "s", layers=1, texts=texts, continuations=count)
    assert not (tmp_path / "s").exists()


def test_drafts_that_cannot_work_are_refused(models, tiny_model):
    target, student = models["target"], models["student"]
    for options, message in [
        ({"temperature": 0.7}, "does not combine with temperature > 0"),
        ({"num_beams": 2}, "does not combine with num_beams > 1"),
        ({"repetition_penalty": 1.2, "logprobs": 1}, "does not combine with repetition_penalty, logprobs"),
        ({"draft_tokens": 0}, "draft_tokens must be between 1 and 16"),
        ({"draft_tokens": 17}, "draft_tokens must be between 1 and 16"),
    ]:
        with pytest.raises(UsageError, match=message):
            target.generate(PROMPTS[0], max_new_tokens=4, draft=student, **options)
    with pytest.raises(UsageError, match="pass a decoder's predictor"):
        target.generate(PROMPTS[0], max_new_tokens=4, draft="student")
    bert = transformers.AutoTokenizer.from_pretrained(tiny_model("bert", TaskName.FEATURE_EXTRACTION))
    swapped = kiln.load(models["student-art"])
    swapped.encoder = TextEncoder(bert.backend_tokenizer, max_length=swapped.encoder.max_length,
                                  pad_id=swapped.encoder.pad_id, input_names=swapped.encoder.input_names)
    with pytest.raises(UsageError, match="its tokenizer differs from the model's"):
        target.generate(PROMPTS[0], max_new_tokens=4, draft=swapped)


def test_gpt_neo_students_keep_their_attention_kinds(tiny_model, tmp_path):
    """GPT-Neo alternates global and local attention per layer: a student of its second layer is a local one, and
    loads (transformers rebuilds the per-layer kinds from attention_types) and exports."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(docstring_sentences()[:20]))
    result = distill(tiny_model("gpt_neo", TaskName.TEXT_GENERATION), task=TaskName.TEXT_GENERATION,
                     output=tmp_path / "student", keep_layers=[1], texts=texts, epochs=0)
    config = transformers.AutoConfig.from_pretrained(result.path)
    assert config.num_layers == 1 and config.attention_layers == ["local"]
    assert _export(result.path, tmp_path / "art").generate("A", max_new_tokens=3).token_ids


def test_sleeping_threads_answer_alike(models):
    """kiln.load(spin_wait=False) (ONNX Runtime's threads sleep between runs, for a model and its draft taking
    turns): the same tokens, with or without a draft."""
    quiet = kiln.load(models["student-art"], spin_wait=False)
    loud = kiln.load(models["student-art"])
    assert quiet.raw_engine.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    assert quiet.generate(PROMPTS, max_new_tokens=12) == loud.generate(PROMPTS, max_new_tokens=12)
