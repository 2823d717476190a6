"""Export to ONNX and TorchScript for every architecture, with parity and invariance against PyTorch."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import transformers

from kiln.artifact.directory import Artifact
from kiln.choices import ExportFormat, ExternalData
from kiln.errors import ParityError
from kiln.exporting.job import ExportConfig, run_export
from kiln.records.parity import ParityTolerance
from kiln.tasks import TaskName, task_spec
from kiln.tasks.generative import GenerativeTask
from kiln.testing.factory import ARCHITECTURES


def _export(model_dir, tmp_path, task=TaskName.FEATURE_EXTRACTION, fmt=ExportFormat.ONNX, **kw):
    return run_export(ExportConfig(model=str(model_dir), task=task, format=fmt, output=tmp_path / "art", **kw))


@pytest.mark.parametrize("fmt", [ExportFormat.ONNX, ExportFormat.TORCHSCRIPT])  # onnx-fused: test_generation.py
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_exports_with_parity(tiny_model, tmp_path, arch, fmt):
    result = _export(tiny_model(arch), tmp_path, fmt=fmt)
    assert result.parity.passed
    assert result.parity.max_abs_diff < 1e-4
    assert result.parity.min_cosine > 0.99999
    assert result.parity.batch_sizes == (1, 8)  # padded batches checked: batch-vs-single invariance
    Artifact.open(result.path)  # checksums verify


@pytest.mark.parametrize("task", [t for t in TaskName  # decoders: tests/integration/test_generation.py
                                  if not issubclass(task_spec(t), GenerativeTask)])
def test_every_task_exports_with_parity(tiny_model, tmp_path, task):
    result = _export(tiny_model("bert", task), tmp_path, task=task)
    assert result.parity.passed, result.parity.summary()
    record = result.manifest.variants["onnx-fp32"]
    assert record.parity.passed is True
    assert result.manifest.task.task == task.value


def test_onnx_has_dynamic_batch_and_sequence_axes(tiny_model, tmp_path):
    result = _export(tiny_model("bert"), tmp_path, opset=18)
    model = onnx.load(str(result.path / "onnx-fp32" / "model.onnx"))
    assert model.opset_import[0].version == 18
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param == "batch" and dims[1].dim_param == "sequence"


def test_int32_inputs(tiny_model, tmp_path):
    result = _export(tiny_model("bert"), tmp_path, int32_inputs=True)
    model = onnx.load(str(result.path / "onnx-fp32" / "model.onnx"))
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.INT32}
    assert result.parity.passed


def test_external_data_forced_on_a_tiny_model(tiny_model, tmp_path):
    result = _export(tiny_model("bert"), tmp_path, external_data=ExternalData.ALWAYS)
    record = result.manifest.variants["onnx-fp32"]
    assert record.files == ("onnx-fp32/model.onnx", "onnx-fp32/model.onnx.data")
    assert (result.path / "onnx-fp32" / "model.onnx.data").stat().st_size > 50_000
    assert (result.path / "onnx-fp32" / "model.onnx").stat().st_size < 50_000  # graph only
    assert result.parity.passed
    assert "onnx-fp32/model.onnx.data" in result.manifest.files


def test_a_decoders_step_graph_exports_unfolded_with_external_data(tiny_model, tmp_path):
    """The step graph is exported without constant folding (folding wrote a transposed copy of the tied output
    matrix: GPT-2 small 622 MiB of graph against 475), so the embedding is stored once, here in the side file."""
    model = tiny_model("gpt2", TaskName.TEXT_GENERATION)
    result = _export(model, tmp_path, task=TaskName.TEXT_GENERATION, external_data=ExternalData.ALWAYS)
    assert result.parity.passed, result.parity.summary()
    record = result.manifest.variants["onnx-fp32"]
    assert record.recipe[0]["constant_folding"] is False
    graph = onnx.load(str(result.path / "onnx-fp32" / "model.onnx"), load_external_data=False).graph
    config = transformers.AutoConfig.from_pretrained(model)
    vocab, width = config.vocab_size, config.n_embd
    shapes = [tuple(t.dims) for t in graph.initializer]
    assert shapes.count((vocab, width)) + shapes.count((width, vocab)) == 1


def test_parity_failure_is_an_error_and_writes_nothing(tiny_model, tmp_path):
    with pytest.raises(ParityError, match="disagrees with PyTorch beyond tolerance: max"):
        _export(tiny_model("bert"), tmp_path, tolerance=ParityTolerance(max_abs_diff=1e-12))
    assert not (tmp_path / "art").exists()
    assert list(tmp_path.iterdir()) == []  # no staging leftovers either


def test_manifest_records_source_recipe_versions_and_checksums(tiny_model, tmp_path):
    result = _export(tiny_model("roberta"), tmp_path)
    raw = json.loads((result.path / "manifest.json").read_text())
    assert raw["source"]["model_type"] == "roberta"
    assert len(raw["source"]["content_sha256"]) == 64
    assert raw["variants"]["onnx-fp32"]["recipe"][0]["pass"] == "export-onnx"
    assert {"torch", "transformers", "onnxruntime", "onnx"} <= raw["versions"].keys()
    assert "tokenizer/tokenizer.json" in raw["files"]
    assert all(len(f["sha256"]) == 64 for f in raw["files"].values())


def test_source_hash_changes_with_weights(tiny_model, tmp_path):
    from kiln.source.loading import load_source

    a = load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION).content_sha256
    b = load_source(str(tiny_model("electra")), TaskName.FEATURE_EXTRACTION).content_sha256
    assert a != b


def test_exported_artifact_predicts_like_pytorch(tiny_model, tmp_path):
    from kiln.source.loading import load_source
    from kiln.source.reference import reference_predictor

    model_dir = tiny_model("bert", TaskName.TEXT_CLASSIFICATION)
    result = _export(model_dir, tmp_path, task=TaskName.TEXT_CLASSIFICATION)
    texts = ["a short one", "a much longer sentence that forces the other rows of the batch to be padded"]
    onnx_out = Artifact.open(result.path).predictor().predict(texts, top_k=None)
    torch_out = reference_predictor(load_source(str(model_dir), TaskName.TEXT_CLASSIFICATION)).predict(
        texts, top_k=None)
    for got, want in zip(onnx_out, torch_out):
        assert [s.label for s in got] == [s.label for s in want]
        np.testing.assert_allclose([s.score for s in got], [s.score for s in want], atol=1e-5)


@pytest.mark.slow
def test_a_model_over_protobufs_2gb_limit_exports_with_external_data(tmp_path, monkeypatch):
    """Built from a config in the test, never downloaded: a 560k-token vocabulary makes one 2.3 GB tensor, as a
    262k-token Gemma's embedding table is in fp32 (two 135k-wide feed-forward layers, 553 MB tensors, took 2.6x the
    export time: torch's shape inference copies each initializer a node reads, and more nodes read them). The weights
    are copied to the side file one tensor at a time and each exporter file is deleted once copied, so the disk never
    holds them twice (a 2.2 GB copy beside a 2.2 GB export filled CI's disk once)."""
    import onnxruntime as ort
    import torch

    from kiln.exporting import onnx as kiln_onnx
    from kiln.exporting.onnx import PROTOBUF_LIMIT, export_onnx
    from kiln.model.module import TaskModule

    config = transformers.BertConfig(vocab_size=560_000, hidden_size=1024, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=4096, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    module = TaskModule(model, ("input_ids", "attention_mask"), ("last_hidden_state",))
    weights = sum(p.numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    on_disk: list[int] = []
    read = kiln_onnx._read_external

    def measured(directory, tensor):
        on_disk.append(sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()))
        return read(directory, tensor)

    monkeypatch.setattr(kiln_onnx, "_read_external", measured)
    ids = torch.randint(0, config.vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    try:
        files = export_onnx(module, (ids, mask), tmp_path / "model.onnx",
                            sequence_outputs=frozenset({"last_hidden_state"}))
        assert [f.name for f in files] == ["model.onnx", "model.onnx.data"]
        assert files[1].stat().st_size > PROTOBUF_LIMIT and files[0].stat().st_size < 10 * 1024**2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # no stray files
        assert len(on_disk) > 10 and max(on_disk) < weights + largest, (max(on_disk), weights, largest)
        with torch.no_grad():
            want = module(ids, mask)[0].numpy()
        del model, module
        session = ort.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        np.testing.assert_allclose(got, want, atol=1e-4)
    finally:  # 2.4 GB is too much to leave for pytest's three kept sessions
        for path in tmp_path.rglob("*"):
            if path.is_file():
                path.unlink()


@pytest.mark.parametrize("task", [TaskName.FEATURE_EXTRACTION, TaskName.SPARSE_EMBEDDING])
def test_a_pytorch_variant_saved_before_its_io_file_named_class_and_head_loads_the_same(tiny_model, task, tmp_path):
    """kiln_io.json used to hold only the task, inputs and outputs: such a variant still loads, its model class read
    from config.json and its graph head (SPLADE's pooling, the one head there was) from its output name."""
    import torch

    from kiln.model.module import IO_FILE, load_task_module, save_task_module
    from kiln.source.loading import load_source
    from kiln.source.reference import example_inputs, task_module

    source = load_source(str(tiny_model("bert", task)), task.value)
    module = task_module(source)
    save_task_module(module, tmp_path, task.value)
    io = json.loads((tmp_path / IO_FILE).read_text())
    assert io["head"] == task_spec(task).export.graph_head and io["model_class"] == type(source.model).__name__
    (tmp_path / IO_FILE).write_text(json.dumps({k: io[k] for k in ("task", "inputs", "outputs")}))
    legacy = load_task_module(tmp_path)
    assert legacy.head_name == task_spec(task).export.graph_head and type(legacy.model) is type(source.model)
    inputs = example_inputs(source)
    with torch.no_grad():
        for want, got in zip(module(*inputs), legacy(*inputs)):
            # reloaded weights may run another attention kernel than the loaded model: 1e-6 apart, not bit-equal
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
