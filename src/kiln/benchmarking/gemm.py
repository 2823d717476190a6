"""The GEMM bound: how fast a variant could run if it did nothing but its weight matrix multiplies.

A transformer encoder spends most of its time in the GEMMs of its dense layers (Q, K, V, attention output, the
two FFN matrices). kiln reads those GEMMs out of the variant's own graph (shape, and whether the variant runs each
in int8 or fp32), builds a graph holding only them, and times it with ONNX Runtime on the same threads, at 32
sequences of 128 tokens. Two bounds follow:

- the int8 bound: every weight GEMM in int8, the ceiling any int8 variant of this model could reach on this CPU
  (the figure issue 10 targets "70% of");
- the variant's own bound: each GEMM in the precision the variant runs it in (an int8 variant that keeps some
  layers in fp32 for fidelity is bounded by those too; an OpenVINO variant with the bf16 hint runs its float GEMMs
  in bf16).

Where the CPU has native bf16 (AVX-512 BF16, AMX), the same GEMMs are also timed in bf16, through OpenVINO's CPU
plugin (ONNX Runtime's CPU provider has no bf16 GEMM). On AMX, bf16 is not a mere fallback: on a 2-core Sapphire
Rapids Xeon openvino-bf16 ran MiniLM 3.0x faster than openvino-fp32 and beat every int8 variant, so the ceiling of
such a CPU is the faster of the int8 and bf16 bounds (``best_bound_per_s``), not the int8 one alone.

Attention scores (QK^T, softmax x V) are not weight GEMMs and are left out, as are LayerNorm, GELU and the rest:
the bounds are ceilings, never reachable, and the fraction reached says how much the other work costs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.records.bench import BF16, FP32, INT8, GemmBound

ROWS = 32 * 128  # tokens of the timed batch: 32 sequences of 128

# ONNX op type -> (precision the op runs its GEMM in, index of its weight input)
ONNX_GEMMS: dict[str, tuple[str, int]] = {
    "MatMul": (FP32, 1), "Gemm": (FP32, 1), "FusedMatMul": (FP32, 1), "Attention": (FP32, 1),
    "MatMulInteger": (INT8, 1), "DynamicQuantizeMatMul": (INT8, 1), "MatMulIntegerToFloat": (INT8, 1),
    "QAttention": (INT8, 1), "QLinearMatMul": (INT8, 3),
}
# Ops between a weight initializer and its GEMM that do not change the work (QDQ graphs dequantize int8 weights).
_PASS_THROUGH = ("Transpose", "Cast", "Identity", "DequantizeLinear")


@dataclass(frozen=True)
class WeightGemm:
    inner: int  # K: the activation's last axis
    outer: int  # N: output features
    precision: str


def onnx_weight_gemms(path: Path) -> list[WeightGemm]:
    """The weight GEMMs of an ONNX graph: nodes whose weight input is (a transposed or dequantized) initializer."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def weight(name: str) -> tuple[tuple[int, ...] | None, bool]:
        """(initializer shape, reached through DequantizeLinear) for a tensor name."""
        dequantized = False
        while name not in shapes and name in producer and producer[name].op_type in _PASS_THROUGH:
            dequantized |= producer[name].op_type == "DequantizeLinear"
            name = producer[name].input[0]
        return shapes.get(name), dequantized

    gemms = []
    for node in graph.node:
        if node.op_type not in ONNX_GEMMS or len(node.input) <= ONNX_GEMMS[node.op_type][1]:
            continue
        precision, index = ONNX_GEMMS[node.op_type]
        shape, dequantized = weight(node.input[index])
        if shape is None or len(shape) != 2:
            continue  # activation x activation (attention scores), or a batched weight kiln does not count
        gemms.append(WeightGemm(int(shape[0]), int(shape[1]), INT8 if dequantized else precision))
    return gemms


def openvino_weight_gemms(path: Path) -> list[WeightGemm]:
    """The weight GEMMs of an OpenVINO IR: MatMuls with a static 2-D second input; int8 where the activation
    arrives through a FakeQuantize (NNCF's quantized layers)."""
    import openvino as ov

    gemms = []
    for op in ov.Core().read_model(str(path)).get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        shape = op.input(1).get_partial_shape()
        if not shape.is_static or len(shape) != 2:
            continue
        k, n = (int(d) for d in shape.to_shape())
        if op.get_attributes().get("transpose_b"):
            k, n = n, k
        source = op.input(0).get_source_output().get_node().get_type_name()
        gemms.append(WeightGemm(k, n, INT8 if source == "FakeQuantize" else FP32))
    return gemms


WEIGHT_GEMMS = {".onnx": onnx_weight_gemms, ".xml": openvino_weight_gemms}


def _gemm_graph(gemms: list[WeightGemm], precision: str):
    """An ONNX model of ``gemms``, all in ``precision``, one input per inner size, one output per GEMM."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inners = sorted({g.inner for g in gemms})
    dtype = TensorProto.UINT8 if precision == INT8 else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(f"x{k}", dtype, [ROWS, k]) for k in inners]
    nodes, outputs, weights = [], [], []
    for i, g in enumerate(gemms):
        if precision == INT8:
            w = rng.integers(-127, 128, (g.inner, g.outer), dtype=np.int8)
            nodes.append(helper.make_node("MatMulInteger", [f"x{g.inner}", f"w{i}", "zp"], [f"y{i}"]))
        else:
            w = rng.standard_normal((g.inner, g.outer), dtype=np.float32)
            nodes.append(helper.make_node("MatMul", [f"x{g.inner}", f"w{i}"], [f"y{i}"]))
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.INT32 if precision == INT8
                                                     else TensorProto.FLOAT, [ROWS, g.outer]))
    if precision == INT8:
        weights.append(numpy_helper.from_array(np.array(128, dtype=np.uint8), "zp"))
    graph = helper.make_graph(nodes, "weight_gemms", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inners


def fastest_together(calls: list[Callable[[], Any]], *, budget_s: float, min_runs: int) -> float:
    """Seconds per call of the fastest round of ``calls`` run at once, each on its own thread (the runtimes release
    the GIL while they compute); one call: its fastest run."""
    from kiln.runtime.timing import time_calls

    if len(calls) == 1:
        return min(time_calls(calls[0], budget_s=budget_s, min_runs=min_runs, warmup=1))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        def together() -> None:
            for future in [pool.submit(call) for call in calls]:
                future.result()

        return min(time_calls(together, budget_s=budget_s, min_runs=min_runs, warmup=1)) / len(calls)


def time_gemms(gemms: list[WeightGemm], precision: str, threads: int, *, budget_s: float = 1.0,
               min_runs: int = 3, streams: int = 1) -> float:
    """Seconds ORT needs for ``gemms`` (all in ``precision``) on ROWS tokens with ``threads`` threads: the fastest
    run, since a bound is what the GEMMs reach when nothing else on the machine is in the way. ``streams``: that
    many sessions of ``threads // streams`` threads run the graph at once; seconds per graph."""
    import onnxruntime as ort

    model, inners = _gemm_graph(gemms, precision)
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads // streams)
    rng = np.random.default_rng(1)
    calls = []
    for _ in range(streams):
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        for k in inners:
            x = (rng.integers(0, 256, (ROWS, k), dtype=np.uint8) if precision == INT8
                 else rng.standard_normal((ROWS, k), dtype=np.float32))
            binding.bind_cpu_input(f"x{k}", x)
        for output in session.get_outputs():
            binding.bind_output(output.name, "cpu")  # left as ORT values: no copy into numpy is timed
        calls.append(lambda s=session, b=binding: s.run_with_iobinding(b))
    return fastest_together(calls, budget_s=budget_s, min_runs=min_runs)


def time_gemms_bf16(gemms: list[WeightGemm], threads: int, *, budget_s: float = 1.0, min_runs: int = 3,
                    streams: int = 1) -> float:
    """Seconds OpenVINO's CPU plugin needs for ``gemms`` in bf16 on ROWS tokens with ``threads`` threads (fastest
    run; ``streams`` as in ``time_gemms``: one model compiled with that many streams, a request on each). The
    outputs stay bf16: converting 4096 rows of every GEMM to fp32 is work the model's own graph never does (its
    GEMMs feed bf16 adds and layer norms), and would bound it too low."""
    import openvino as ov
    import openvino.opset13 as ops
    from openvino.preprocess import PrePostProcessor

    from kiln.engines.openvino import prime_numpy_views

    rng = np.random.default_rng(0)
    params = {k: ops.parameter([ROWS, k], np.float32, name=f"x{k}") for k in sorted({g.inner for g in gemms})}
    results = [ops.result(ops.matmul(params[g.inner], ops.constant(
        rng.standard_normal((g.inner, g.outer), dtype=np.float32)), False, False)) for g in gemms]
    ppp = PrePostProcessor(ov.Model(results, list(params.values()), "weight_gemms"))
    for i in range(len(results)):
        ppp.output(i).tensor().set_element_type(ov.Type.bf16)
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if streams > 1:
        config["NUM_STREAMS"] = streams
    compiled = ov.Core().compile_model(ppp.build(), "CPU", config)
    feed = {p.get_any_name(): rng.standard_normal(tuple(p.get_shape()), dtype=np.float32) for p in compiled.inputs}
    requests = [compiled.create_infer_request() for _ in range(streams)]
    prime_numpy_views(requests[0])  # the streams' requests run on threads of their own, at once
    return fastest_together([lambda r=r: r.infer(feed, share_inputs=True, share_outputs=True) for r in requests],
                            budget_s=budget_s, min_runs=min_runs)


def gemm_bound(model_path: Path, reached_per_s: float, threads: int, *, float_precision: str = FP32,
               bf16: bool = False, budget_s: float = 1.0, min_runs: int = 3,
               streams: tuple[int, ...] = (1,)) -> GemmBound | None:
    """The bound of the variant stored at ``model_path``; None where kiln cannot read its GEMMs (TorchScript).

    ``float_precision`` is what the variant's float GEMMs run in (BF16 for an OpenVINO variant with the bf16 hint);
    ``bf16`` asks for the bf16 rate too (kiln bench asks where the CPU has native bf16 and OpenVINO is installed).
    ``streams``: the GEMMs are timed as each of these many streams splitting ``threads`` (1: one session of all of
    them), and each precision's bound is the fastest: a ceiling for whichever way the variant is run."""
    import onnxruntime as ort

    reader = WEIGHT_GEMMS.get(model_path.suffix)
    gemms = reader(model_path) if reader else []
    if not gemms:
        return None
    if float_precision == BF16 and not bf16:
        raise ValueError("a variant with bf16 GEMMs is bounded by the bf16 rate: pass bf16=True")
    seconds = {p: min(time_gemms(gemms, p, threads, budget_s=budget_s, min_runs=min_runs, streams=n)
                      for n in streams) for p in (INT8, FP32)}
    kernel = f"onnxruntime {ort.__version__} MatMulInteger (u8 x s8) and MatMul (fp32)"
    if bf16:
        import openvino as ov

        seconds[BF16] = min(time_gemms_bf16(gemms, threads, budget_s=budget_s, min_runs=min_runs, streams=n)
                            for n in streams)
        kernel += f"; openvino {ov.get_version().split('-')[0]} MatMul (bf16)"
    if streams != (1,):
        kernel += f"; the fastest of {' and '.join(f'{n} x {max(1, threads // n)}' for n in streams)}"
    ops = 2 * ROWS * sum(g.inner * g.outer for g in gemms)
    by_precision = Counter()
    for g in gemms:
        by_precision[float_precision if g.precision == FP32 else g.precision] += g.inner * g.outer
    total = sum(by_precision.values())
    own_seconds = sum(seconds[p] * share / total for p, share in by_precision.items())
    sequences = ROWS // 128
    int8_bound, own_bound = sequences / seconds[INT8], sequences / own_seconds
    return GemmBound(len(gemms), sum(g.precision == INT8 for g in gemms), ops / sequences / 1e9,
                     ops / seconds[INT8] / 1e9, ops / seconds[FP32] / 1e9, int8_bound, own_bound, reached_per_s,
                     reached_per_s / int8_bound, reached_per_s / own_bound, f"{kernel}, {threads} threads",
                     ops / seconds[BF16] / 1e9 if bf16 else None, sequences / seconds[BF16] if bf16 else None)
