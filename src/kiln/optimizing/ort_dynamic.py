"""ONNX Runtime's dynamic int8 quantizer, driven so that it holds the model's float weights once, not three times.

``onnxruntime.quantization.quantize_dynamic`` loads the model, and then its quantizer, having rewritten each Gemm as a
MatMul, saves a deep copy and reloads it for shape inference while the first load is still referenced: three copies
of the weights at once. On GPT-2 small's 652 MB fp32 graph that peaked at 2.36 GB in a process of its own, and the
exclusion search runs it on every attempt (benchmarks/optimize_profile.py: the attempt set the run's 3.36 GB peak).

Here the quantizer's reload writes the weights out to a scratch file and reads back the graph alone; the first
load is then unreferenced and freed, and only then are the weights read back from the scratch file, one tensor at a
time. Same quantizer, same options, same graph out: only the copies held at once differ. The quantizer's
constructor is ONNX Runtime's own (tested against onnxruntime 1.32, the version constraints.txt pins); where its
signature differs, the stock ``quantize_dynamic`` runs instead and the step record says so.
"""

from __future__ import annotations

import contextlib
import inspect
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# The constructor parameters this driver passes, in ONNX Runtime 1.32's order.
_QUANTIZER_PARAMETERS = ("model", "per_channel", "reduce_range", "mode", "static", "weight_qType", "activation_qType",
                         "tensors_range", "nodes_to_quantize", "nodes_to_exclude", "op_types_to_quantize",
                         "extra_options")
_WEIGHTS = "weights.data"


def lean_driver_available() -> bool:
    """Whether this onnxruntime's quantizer takes the arguments, and has the reload, this driver relies on."""
    from onnxruntime.quantization import onnx_quantizer

    if not hasattr(onnx_quantizer, "save_and_reload_model_with_shape_infer"):
        return False
    names = tuple(inspect.signature(onnx_quantizer.ONNXQuantizer.__init__).parameters)[1:]
    return names == _QUANTIZER_PARAMETERS


@contextlib.contextmanager
def _graph_only_reload(scratch: Path) -> Iterator[None]:
    """The quantizer's save-and-reload, writing the weights to ``scratch`` and reading back the graph without them.
    Patched for the length of one quantization (kiln optimize quantizes one model at a time, in one thread)."""
    import onnx
    from onnxruntime.quantization import onnx_quantizer
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    def reload(model: onnx.ModelProto) -> onnx.ModelProto:
        path = scratch / "model.onnx"
        # Writes each tensor's bytes out and drops them from ``model``: no deep copy.
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=_WEIGHTS, size_threshold=1024)
        inferred = scratch / "inferred.onnx"
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred))
        graph = onnx.load(str(inferred), load_external_data=False)
        add_infer_metadata(graph)
        return graph

    stock = onnx_quantizer.save_and_reload_model_with_shape_infer
    onnx_quantizer.save_and_reload_model_with_shape_infer = reload
    try:
        yield
    finally:
        onnx_quantizer.save_and_reload_model_with_shape_infer = stock


def quantize_dynamic_lean(src: Path, dst: Path, *, per_channel: bool, reduce_range: bool, weight_type: Any,
                          nodes_to_exclude: Sequence[str], extra_options: dict[str, Any]) -> str:
    """``quantize_dynamic(src, dst, ...)`` holding one copy of the float weights; returns which driver ran."""
    from onnxruntime.quantization import QuantizationMode, QuantType, quantize_dynamic
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer, update_opset_version
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    options = {"MatMulConstBOnly": True, **extra_options}
    if not lean_driver_available():
        quantize_dynamic(str(src), str(dst), per_channel=per_channel, reduce_range=reduce_range,
                         weight_type=weight_type, nodes_to_exclude=list(nodes_to_exclude), extra_options=options)
        return "stock"
    import onnx

    from kiln.system.memory import trim_heap

    with tempfile.TemporaryDirectory(prefix="kiln-quant-", dir=dst.parent) as scratch, \
            _graph_only_reload(Path(scratch)):
        # No name of ours holds the first load: once the constructor's reload replaces it, it is freed.
        quantizer = ONNXQuantizer(update_opset_version(load_model_with_shape_infer(src), weight_type), per_channel,
                                  reduce_range, QuantizationMode.IntegerOps, False, weight_type, QuantType.QUInt8,
                                  None, None, list(nodes_to_exclude), list(IntegerOpsRegistry), options)
        # The constructor's map of initializers still points into the first load, and keeps all of it alive; it
        # is read only inside the constructor (and by the QDQ quantizer), so it now maps the reloaded graph's.
        quantizer.initializers = {tensor.name: tensor for tensor in quantizer.model.initializer()}
        trim_heap()
        onnx.load_external_data_for_model(quantizer.model.model, scratch)
        quantizer.quantize_model()
        quantizer.model.save_model_to_file(str(dst), False)
    return "lean"
