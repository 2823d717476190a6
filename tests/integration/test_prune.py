"""kiln prune: heads and neurons cut out physically compute what closing their gates computes, importance finds
what does not matter, the pruned directory loads back, and its fast variants stay exact."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from kiln.compress.distill import DistillConfig
from kiln.compress.importance import _Gates, choose, measure
from kiln.compress.prune import PruneSettings, run_prune
from kiln.data import corpus
from kiln.errors import UsageError
from kiln.model import layout
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import ENCODERS

RECIPE = {"epochs": 1, "batch_size": 8, "lr": 5e-4, "max_length": 48}
INPUTS = {"input_ids": torch.tensor([[1, 5, 9, 12, 7, 2, 3, 4], [1, 8, 6, 2, 0, 0, 0, 0]]),
          "attention_mask": torch.tensor([[1] * 8, [1] * 4 + [0] * 4])}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prune") / "texts.txt"
    path.write_text("\n".join(corpus.sentences("calibration")[:120]) + "\n")
    return path


def _gated(model, heads, neurons):
    """The model's output with the gates of the heads and neurons *not* in ``heads``/``neurons`` closed."""
    gates = _Gates(model)
    try:
        with torch.no_grad():
            for i in range(len(gates.layers)):
                gates.head[i][[h for h in range(len(gates.head[i])) if h not in heads[i]]] = 0
                gates.ffn[i][[n for n in range(len(gates.ffn[i])) if n not in neurons[i]]] = 0
            return model(**INPUTS).last_hidden_state
    finally:
        gates.remove()


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_cutting_heads_and_neurons_equals_closing_their_gates(tiny_model, arch):
    """Each layer loses a different head and half its neurons; the smaller matrices compute what the full model
    computes with those gates at zero (MPNet's shared position bias and ModernBERT's fused QKV and GLU too)."""
    model = load_source(str(tiny_model(arch)), TaskName.FEATURE_EXTRACTION).model
    shape = layout.current_shape(model)
    heads = [tuple(h for h in range(len(shape.heads[i])) if h != i % len(shape.heads[i]))
             for i in range(len(shape.heads))]
    neurons = [tuple(range(i % 2, width, 2)) for i, width in enumerate(shape.ffn)]
    want = _gated(model, heads, neurons)
    pruned = copy.deepcopy(model)
    for layer, kept_heads, kept_neurons in zip(layout.layers(pruned), heads, neurons, strict=True):
        layout.cut_heads(pruned, layer, kept_heads)
        layout.cut_ffn(pruned, layer, kept_neurons)
    with torch.no_grad():
        got = pruned(**INPUTS).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())


def test_importance_finds_a_head_and_neurons_that_do_nothing(tiny_model):
    model = load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION).model
    model = copy.deepcopy(model)
    layer = layout.layers(model)[1]
    dim = layout.head_dim(model, layer)
    with torch.no_grad():  # head 0 of layer 1 and FFN neurons 0..9 of layer 0 no longer reach the output
        layer.attention.output.dense.weight[:, :dim] = 0
        layout.layers(model)[0].output.dense.weight[:, :10] = 0
    from kiln.records.task import TaskConfig

    scores = measure(model, [INPUTS] * 3, output_names=("last_hidden_state",), embeds=True,
                     config=TaskConfig(task="feature-extraction", max_length=64))
    assert scores.heads[1][0] == 0 and scores.heads[1][1] > 0 and scores.batches == 3
    assert np.all(scores.ffn[0][:10] == 0) and np.all(scores.ffn[0][10:] > 0)
    kept = choose(scores.heads, 0.25, scope="global")  # 1 of 4 heads: the dead one
    assert kept[1] == (1,) and kept[0] == (0, 1)
    assert choose(scores.ffn, 10 / 128, scope="global")[0] == tuple(range(10, 64))


def test_choosing_globally_or_per_layer():
    scores = (np.array([0.1, 0.2, 0.9, 0.8]), np.array([0.5, 0.6, 0.7, 0.05]))
    assert choose(scores, 0.5, scope="layer") == ((2, 3), (1, 2))
    assert choose(scores, 0.5, scope="global") == ((2, 3), (1, 2))
    assert choose(scores, 0.75, scope="global") == ((2,), (2,))  # ranked across layers
    assert choose(scores, 0.9, scope="global") == ((2,), (2,))  # every layer keeps one
    assert choose(scores, 0.0, scope="global") == ((0, 1, 2, 3), (0, 1, 2, 3))


@pytest.fixture(scope="module")
def pruned(tiny_model, texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("pruned") / "pruned"
    events = []
    result = run_prune(DistillConfig(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION, out, texts=texts,
                                     recipe=RECIPE, threads=1),
                       PruneSettings(heads=0.25, ffn=0.5), lambda kind, data: events.append((kind, data)))
    return result, events


def test_pruning_recovers_and_the_directory_loads_back(pruned, tiny_model):
    result, events = pruned
    start = next(data for kind, data in events if kind == "start")
    assert result.agreement > start["agreement_before"]  # recovery distillation helped
    lineage = json.loads((result.path / "kiln-prune.json").read_text())
    shape = layout.Shape.from_json(lineage["student"]["pruning"]["shape"])
    assert sum(len(h) for h in shape.heads) == 3 and sum(shape.ffn) == 64  # 1 of 4 heads, half of 128 neurons
    assert lineage["method"] == "prune" and lineage["student"]["pruning"]["stored_as"] == layout.CONFIG_KEY
    config = json.loads((result.path / "config.json").read_text())
    assert layout.Shape.from_json(config[layout.CONFIG_KEY]) == shape
    loaded = load_source(str(result.path), TaskName.FEATURE_EXTRACTION).model
    assert layout.current_shape(loaded) == shape
    assert sum(p.numel() for p in loaded.parameters()) == result.parameters < result.teacher_parameters


def test_the_pruned_model_equals_the_gated_teacher_before_recovery(tiny_model, texts, tmp_path):
    """Saved and loaded back without recovery training, the pruned model is the teacher with the removed heads
    and neurons gated off: nothing else changed on the way through the directory."""
    teacher = load_source(str(tiny_model("mpnet")), TaskName.FEATURE_EXTRACTION).model
    result = run_prune(DistillConfig(str(tiny_model("mpnet")), TaskName.FEATURE_EXTRACTION, tmp_path / "p",
                                     texts=texts, recipe={**RECIPE, "epochs": 0}, threads=1),
                       PruneSettings(heads=0.25, ffn=0.25))
    pruning = json.loads((result.path / "kiln-prune.json").read_text())["student"]["pruning"]
    want = _gated(teacher, pruning["shape"]["heads"], pruning["kept_ffn_neurons"])
    with torch.no_grad():
        got = load_source(str(result.path), TaskName.FEATURE_EXTRACTION).model(**INPUTS).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_pruning_the_same_share_of_every_layer_is_a_plain_transformers_model(tiny_model, texts, tmp_path):
    import transformers

    result = run_prune(DistillConfig(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION, tmp_path / "p",
                                     texts=texts, recipe={**RECIPE, "epochs": 0}, threads=1),
                       PruneSettings(ffn=0.25, scope="layer"))
    config = json.loads((result.path / "config.json").read_text())
    assert layout.CONFIG_KEY not in config and config["intermediate_size"] == 48
    model = transformers.AutoModel.from_pretrained(result.path)
    assert sum(p.numel() for p in model.parameters()) == result.parameters


def test_fast_variants_of_a_pruned_model_stay_exact(pruned, tmp_path):
    """Layers with different head counts: ORT's attention fusion (one head count for all) is left out, the
    other fusions run, and the fused graph still reproduces the pruned model."""
    from kiln.artifact.directory import Artifact
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    result, _ = pruned
    summary = OptimizeJob(OptimizeConfig(model=str(result.path), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "opt", variants=("onnx-fp32", "onnx-fused"))).run()
    outcomes = {o.name: o for o in summary.outcomes}
    assert all(outcomes[n].agreement.value > 0.9999 for n in ("onnx-fp32", "onnx-fused"))
    fused = Artifact.open(tmp_path / "opt").manifest.variants["onnx-fused"]
    assert "Attention" not in json.dumps(fused.recipe) and "SkipLayerNormalization" in json.dumps(fused.recipe)


def test_bad_settings_are_one_clear_error():
    for kwargs, message in (({"heads": 1.0}, "heads is the share to remove"), ({}, "nothing to prune"),
                            ({"ffn": 0.5, "scope": "model"}, "scope must be one of: global, layer"),
                            ({"ffn": -0.1}, "ffn is the share")):
        with pytest.raises(UsageError, match=message):
            PruneSettings(**kwargs)


def test_the_command_prunes_and_reports(tiny_model, texts, tmp_path):
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "kiln", "prune", str(tiny_model("bert")), "--texts", str(texts),
                               "--threads", "1", "--batch-size", "8", "--max-length", "48", *args], text=True,
                              capture_output=True, timeout=300)

    done = cli("--heads", "0.5", "--ffn", "0.25", "-o", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    assert "pruned: heads per layer [1, 1], FFN width per layer" in done.stderr  # 2 of 4 heads, 1 kept per layer
    assert "epoch 1: loss" in done.stderr and "agreement with the teacher" in done.stdout
    for args, message in ((("--heads", "1.5"), "--heads is the share to remove"),
                          (("--ffn", "0.5", "--scope", "model"), "Invalid value for '--scope'"),
                          ((), "nothing to prune")):
        bad = cli(*args, "-o", str(tmp_path / "bad"))
        assert bad.returncode != 0 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


@pytest.mark.parametrize("arch", sorted(set(ENCODERS) - {"bert", "mpnet"}))  # those: the tests above
def test_every_architecture_prunes_and_loads_back(tiny_model, texts, arch, tmp_path):
    result = run_prune(DistillConfig(str(tiny_model(arch)), TaskName.FEATURE_EXTRACTION, tmp_path / "p", texts=texts,
                                     recipe=RECIPE, threads=1), PruneSettings(heads=0.25, ffn=0.5))
    shape = layout.Shape.from_json(json.loads((result.path / "kiln-prune.json").read_text())["student"]["pruning"]
                                   ["shape"])
    loaded = load_source(str(result.path), TaskName.FEATURE_EXTRACTION).model
    assert layout.current_shape(loaded) == shape and result.parameters < result.teacher_parameters
    assert np.isfinite(result.history[0].loss) and -1 <= result.agreement <= 1


@pytest.mark.parametrize("task", [TaskName.TEXT_CLASSIFICATION, TaskName.TOKEN_CLASSIFICATION,
                                  TaskName.QUESTION_ANSWERING])
def test_task_heads_are_pruned_and_recovered(tiny_model, texts, task, tmp_path):
    """The head stays whole; the encoder under it shrinks, and recovery distils the task's outputs."""
    data = texts
    if task == TaskName.QUESTION_ANSWERING:
        data = tmp_path / "qa.jsonl"
        lines = texts.read_text().splitlines()[:60]
        rows = ({"question": "What is it?", "context": line, "answers": []} for line in lines)
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_prune(DistillConfig(str(tiny_model("bert", task)), task, tmp_path / "p", texts=data, recipe=RECIPE,
                                     threads=1), PruneSettings(ffn=0.5, heads=0.25))
    assert result.parameters < result.teacher_parameters and np.isfinite(result.history[0].loss)
    assert load_source(str(result.path), task).model.config.num_labels == \
        load_source(str(tiny_model("bert", task)), task).model.config.num_labels


def test_an_interrupted_prune_resumes_to_the_same_weights(tiny_model, texts, tmp_path):
    """Stopped in epoch 2 after epoch 1's checkpoint, then --resume: the importance is measured again (seeded,
    the same cut) and training goes on to the weights of an uninterrupted run."""
    from safetensors.numpy import load_file

    class Stop(Exception):
        pass

    def stop_in_epoch_two(kind, data):
        if kind == "step" and data["epoch"] == 2 and data["step"] == 3:
            raise Stop

    def config(out, resume=False):
        return DistillConfig(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION, out, texts=texts,
                             recipe={**RECIPE, "epochs": 2}, threads=1, resume=resume)

    settings = PruneSettings(heads=0.25, ffn=0.5)
    run_prune(config(tmp_path / "whole"), settings)
    with pytest.raises(Stop):
        run_prune(config(tmp_path / "cut"), settings, stop_in_epoch_two)
    assert not (tmp_path / "cut").exists()
    run_prune(config(tmp_path / "cut", resume=True), settings)
    want, got = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
