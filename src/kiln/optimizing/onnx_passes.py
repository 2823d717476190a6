"""Passes on ONNX files: transformer fusion, GELU approximation, int8 (dynamic / static QDQ), fp16."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.system.cpu import Int8Scheme


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime.quantization logs generic advice ("consider pre-processing") on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


# com.microsoft fused ops whose count shows what a fusion pass achieved.
_FUSED_OPS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization",
              "BiasGelu", "FastGelu", "Gelu", "LayerNormalization", "SkipSimplifiedLayerNormalization")


@dataclass(frozen=True)
class FusionShape:
    num_heads: int
    hidden_size: int  # of the attention (heads x head size), which pruning makes smaller than the model's
    # False where layers have different head counts (kiln prune): the fusion takes one count for all layers
    # and, given the wrong one, builds Attention nodes that compute something else.
    attention: bool = True


def fuse(src: Path, dst: Path, shape: FusionShape, *, gelu_approximation: bool = False) -> dict[str, Any]:
    """ONNX Runtime's transformer fusions (attention, skip/embed layer-norm, bias-gelu) on a BERT-like graph.

    Only the Python fusions run here (opt_level 0); ONNX Runtime applies constant folding and its own
    graph optimizations when the session loads, so the file stays portable across execution providers.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = gelu_approximation
    options.enable_attention = shape.attention
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = optimize_model(str(src), model_type="bert", num_heads=shape.num_heads,
                               hidden_size=shape.hidden_size, optimization_options=options, opt_level=0)
    model.save_model_to_file(str(dst))
    counts = {op: n for op, n in model.get_fused_operator_statistics().items() if n and op in _FUSED_OPS}
    return {"pass": "ort-fusion", "gelu_approximation": gelu_approximation, "fused_ops": counts}


def quantize_dynamic_int8(
    src: Path, dst: Path, scheme: Int8Scheme, *, per_channel: bool = True, exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """Weights quantized ahead of time, activations at run time; no calibration needed."""
    import onnx
    from onnxruntime.quantization import QuantType

    from kiln.optimizing.ort_dynamic import quantize_dynamic_lean

    with _quiet_root_logger():
        driver = quantize_dynamic_lean(
            src, dst, per_channel=per_channel, reduce_range=scheme.reduce_range,
            weight_type=QuantType.QInt8 if scheme.weights_signed else QuantType.QUInt8,
            # ORT's dynamic quantizer first rewrites each Gemm as a MatMul named "<gemm>_MatMul" (and an Add), then
            # matches the exclusions against those names: a Gemm's own name excluded nothing (GPT-2's Conv1D layers).
            nodes_to_exclude=[*exclude, *(f"{name}_MatMul" for name in exclude)],
            # Fused com.microsoft ops defeat ONNX shape inference; tell the quantizer their outputs are float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
        )
    return {"pass": "ort-int8-dynamic", "per_channel": per_channel, "reduce_range": scheme.reduce_range,
            "weights": "s8" if scheme.weights_signed else "u8", "scheme_reason": scheme.reason,
            "excluded_nodes": list(exclude), "driver": driver}




class FeedReader:
    """ONNX Runtime CalibrationDataReader over pre-built input batches."""

    def __init__(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        self._batches = list(batches)
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        """ORT's strided calibration reads the batches a few at a time."""
        self._iter = iter(self._batches[start_index:end_index])


def quantize_static_int8(
    src: Path, dst: Path, batches: Sequence[dict[str, np.ndarray]], scheme: Int8Scheme, *,
    method: str = "minmax", exclude: Sequence[str] = (), cache: Path | None = None,
) -> dict[str, Any]:
    """QDQ int8 with activation ranges calibrated on real text; weights per channel, symmetric.

    Only MatMul/Gemm nodes with a constant weight are quantized: static QDQ otherwise also quantizes the
    activation-by-activation attention products, which costs far more accuracy than it gains speed
    (measured on MiniLM: min cosine 0.9855 even with every weight MatMul excluded). ``cache`` keeps the
    calibrated ranges so rebuilds with other exclusions skip calibration.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    chosen = [n for n in quantizable_nodes(src) if n not in set(exclude)]
    if not chosen:  # ORT reads an empty nodes_to_quantize as "quantize every node"
        raise ValueError("every quantizable node is excluded; nothing left to quantize")
    inputs = {i.name for i in onnx.load(str(src), load_external_data=False).graph.input}
    feeds = [{k: v for k, v in b.items() if k in inputs} for b in batches]
    with _quiet_root_logger():
        quantize_static(
            str(src), str(dst), FeedReader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
            reduce_range=scheme.reduce_range, op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_quantize=chosen,
            calibration_cache_path=str(cache) if cache else None,
            activation_type=QuantType.QInt8 if scheme.activations_signed else QuantType.QUInt8,
            weight_type=QuantType.QInt8 if scheme.weights_signed else QuantType.QUInt8,
            calibrate_method=methods[method], nodes_to_exclude=list(exclude),
            extra_options={"WeightSymmetric": True, "ActivationSymmetric": scheme.activations_signed,
                           "MatMulConstBOnly": True,
                           # Histogram calibrators stack every batch's activations into one array, which
                           # fails on batches of different lengths; one batch per collection step merges
                           # histograms instead (the min-max result is the same either way).
                           **({"CalibStridedMinMax": 1} if method != "minmax" else {})},
        )
    return {"pass": "ort-int8-static", "format": "QDQ", "calibration": method, "calibration_batches": len(feeds),
            "activations": "s8" if scheme.activations_signed else "u8",
            "weights": "s8" if scheme.weights_signed else "u8", "scheme_reason": scheme.reason,
            "excluded_nodes": list(exclude)}


# Kept in fp32 when downcasting: reductions whose fp16 range or precision is known to overflow or drift.
FP16_BLOCK_LIST = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization", "Softmax",
                   "ReduceMean", "Pow", "Sqrt", "Erf")


def to_fp16(src: Path, dst: Path, *, block_list: Sequence[str] = FP16_BLOCK_LIST) -> dict[str, Any]:
    """fp16 weights and compute with fp32 inputs/outputs, numerically sensitive ops kept in fp32."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(keep_io_types=True, op_block_list=list(block_list))
    repeated = drop_repeated_casts(model.model.graph)
    model.save_model_to_file(str(dst))
    return {"pass": "fp16", "keep_io_types": True, "op_block_list": list(block_list),
            **({"repeated_casts_dropped": repeated} if repeated else {})}


def drop_repeated_casts(graph: Any) -> int:
    """Remove Cast nodes that repeat an earlier one exactly (same name, input, output and type); returns how many.

    ONNX Runtime's fp16 converter up to 1.30 inserts one fp16->fp32 Cast per kept-in-fp32 consumer of a tensor, all
    under one node and output name: a model where one tensor feeds two such nodes then fails to load ("two nodes with
    same node name"; GTE, Jina v3 and BGE-M3 exported on an H200 machine's torch 2.11 + ORT 1.30, and a graph of two
    LayerNorms of one tensor under ORT 1.30: tests/unit/test_fp16_pass.py). 1.32 shares one Cast; this does the same."""
    seen: set[bytes] = set()
    kept, dropped = [], 0
    for node in graph.node:
        key = node.SerializeToString() if node.op_type == "Cast" else None
        if key is not None and key in seen:
            dropped += 1
            continue
        if key is not None:
            seen.add(key)
        kept.append(node)
    if dropped:
        names: set[str] = set()
        infos = [info for info in graph.value_info if not (info.name in names or names.add(info.name))]
        del graph.node[:]
        graph.node.extend(kept)
        del graph.value_info[:]
        graph.value_info.extend(infos)
    return dropped


def quantizable_nodes(path: Path) -> list[str]:
    """Nodes with a constant weight that int8 passes quantize: MatMul/Gemm, and fused Attention."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    return [n.name for n in graph.node
            if (n.op_type in ("MatMul", "Gemm") and any(i in weights for i in n.input[1:2]))
            or n.op_type == "Attention"]
