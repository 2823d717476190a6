"""kiln distill: students of every architecture, training that improves agreement, output others load, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from kiln.compress.distill import LINEAGE_FILE, DistillConfig, checkpoint_dir, run_distill
from kiln.compress.student import build_student, evenly_spaced, parse_keep_layers
from kiln.data import corpus
from kiln.errors import UsageError
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import ENCODERS

RECIPE = {"epochs": 2, "batch_size": 8, "lr": 5e-4, "max_length": 48}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    path = tmp_path_factory.mktemp("distill") / "texts.txt"
    path.write_text("\n".join(corpus.sentences("calibration")[:160]) + "\n")
    return path


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_a_student_is_built_from_the_teachers_layers(tiny_model, arch):
    """Keeping every layer reproduces the teacher exactly; keeping fewer keeps those layers' weights."""
    teacher = load_source(str(tiny_model(arch)), TaskName.FEATURE_EXTRACTION).model
    depth = teacher.config.num_hidden_layers
    ids = torch.tensor([[1, 5, 9, 12, 7, 2]])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        want = teacher(**inputs).last_hidden_state
        same = build_student(teacher, tuple(range(depth)))(**inputs).last_hidden_state
        torch.testing.assert_close(same, want)
        student = build_student(teacher, (depth - 1,))
        assert student.config.num_hidden_layers == 1 and student(**inputs).last_hidden_state.shape == want.shape
    if arch != "albert":  # ALBERT shares one layer's weights over its depth: a shallower student has as many
        assert sum(p.numel() for p in student.parameters()) < sum(p.numel() for p in teacher.parameters())
        last = {k.split(f".{depth - 1}.", 1)[1]: v for k, v in teacher.state_dict().items() if f".{depth - 1}." in k}
        kept = {k.split(".0.", 1)[1]: v for k, v in student.state_dict().items() if ".0." in k}
        assert kept.keys() <= last.keys() and all(torch.equal(kept[k], last[k]) for k in kept)
        assert {k for k in last.keys() - kept.keys()} <= {"attn_norm.weight"}  # ModernBERT's first layer has none


@pytest.mark.parametrize("arch", sorted(set(ENCODERS) - {"bert"}))  # bert: the fixtures below
def test_every_architecture_distills(tiny_model, texts, arch, tmp_path):
    result = run_distill(DistillConfig(str(tiny_model(arch)), TaskName.FEATURE_EXTRACTION, tmp_path / "s", layers=1,
                                       texts=texts, recipe={**RECIPE, "epochs": 1}, threads=1))
    assert result.history and np.isfinite(result.history[0].loss) and -1 <= result.agreement <= 1
    assert load_source(str(result.path), TaskName.FEATURE_EXTRACTION).model.config.num_hidden_layers == 1


def test_layer_choices_and_their_errors():
    assert evenly_spaced(6, 3) == (0, 2, 5) and evenly_spaced(6, 6) == tuple(range(6)) and evenly_spaced(6, 1) == (5,)
    assert parse_keep_layers("0, 2,4", 6) == (0, 2, 4)
    for bad, message in (("0,6", "between 0 and 5"), ("2,1", "distinct and increasing"), ("a", "comma-separated"),
                         ("1,1", "distinct")):
        with pytest.raises(UsageError, match=message):
            parse_keep_layers(bad, 6)
    for count in (0, 7):
        with pytest.raises(UsageError, match="layers must be between 1 and the teacher's depth 6"):
            evenly_spaced(6, count)


@pytest.fixture(scope="module")
def distilled(tiny_model, texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "student"
    events = []
    result = run_distill(DistillConfig(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION, out, layers=1,
                                       texts=texts, recipe=RECIPE, threads=1),
                         lambda kind, data: events.append((kind, data)))
    return result, events


def test_distillation_moves_the_student_towards_the_teacher(distilled):
    result, events = distilled
    start = next(data for kind, data in events if kind == "start")
    epochs = [data for kind, data in events if kind == "epoch"]
    assert len(epochs) == 2 and start["held_out"] == 8 and start["train"] == 152
    # the student starts as the teacher's last layer alone and ends closer to the teacher on held-out texts
    assert result.agreement > start["agreement_before"] + 0.05
    assert result.agreement == max(e["agreement"] for e in epochs)  # the best epoch's weights are kept
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert not checkpoint_dir(result.path).exists()  # removed once the student is written


def test_the_student_is_a_model_directory_everyone_loads(distilled, tiny_model, texts):
    import transformers

    import kiln
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export

    result, _ = distilled
    lineage = json.loads((result.path / LINEAGE_FILE).read_text())
    teacher = load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION)
    assert lineage["teacher"]["content_sha256"] == teacher.content_sha256
    assert lineage["student"]["keep_layers"] == [1] and lineage["recipe"]["lr"] == RECIPE["lr"]
    assert lineage["data"]["texts"]["sha256"] and lineage["agreement"]["final"] == result.agreement
    hf = transformers.AutoModel.from_pretrained(result.path)
    assert hf.config.num_hidden_layers == 1
    art = run_export(ExportConfig(model=str(result.path), task=TaskName.FEATURE_EXTRACTION,
                                  format=ExportFormat.ONNX, output=result.path.parent / "art")).path
    got = np.stack(kiln.load(art).predict(["A short sentence.", "Another one, a little longer than that."]))
    assert got.shape == (2, hf.config.hidden_size) and np.isfinite(got).all()


def test_sentence_transformers_loads_a_student_of_minilm(tmp_path, texts):
    """The teacher's sentence-transformers modules (pooling, normalize) travel with the student."""
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "minilm-1"
    result = run_distill(DistillConfig(None, TaskName.FEATURE_EXTRACTION, out, keep_layers="5", texts=texts,
                                       recipe={"epochs": 1, "batch_size": 16, "max_length": 32}, threads=2))
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        assert (out / name).is_file()
    model = SentenceTransformer(str(out), device="cpu")
    sentences = ["The cat sat on the mat.", "Python ships its documentation."]
    theirs = model.encode(sentences, normalize_embeddings=False)
    import kiln.source.reference as reference

    ours = np.stack(reference.reference_predictor(load_source(str(out), TaskName.FEATURE_EXTRACTION)).predict(
        sentences))
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert result.parameters < result.teacher_parameters


def test_labelled_rows_train_a_classifier(tiny_model, tmp_path):
    rows = [{"text": s, "label": "POSITIVE" if i % 2 else "NEGATIVE"}
            for i, s in enumerate(corpus.sentences("calibration")[:64])]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_model("bert", TaskName.TEXT_CLASSIFICATION)
    labels = set(json.loads((model / "config.json").read_text())["id2label"].values())
    if labels != {"NEGATIVE", "POSITIVE"}:
        rows = [{**r, "label": sorted(labels)[i % 2]} for i, r in enumerate(rows)]
        train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_distill(DistillConfig(str(model), TaskName.TEXT_CLASSIFICATION, tmp_path / "s", layers=1,
                                       train=train, recipe=RECIPE, threads=1))
    assert 0 <= result.agreement <= 1 and "label_agreement" in result.figures
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "x", "label": "NOPE"}) + "\n" + json.dumps({"text": "y", "label": "NOPE"}))
    with pytest.raises(UsageError, match="label 'NOPE' is not one of the model's labels"):
        run_distill(DistillConfig(str(model), TaskName.TEXT_CLASSIFICATION, tmp_path / "s2", layers=1, train=bad,
                                  recipe=RECIPE, threads=1))


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "distill", *args], capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_bad_input_is_one_clear_error(tiny_model, texts, tmp_path):
    model = str(tiny_model("bert"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    cases = [
        ((model, "--layers", "1", "--texts", str(empty)), f"--texts file {empty} has no texts"),
        ((model, "--layers", "1", "--texts", str(tmp_path / "missing.txt")), "does not exist"),
        ((model, "--layers", "3", "--texts", str(texts)), "--layers must be between 1 and the teacher's depth 2"),
        ((model, "--layers", "1"), "kiln distill needs data"),
        ((model, "--texts", str(texts)), "give the student's layers"),
        ((model, "--layers", "1", "--texts", str(texts), "--resume"), "--resume: no checkpoint"),
        ((model, "--layers", "1", "--texts", str(texts), "--continuations", "5"),
         "--continuations adds a decoder's own continuations"),
    ]
    # Side by side: each process spends its ~5 s importing torch and transformers before it refuses.
    running = [(args, message, subprocess.Popen([sys.executable, "-m", "kiln", "distill", *args, "-o",
                                                 str(tmp_path / f"out{k}")], stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True))
               for k, (args, message) in enumerate(cases)]
    for args, message, process in running:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode != 0 and message in stderr and "Traceback" not in stderr, (args, stderr)


def test_a_decoders_student_learns_from_its_teachers_continuations_from_the_cli(tiny_model, texts, tmp_path):
    """kiln distill --continuations N --continuations-past-eos: N continuations of 64 tokens each (EOS kept), then
    the usual training; the lineage says so and gives the agreement on the teacher's own text."""
    out = tmp_path / "draft"
    done = _cli(str(tiny_model("gpt2", TaskName.TEXT_GENERATION)), "--task", "text-generation", "--layers", "1",
                "--texts", str(texts), "--epochs", "1", "--max-length", "96", "--continuations", "6",
                "--continuations-past-eos", "--threads", "1", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "the teacher's continuations: 14/14 texts" in done.stderr  # 6 training texts and the 8 held out
    lineage = json.loads((out / LINEAGE_FILE).read_text())
    assert lineage["data"]["continuations"]["count"] == 6 and lineage["data"]["continuations"]["past_eos"]
    assert lineage["data"]["train"] == 152 + 6
    assert 0 <= lineage["agreement"]["figures"]["agreement_on_teacher_text"] <= 1


def test_a_killed_run_resumes_to_the_same_weights(tiny_model, texts, tmp_path):
    """Killed mid-epoch after the first epoch's checkpoint, then --resume: the weights of an uninterrupted run."""
    from safetensors.numpy import load_file

    args = [str(tiny_model("bert")), "--layers", "1", "--texts", str(texts), "--epochs", "3", "--batch-size", "4",
            "--max-length", "48", "--threads", "1", "--log-every", "1"]
    whole = _cli(*args, "-o", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "kiln", "distill", *args, "-o", str(tmp_path / "cut")],
                               stderr=subprocess.PIPE, text=True, env=env)
    for line in process.stderr:  # progress lines: kill once epoch 2 is under way
        if "epoch 2 step 5/" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL and not (tmp_path / "cut").exists()
    assert (checkpoint_dir(tmp_path / "cut") / "last.pt").is_file()
    resumed = _cli(*args, "-o", str(tmp_path / "cut"), "--resume")
    assert resumed.returncode == 0 and "resumed after epoch 1" in resumed.stderr, resumed.stderr
    want, got = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


def test_optimize_judges_a_student_against_its_teacher(distilled, tiny_model, tmp_path):
    """A student passes the gate against itself, and is rejected when judged against its teacher (--reference)."""
    from kiln.artifact.directory import Artifact
    from kiln.optimizing.job import NothingPassed, OptimizeConfig, OptimizeJob

    result, _ = distilled
    student, teacher = str(result.path), str(tiny_model("bert"))
    alone = OptimizeJob(OptimizeConfig(model=student, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "alone",
                                       variants=("onnx-fp32",))).run()
    assert alone.best == "onnx-fp32" and not alone.reference
    said = []
    with pytest.raises(NothingPassed, match="onnx-fp32 rejected: min_cosine"):
        OptimizeJob(OptimizeConfig(model=student, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "judged",
                                   variants=("onnx-fp32", "onnx-int8-dynamic"), reference=teacher),
                    said.append).run()
    # the student itself already fails against the teacher: no int8 layer search can recover its own loss
    assert any("no precision search: the model itself (PyTorch fp32) already fails against the reference" in s
               for s in said)
    assert not any("ranking layers by quantization sensitivity" in s for s in said)
    # within a tolerance that admits the student's loss, it passes, and the artifact names its reference
    loose = OptimizeJob(OptimizeConfig(model=student, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "loose",
                                       variants=("onnx-fp32",), reference=teacher, tolerance=0.9)).run()
    assert loose.reference == teacher and "Judged and timed against" in (tmp_path / "loose" / "summary.md").read_text()
    assert Artifact.open(tmp_path / "loose").manifest.build.reference.model == teacher
    with pytest.raises(UsageError, match="its tokenizer differs"):
        OptimizeJob(OptimizeConfig(model=student, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "other",
                                   variants=("onnx-fp32",), reference=str(tiny_model("roberta")))).run()


def test_training_targets_of_tagged_words_and_answers(tiny_model):
    """--train rows become targets where they belong: a word's tag on its first sub-token, an answer's span."""
    from kiln.records.figures import EvalSet
    from kiln.source.reference import source_encoder
    from kiln.tasks import task_spec
    from kiln.tasks.validation import NO_LABEL

    source = load_source(str(tiny_model("bert", TaskName.TOKEN_CLASSIFICATION)), TaskName.TOKEN_CLASSIFICATION)
    spec, encoder = task_spec(TaskName.TOKEN_CLASSIFICATION), source_encoder(source)
    rows = EvalSet(spec.name, "test", (("Anna", "Schmidt", "visited", "antidisestablishmentarianism"),),
                   (("B-PER", "I-PER", "O", "B-ORG"),))
    inputs, labels = spec.validation.training_rows(rows)
    prepared = spec(source.task_config).features(inputs, encoder)
    targets = spec.validation.training_labels(prepared, labels, source.task_config, encoder)["logits"][0]
    encoding, names = prepared.encodings[0], source.task_config.id2label
    labelled = [(t, names[int(v)]) for t, v in enumerate(targets) if v != NO_LABEL]
    assert [name for _, name in labelled] == ["B-PER", "I-PER", "O", "B-ORG"]  # one per word, on its first piece
    words = [encoding.word_ids[t] for t, _ in labelled]
    assert words == sorted(set(words)) and all(encoding.word_ids[t - 1] != encoding.word_ids[t] for t, _ in labelled)
    assert (targets == NO_LABEL).sum() == len(encoding.ids) - 4

    source = load_source(str(tiny_model("bert", TaskName.QUESTION_ANSWERING)), TaskName.QUESTION_ANSWERING)
    spec, encoder = task_spec(TaskName.QUESTION_ANSWERING), source_encoder(source)
    from kiln.tasks.inputs import QAInput

    context = "Jean Dupont visited Paris and Lyon in the spring."
    prepared = spec(source.task_config).features([QAInput("Where did he go?", context)] * 2, encoder)
    targets = spec.validation.training_labels(prepared, [("Paris and Lyon",), ()], source.task_config, encoder)
    first, second = prepared.encodings
    start, end = int(targets["start_logits"][0]), int(targets["end_logits"][0])
    assert context[first.offsets[start][0]:first.offsets[end][1]] == "Paris and Lyon"
    assert int(targets["start_logits"][1]) == int(targets["end_logits"][1]) == 0  # no answer: the first token
    with pytest.raises(UsageError, match="answer 'Berlin' is not in its context"):
        spec.validation.training_labels(prepared, [("Berlin",), ()], source.task_config, encoder)


@pytest.mark.parametrize("task", [TaskName.TOKEN_CLASSIFICATION, TaskName.QUESTION_ANSWERING])
def test_labelled_rows_train_taggers_and_readers(tiny_model, task, tmp_path):
    sentences = corpus.sentences("calibration")[:40]
    if task is TaskName.TOKEN_CLASSIFICATION:
        rows = [{"tokens": s.split()[:12], "tags": ["B-PER" if w.istitle() else "O" for w in s.split()[:12]]}
                for s in sentences]
    else:
        rows = [{"question": "What comes first?", "context": s, "answers": [s.split()[0]]} for s in sentences]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_distill(DistillConfig(str(tiny_model("bert", task)), task, tmp_path / "s", layers=1, train=train,
                                       recipe={**RECIPE, "epochs": 1}, threads=1))
    assert 0 <= result.agreement <= 1 and result.history[0].loss > 0
