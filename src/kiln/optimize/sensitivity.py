"""Which layers int8 hurts most: an analytic per-layer error ranking, then exclusion until the gate passes.

Ranking: each quantizable MatMul's input activations are captured on calibration batches; its int8
output (weights per-channel symmetric, activations per-tensor asymmetric, ranges per batch for dynamic
quantization or over all batches for static) is compared with the fp32 output. Layers are then kept in
fp32 in order of that error (1, 2, 4, 8, … of them), each time rebuilding and re-validating the real
variant, until it passes the gate or no longer improves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.artifact.records import Round


@dataclass(frozen=True)
class SearchResult:
    excluded: tuple[str, ...]
    rounds: tuple[Round, ...]
    accepted: bool


def _fake_quant_error(x: np.ndarray, w: np.ndarray, x_range: tuple[float, float]) -> float:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    w = w.astype(np.float64)
    w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
    wq = np.clip(np.round(w / w_scale), -127, 127) * w_scale
    lo, hi = min(x_range[0], 0.0), max(x_range[1], 0.0)
    scale = max(hi - lo, 1e-12) / 255.0
    zero = np.round(-lo / scale)
    xq = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
    y = x @ w
    return float(np.linalg.norm(xq @ wq - y) / max(np.linalg.norm(y), 1e-12))


def rank_layers(graph: Path, batches: Sequence[dict[str, np.ndarray]], *, static: bool) -> list[tuple[str, float]]:
    """(node name, relative int8 output error) for every MatMul/Attention with a constant weight, worst first."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    weights = {t.name: t for t in model.graph.initializer}
    targets = [n for n in model.graph.node
               if n.op_type in ("MatMul", "Attention") and len(n.input) > 1 and n.input[1] in weights]
    existing = {o.name for o in model.graph.output}
    captured = sorted({n.input[0] for n in targets} - existing)
    for name in captured:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    runs = [dict(zip(names, session.run(None, {k: v for k, v in b.items() if k in inputs}))) for b in batches]
    layers = [(node.name, numpy_helper.to_array(weights[node.input[1]]), [r[node.input[0]] for r in runs])
              for node in targets]
    return rank_by_int8_error(layers, static=static)


def rank_by_int8_error(layers: Sequence[tuple[str, np.ndarray, Sequence[np.ndarray]]], *,
                       static: bool) -> list[tuple[str, float]]:
    """(name, mean relative int8 error) per (name, weight [in, out], captured input activations), worst first."""
    errors = []
    for name, w, acts in layers:
        global_range = (min(float(a.min()) for a in acts), max(float(a.max()) for a in acts))
        errs = [_fake_quant_error(a, w, global_range if static else (float(a.min()), float(a.max())))
                for a in acts]
        errors.append((name, float(np.mean(errs))))
    return sorted(errors, key=lambda e: -e[1])


def exclusion_search(
    ranking: list[tuple[str, float]],
    attempt: Callable[[list[str]], tuple[float, bool]],
    *, max_flat_rounds: int = 2,
) -> SearchResult:
    """Keep the worst layers in fp32 until ``attempt`` (rebuild + validate) accepts, excluding as few as found.

    The count doubles (1, 2, 4, …) until one passes, then bisects down between the last failing and the
    first passing count. The search gives up when doubling stops improving the agreement figure (by 1% of its
    distance to 1.0) twice in a row.
    The last call to ``attempt`` is always the returned exclusion set (its files are the ones on disk).
    """
    rounds: list[Round] = []
    best_value, flat = -np.inf, 0
    failing, count = 0, 1
    limit = len(ranking) - 1  # at least one layer stays quantized: excluding all is just the fp32 model

    def run(n: int) -> bool:
        value, accepted = attempt([name for name, _ in ranking[:n]])
        rounds.append(Round(n, value, accepted))
        return accepted

    while count <= limit:
        if run(count):
            break
        value = rounds[-1].agreement
        # "Helping" is relative to what is left to gain: closing 1% of the distance to 1.0. A fixed step (1e-4)
        # called every round flat on a model whose int8 error is itself ~1e-4, and gave up while it was improving.
        flat = flat + 1 if value <= best_value + 0.01 * (1.0 - best_value) else 0
        best_value = max(best_value, value)
        if flat >= max_flat_rounds or count == limit:
            return SearchResult((), tuple(rounds), False)  # excluding more layers stopped helping
        failing, count = count, min(count * 2, limit)
    else:
        return SearchResult((), tuple(rounds), False)
    passing = count
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if run(middle):
            passing = middle
        else:
            failing = middle
    if rounds[-1].excluded != passing:
        run(passing)  # rebuild the smallest passing set so its files are the last written
    return SearchResult(tuple(name for name, _ in ranking[:passing]), tuple(rounds), True)
