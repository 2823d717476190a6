"""Optimization passes on their own: OpenVINO int8 layer exclusion by the IR's own names; ORT static calibration."""

from __future__ import annotations

import pytest

from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.optimize.openvino_passes import convert, fake_quantized_inputs, quantize_int8, rank_ir_layers


def test_openvino_int8_excludes_layers_by_their_ir_names(tiny_artifact, tmp_path):
    art = Artifact.open(tiny_artifact)
    encoder = art.encoder()
    batches = [encoder.collate(encoder.encode([t])) for t in builtin_sentences()[:8]]
    ir = tmp_path / "fp32" / "model.xml"
    convert(tiny_artifact / "onnx-fp32" / "model.onnx", ir)
    ranking = rank_ir_layers(ir, batches, static=True)
    assert len(ranking) == 12  # 2 layers x (q, k, v, attention output, FFN in, FFN out)
    excluded = [name for name, _ in ranking[:2]]
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

    from kiln.optimize.onnx_passes import quantize_static_int8
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
