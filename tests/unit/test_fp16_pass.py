"""kiln's fp16 pass on a graph where one tensor feeds two nodes kept in fp32 (ONNX Runtime's converter up to 1.30
wrote one Cast per consumer under the same names, and the model would not load)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from kiln.optimizing.onnx_passes import drop_repeated_casts, to_fp16

WIDTH = 8


def _two_layer_norms_of_one_tensor() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(WIDTH, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(WIDTH, np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
             helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["a"], name="ln_a", axis=-1),
             helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["b"], name="ln_b", axis=-1,
                              epsilon=1e-3),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_fp16_of_a_tensor_two_kept_nodes_read_loads_and_matches_fp32(tmp_path):
    onnx.save(_two_layer_norms_of_one_tensor(), tmp_path / "fp32.onnx")
    to_fp16(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx")
    x = np.random.default_rng(1).standard_normal((2, WIDTH)).astype(np.float32)
    converted = onnx.load(tmp_path / "fp16.onnx")
    names = [node.name for node in converted.graph.node]
    assert len(names) == len(set(names))
    np.testing.assert_allclose(_run(converted, x), _run(onnx.load(tmp_path / "fp32.onnx"), x), atol=2e-2)


def test_repeated_casts_as_onnx_runtime_1_30_wrote_them_are_dropped_and_the_model_loads():
    """The graph ORT 1.30's converter wrote: the same Cast twice. ORT refuses it; after the pass it loads."""
    model = _two_layer_norms_of_one_tensor()
    graph = model.graph
    cast = helper.make_node("Cast", ["t"], ["t_cast"], to=TensorProto.FLOAT, name="t_cast_node")
    for node in graph.node:
        if node.op_type == "LayerNormalization":
            node.input[0] = "t_cast"
    graph.node.insert(1, cast)
    graph.node.insert(2, helper.make_node("Cast", ["t"], ["t_cast"], to=TensorProto.FLOAT, name="t_cast_node"))
    graph.value_info.extend([helper.make_tensor_value_info("t_cast", TensorProto.FLOAT, [2, WIDTH])] * 2)
    x = np.ones((2, WIDTH), np.float32)
    try:
        _run(model, x)
        raise AssertionError("ONNX Runtime loaded a graph with two nodes of one name")
    except ort.capi.onnxruntime_pybind11_state.Fail as err:
        assert "same node name" in str(err)
    assert drop_repeated_casts(graph) == 1
    assert [n.name for n in graph.node].count("t_cast_node") == 1 and len(graph.value_info) == 1
    assert _run(model, x).shape == (2, WIDTH)
    assert drop_repeated_casts(graph) == 0
