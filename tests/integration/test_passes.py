"""Optimization passes on their own: OpenVINO int8 layer exclusion by the IR's own names; ORT static calibration."""

from __future__ import annotations

import pytest

from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.optimizing.openvino_passes import convert, fake_quantized_inputs, quantize_int8, rank_ir_layers
from kiln.optimizing.sensitivity import Int8Mode


def test_openvino_int8_excludes_layers_by_their_ir_names(tiny_artifact, tmp_path):
    art = Artifact.open(tiny_artifact)
    encoder = art.encoder()
    batches = [encoder.collate(encoder.encode([t])) for t in builtin_sentences()[:8]]
    ir = tmp_path / "fp32" / "model.xml"
    convert(tiny_artifact / "onnx-fp32" / "model.onnx", ir)
    ranking = rank_ir_layers(ir, batches, mode=Int8Mode.STATIC)
    assert len(ranking) == 12  # 2 layers x (q, k, v, attention output, FFN in, FFN out)
    excluded = [layer.name for layer in ranking[:2]]
    quantize_int8(ir, tmp_path / "int8" / "model.xml", batches, ignored=excluded)
    quantized = fake_quantized_inputs(tmp_path / "int8" / "model.xml")
    assert len(quantized) == 10 and not set(excluded) & quantized  # the ranked names are the IR's, and honoured
    # A name that is not an op of this IR is an error, not a silent no-op (NNCF validates the ignored scope).
    with pytest.raises(Exception, match="no-such-layer"):
        quantize_int8(ir, tmp_path / "bad" / "model.xml", batches, ignored=["no-such-layer"])


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_onnx_static_int8_calibrates_on_batches_of_different_lengths(tiny_artifact, tmp_path, method):
    """ORT's histogram calibrators stacked every batch into one array and failed on mixed lengths (issue 10)."""
    import onnx

    from kiln.optimizing.onnx_passes import quantize_static_int8
    from kiln.system.cpu import cpu_info, int8_scheme

    art = Artifact.open(tiny_artifact)
    encoder = art.encoder()
    batches = [encoder.collate(encoder.encode([t])) for t in builtin_sentences()[:6]]
    assert len({b["input_ids"].shape[1] for b in batches}) > 1
    step = quantize_static_int8(tiny_artifact / "onnx-fp32" / "model.onnx", tmp_path / "model.onnx", batches,
                                int8_scheme(cpu_info()), method=method)
    assert step["calibration"] == method
    ops = {n.op_type for n in onnx.load(str(tmp_path / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


@pytest.fixture(scope="module")
def gpt2_export(tiny_model, tmp_path_factory):
    """The tiny GPT-2's exported step graph (its Conv1D layers are Gemm nodes)."""
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.tasks import TaskName

    art = tmp_path_factory.mktemp("passes-gpt2") / "art"
    run_export(ExportConfig(model=str(tiny_model("gpt2", TaskName.TEXT_GENERATION)), task=TaskName.TEXT_GENERATION,
                            format=ExportFormat.ONNX, output=art))
    return art


def test_onnx_ranking_counts_gemm_layers_as_the_quantizer_does(gpt2_export):
    """GPT-2's Conv1D layers export as Gemm: ranking MatMuls alone left only the head, so the search never ran."""
    import onnx

    from kiln.optimizing.sensitivity import rank_layers
    from kiln.tasks import task_handler

    art = gpt2_export
    graph = art / "onnx-fp32" / "model.onnx"
    gemms = [n.name for n in onnx.load(str(graph)).graph.node if n.op_type == "Gemm"]
    assert gemms  # the premise: this export has Gemm layers
    opened = Artifact.open(art)
    encoder, handler = opened.encoder(), task_handler(opened.task_config)
    batches = [handler.graph_feed(encoder.collate(encoder.encode([t]))) for t in builtin_sentences()[:3]]
    ranked = {r.name: r.error for r in rank_layers(graph, batches, mode=Int8Mode.DYNAMIC)}
    assert set(gemms) <= set(ranked) and all(e > 0 for e in ranked.values())


def test_weight_only_ranking_ignores_activation_outliers():
    """A layer whose inputs have one huge outlier loses most under per-tensor activation int8, and nothing more
    under weight-only int8 than a layer without: each scheme ranks the error its variant makes."""
    import numpy as np

    from kiln.optimizing.sensitivity import Captured, rank_by_int8_error

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (64, 32)).astype(np.float32)
    calm = rng.normal(0, 1, (100, 64)).astype(np.float32)
    spiky = calm.copy()
    spiky[0, 0] = 500.0  # one outlier widens the activation range 100-fold
    layers = [("calm", w, [Captured.of(calm)]), ("spiky", w, [Captured.of(spiky)])]
    dynamic = {r.name: r.error for r in rank_by_int8_error(layers, mode=Int8Mode.DYNAMIC)}
    weights = {r.name: r.error for r in rank_by_int8_error(layers, mode=Int8Mode.WEIGHTS)}
    assert dynamic["spiky"] > 10 * dynamic["calm"]
    assert weights["spiky"] < 2 * weights["calm"] and weights["calm"] < dynamic["calm"]
    assert rank_by_int8_error(layers, mode=Int8Mode.DYNAMIC)[0].name == "spiky"
    assert {r.weights for r in rank_by_int8_error(layers, mode=Int8Mode.DYNAMIC)} == {64 * 32}


def test_dynamic_int8_keeps_excluded_gemm_layers_in_fp32(gpt2_export, tmp_path):
    """ORT renames a Gemm to "<name>_MatMul" before it matches exclusions: kiln's Gemm names must still hold."""
    import onnx

    from kiln.optimizing.onnx_passes import quantize_dynamic_int8
    from kiln.system.cpu import cpu_info, int8_scheme

    graph = gpt2_export / "onnx-fp32" / "model.onnx"
    gemms = [n.name for n in onnx.load(str(graph)).graph.node if n.op_type == "Gemm"]

    def integer_matmuls(exclude: list[str]) -> int:
        quantize_dynamic_int8(graph, tmp_path / "q.onnx", int8_scheme(cpu_info()), exclude=exclude)
        return sum(n.op_type == "MatMulInteger" for n in onnx.load(str(tmp_path / "q.onnx")).graph.node)

    assert integer_matmuls(gemms[:2]) == integer_matmuls([]) - 2


@pytest.mark.parametrize("graph", ["bert", "gpt2"])
def test_lean_dynamic_int8_writes_exactly_what_onnx_runtime_writes(tiny_artifact, gpt2_export, tmp_path, graph,
                                                                   monkeypatch):
    """kiln's driver of ORT's dynamic quantizer holds the float weights once instead of three times; the graph it
    writes must be ORT's own, byte for byte, exclusions included (GPT-2's Gemm layers are excluded by the
    "<gemm>_MatMul" names the quantizer gives them)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from kiln.optimizing import ort_dynamic
    from kiln.optimizing.onnx_passes import quantize_dynamic_int8
    from kiln.system.cpu import cpu_info, int8_scheme

    src = (tiny_artifact if graph == "bert" else gpt2_export) / "onnx-fp32" / "model.onnx"
    layers = [n.name for n in onnx.load(str(src)).graph.node if n.op_type in ("MatMul", "Gemm")]
    excluded = layers[:2]
    scheme = int8_scheme(cpu_info())
    assert ort_dynamic.lean_driver_available()  # the pinned onnxruntime: the lean path is the one tested
    step = quantize_dynamic_int8(src, tmp_path / "lean.onnx", scheme, exclude=excluded)
    assert step["driver"] == "lean"
    quantize_dynamic(str(src), str(tmp_path / "stock.onnx"), per_channel=True, reduce_range=scheme.reduce_range,
                     weight_type=QuantType.QInt8 if scheme.weights_signed else QuantType.QUInt8,
                     nodes_to_exclude=[*excluded, *(f"{n}_MatMul" for n in excluded)],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True})
    lean, stock = (tmp_path / "lean.onnx").read_bytes(), (tmp_path / "stock.onnx").read_bytes()
    assert lean == stock
    ops = {n.op_type for n in onnx.load(str(tmp_path / "lean.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in ops  # the premise: something was quantized
    # The patched reload is ORT's own again afterwards, and no scratch file is left beside the output.
    from onnxruntime.quantization import onnx_quantizer, quant_utils

    assert onnx_quantizer.save_and_reload_model_with_shape_infer is quant_utils.save_and_reload_model_with_shape_infer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lean.onnx", "stock.onnx"]
    # An onnxruntime whose quantizer takes other arguments gets the stock function, and the record says so.
    monkeypatch.setattr(ort_dynamic, "lean_driver_available", lambda: False)
    assert quantize_dynamic_int8(src, tmp_path / "fallback.onnx", scheme, exclude=excluded)["driver"] == "stock"
    assert (tmp_path / "fallback.onnx").read_bytes() == stock
