"""Passes into OpenVINO IR: conversion from ONNX, and NNCF post-training int8 quantization."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import missing_dependency
from kiln.optimizing.sensitivity import Int8Mode, RankedLayer


def _openvino():
    try:
        import openvino as ov
    except ImportError as err:
        raise missing_dependency("openvino", "openvino", err) from err
    return ov


def convert(src: Path, dst: Path) -> dict[str, Any]:
    """ONNX -> OpenVINO IR (model.xml + model.bin), fp32 weights kept (bf16 is a run-time hint)."""
    ov = _openvino()
    model = ov.convert_model(str(src))
    ov.save_model(model, str(dst), compress_to_fp16=False)
    return {"pass": "openvino-convert", "from": "onnx", "weights": "fp32"}


def _nncf():
    """NNCF, quiet (kiln reports its own progress), or the install hint."""
    try:
        import nncf
    except ImportError as err:
        raise missing_dependency("nncf", "openvino", err) from err
    logging.getLogger("nncf").setLevel(logging.ERROR)
    return nncf


def compress_weights_int8(src: Path, dst: Path, *, ignored: Sequence[str] = ()) -> dict[str, Any]:
    """NNCF weight compression: MatMul and embedding weights stored in int8 (asymmetric, per output channel),
    activations stay float. No calibration; it pays where decoding is memory-bound (one token per step reads every
    weight), unlike an encoder's compute-bound batches."""
    ov, nncf = _openvino(), _nncf()
    model = ov.Core().read_model(str(src))
    scope = {"ignored_scope": nncf.IgnoredScope(names=list(ignored), validate=True)} if ignored else {}
    with contextlib.redirect_stdout(io.StringIO()):
        compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM, **scope)
    ov.save_model(compressed, str(dst), compress_to_fp16=False)
    return {"pass": "nncf-compress-weights", "mode": "int8_asym", "ignored": list(ignored)}


def compress_weights_int4(src: Path, dst: Path, *, group_size: int, ratio: float = 1.0,
                          ignored: Sequence[str] = ()) -> dict[str, Any]:
    """NNCF weight compression to 4 bits (symmetric, groups of ``group_size`` input channels): ``ratio`` of the
    MatMul weights in int4, the rest, the embeddings and the head in int8 (NNCF's backup mode); activations stay
    float. Data-free, as ``optimum-cli export openvino --weight-format int4`` without a dataset."""
    ov, nncf = _openvino(), _nncf()
    model = ov.Core().read_model(str(src))
    scope = {"ignored_scope": nncf.IgnoredScope(names=list(ignored), validate=True)} if ignored else {}
    with contextlib.redirect_stdout(io.StringIO()):
        compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=group_size,
                                           ratio=ratio, **scope)
    ov.save_model(compressed, str(dst), compress_to_fp16=False)
    return {"pass": "nncf-compress-weights", "mode": "int4_sym", "group_size": group_size, "ratio": ratio,
            "ignored": list(ignored)}


def quantize_int8(
    src: Path, dst: Path, batches: Sequence[dict[str, np.ndarray]], *, ignored: Sequence[str] = (),
    subset_size: int = 300, smooth_quant_alpha: float | None = None,
) -> dict[str, Any]:
    """NNCF post-training quantization with the transformer preset (keeps softmax/layer-norm paths float).

    ``smooth_quant_alpha`` overrides NNCF's SmoothQuant strength for MatMuls (how much activation range
    moves into the weights); on all-MiniLM-L6-v2 0.7 kept min cosine 0.9915 where the default gave 0.9753.
    """
    ov, nncf = _openvino(), _nncf()
    model = ov.Core().read_model(str(src))
    names = [i.get_any_name() for i in model.inputs]
    dataset = nncf.Dataset([{n: b[n] for n in names} for b in batches])
    advanced = {}
    if smooth_quant_alpha is not None:
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
        )

        advanced["advanced_parameters"] = AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=smooth_quant_alpha))
    with contextlib.redirect_stdout(io.StringIO()):  # NNCF's progress bars; kiln reports its own progress
        quantized = nncf.quantize(
            model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=subset_size,
            # validate=True: a name that is not an op of this IR is an error, never a silent no-op.
            ignored_scope=nncf.IgnoredScope(names=list(ignored), validate=True) if ignored else None, **advanced,
        )
    ov.save_model(quantized, str(dst), compress_to_fp16=False)
    return {"pass": "nncf-int8", "preset": "transformer", "calibration_batches": len(batches),
            "smooth_quant_alpha": smooth_quant_alpha if smooth_quant_alpha is not None else "nncf default",
            "excluded_nodes": list(ignored)}


def _weight_constant(op):
    """A MatMul's constant 2-D weight node (through a Convert of compressed weights), else None."""
    source = op.input_value(1).get_node()
    if source.get_type_name() == "Convert":
        source = source.input_value(0).get_node()
    if source.get_type_name() != "Constant" or len(source.get_output_shape(0)) != 2:
        return None
    return source


def _weight(op) -> np.ndarray:
    """A MatMul's constant weight as [in, out] (``_weight_constant`` found it)."""
    w = np.asarray(_weight_constant(op).get_data(), dtype=np.float32)
    return w.T if op.get_attributes().get("transpose_b") else w


def rank_ir_layers(path: Path, batches: Sequence[dict[str, np.ndarray]], *, mode: Int8Mode
                   ) -> list[RankedLayer]:
    """Every MatMul with a constant weight (by IR op name) and its relative int8 error, worst first.

    Ranks the OpenVINO model's own ops (activations captured from the IR itself), so the names handed to
    NNCF's ignored scope are names NNCF finds in the model it quantizes. Each weight is read as its error is
    measured, after the compiled model is gone: not all of them beside it.
    """
    from kiln.optimizing.sensitivity import Captured, rank_by_int8_error

    ov = _openvino()
    core = ov.Core()
    model = core.read_model(str(path))
    targets = [op for op in model.get_ordered_ops()
               if op.get_type_name() == "MatMul" and _weight_constant(op) is not None]
    # Several MatMuls may read one tensor (q, k, v): outputs are matched by the tensor's name, not position.
    model.add_outputs([op.input_value(0) for op in targets])
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    by_name = {name: out for out in compiled.outputs for name in out.get_names()}
    names = [i.get_any_name() for i in compiled.inputs]
    # share_inputs=False: the calibration batches are reused by the quantizer; OpenVINO must not write into them.
    wanted = {op.input_value(0).get_any_name() for op in targets}
    runs = []
    for b in batches:  # only the captured activations are kept, thinned to the rows the error is measured on
        result = compiled({n: b[n] for n in names}, share_inputs=False)
        runs.append({name: Captured.of(result[by_name[name]]) for name in wanted})
    del compiled
    layers = ((op.get_friendly_name(), _weight(op), [r[op.input_value(0).get_any_name()] for r in runs])
              for op in targets)
    return rank_by_int8_error(layers, mode=mode)


def fake_quantized_inputs(path: Path) -> set[str]:
    """Names of the MatMuls of an IR that NNCF quantized (a FakeQuantize feeds one of their inputs)."""
    ov = _openvino()
    model = ov.Core().read_model(str(path))
    quantized = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul":
            feeds = [op.input_value(i).get_node() for i in range(op.get_input_size())]
            if any(f.get_type_name() == "FakeQuantize" or (
                    f.get_type_name() == "Convert" and f.input_value(0).get_node().get_type_name() == "FakeQuantize")
                   for f in feeds):
                quantized.add(op.get_friendly_name())
    return quantized
