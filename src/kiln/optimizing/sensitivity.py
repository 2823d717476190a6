"""Which layers int8 hurts most: an analytic per-layer error ranking, then exclusion until the gate passes.

Ranking: each quantizable MatMul's (or Gemm's) input activations are captured on calibration batches; its int8
output is compared with the fp32 output, quantized the way the variant quantizes it (``Int8Mode``): weights per
output channel, and activations per tensor with ranges per batch (dynamic), over all batches (static), or not at
all (weight-only int8, whose error is the weights' alone). Layers are then kept in fp32 in order of that error,
each time rebuilding and re-validating the real variant: the most the search may keep first, and when that passes,
1, 2, 4, 8, ... of them until one passes (``exclusion_search``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kiln.choices import Choice
from kiln.records.artifact import Round

# Rows of captured activations each batch contributes to a layer's error: the ranking needs the error's size, not
# every token, and a 50k-vocabulary head over all of a decoder's calibration tokens is gigabytes in float64.
MAX_ROWS = 256


class Int8Mode(Choice):
    """How the ranked variant quantizes a layer, so the ranking measures the error that variant makes."""

    DYNAMIC = "dynamic"  # int8 weights (symmetric) and activations with each batch's own range
    STATIC = "static"  # int8 weights (symmetric) and activations with one range calibrated over every batch
    WEIGHTS = "weights"  # int8 weights only (asymmetric, as NNCF's INT8_ASYM); activations stay float
    INT4_WEIGHTS = "int4-weights"  # 4-bit symmetric blocks of 32 input rows (MatMulNBits); activations stay float


class RankedLayer(NamedTuple):
    """One quantizable layer in a sensitivity ranking."""

    name: str  # as the variant's quantizer takes it in its exclusion list
    error: float  # relative int8 output error on the calibration batches
    weights: int  # its weight's parameter count: what keeping it in fp32 costs in speed (kiln.optimizing.job)


@dataclass(frozen=True)
class SearchResult:
    excluded: tuple[str, ...]
    rounds: tuple[Round, ...]
    accepted: bool


@dataclass(frozen=True)
class Captured:
    """A layer's input activations on one batch: at most MAX_ROWS evenly spaced rows (float32), and the range of
    all of them (what dynamic or static quantization would see)."""

    rows: np.ndarray
    low: float
    high: float

    @classmethod
    def of(cls, x: np.ndarray) -> Captured:
        x = x.reshape(-1, x.shape[-1])
        low, high = float(x.min()), float(x.max())
        if len(x) > MAX_ROWS:
            x = x[np.linspace(0, len(x) - 1, MAX_ROWS).astype(int)]
        return cls(np.asarray(x, np.float32), low, high)


def _asymmetric(x: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> np.ndarray:
    """``x`` rounded to 8 unsigned bits over [low, high] (widened to hold 0) and back; the range per tensor (scalars)
    or per output channel (arrays broadcast along ``x``'s last axis)."""
    low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    scale = np.maximum(high - low, 1e-12) / 255.0
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


INT4_BLOCK = 32  # input rows per 4-bit block (kiln.exporting.fused_decoder.WeightFormat's default)


def _int4_blocks(w: np.ndarray) -> np.ndarray:
    """``w`` [in, out] rounded to 4-bit symmetric blocks of INT4_BLOCK input rows per output column and back (rows
    past the last whole block stay float, as the writer leaves such a layer)."""
    if w.shape[0] % INT4_BLOCK:
        return w
    blocks = w.reshape(-1, INT4_BLOCK, w.shape[1])
    scale = np.maximum(np.abs(blocks).max(axis=1, keepdims=True), 1e-12) / 7.0
    return (np.clip(np.round(blocks / scale), -8, 7) * scale).reshape(w.shape)


def _quantized_weight(w: np.ndarray, mode: Int8Mode) -> np.ndarray:
    """``w`` [in, out] rounded to int8 per output channel and back: symmetric, or asymmetric for weight-only; or to
    4-bit blocks."""
    if mode is Int8Mode.INT4_WEIGHTS:
        return _int4_blocks(w)
    if mode is Int8Mode.WEIGHTS:
        return _asymmetric(w, w.min(axis=0), w.max(axis=0))
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
    return np.clip(np.round(w / scale), -127, 127) * scale


def _fake_quant_error(x: np.ndarray, w: np.ndarray, wq: np.ndarray, x_range: tuple[float, float] | None) -> float:
    """Relative error of the int8 layer's output on ``x``; ``x_range`` None: activations stay float."""
    xq = x if x_range is None else _asymmetric(x, *x_range).astype(np.float32)
    y = x @ w
    return float(np.linalg.norm(xq @ wq - y) / max(float(np.linalg.norm(y)), 1e-12))


def _weight_shape(node, weights: dict) -> bool:
    """Whether a MatMul's, Gemm's or Attention's second input is a constant 2-D weight."""
    return len(node.input) >= 2 and node.input[1] in weights and len(weights[node.input[1]].dims) == 2


def _transposed(node) -> bool:
    """Gemm's transB: its weight is stored [out, in]."""
    from onnx import helper

    return node.op_type == "Gemm" and any(a.name == "transB" and helper.get_attribute_value(a) for a in node.attribute)


def rank_layers(graph: Path, batches: Sequence[dict[str, np.ndarray]], *,
                mode: Int8Mode) -> list[RankedLayer]:
    """Every MatMul, Gemm or Attention with a constant weight (by node name), its relative int8 output error and its
    weight count, worst first. Gemm counts: ONNX Runtime quantizes it like a MatMul, and GPT-2's Conv1D layers
    export as Gemm (ranking MatMuls alone left only GPT-2's head to exclude, so its search never ran).

    The graph's weights are in memory once at a time: the graph with its captured activations added as outputs is
    written with its weights beside it as external data, which ``onnx.save_model`` writes tensor by tensor and drops
    from the proto as it goes; ONNX Runtime then reads that file; and the weights come back one layer at a time for
    the error. Holding the proto, its serialized copy, a session and every weight as an array at once made this the
    second-highest peak of GPT-2 small's optimize (4.4 GB; `python benchmarks/optimize_profile.py`, 2-core AMX Xeon).
    """
    import onnx
    import onnxruntime as ort
    from onnx import external_data_helper, numpy_helper

    with tempfile.TemporaryDirectory(prefix="kiln-rank-") as scratch:
        probe = Path(scratch) / "model.onnx"
        model = onnx.load(str(graph))
        weights = {t.name: t for t in model.graph.initializer}
        targets = [(n.name, n.input[0], n.input[1], _transposed(n)) for n in model.graph.node
                   if n.op_type in ("MatMul", "Gemm", "Attention") and _weight_shape(n, weights)]
        del weights
        wanted = sorted({source for _, source, _, _ in targets})
        existing = {o.name for o in model.graph.output}
        for name in wanted:
            if name not in existing:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        onnx.save_model(model, str(probe), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights", size_threshold=1024)
        del model
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}
        runs = []
        for b in batches:  # only the captured activations are fetched, thinned to the rows the error is measured on
            out = session.run(wanted, {k: v for k, v in b.items() if k in inputs})
            runs.append({name: Captured.of(value) for name, value in zip(wanted, out)})
        del session
        tensors = {t.name: t for t in onnx.load(str(probe), load_external_data=False).graph.initializer}

        def weight(name: str, transposed: bool) -> np.ndarray:
            tensor = tensors[name]
            if external_data_helper.uses_external_data(tensor):
                external_data_helper.load_external_data_for_tensor(tensor, scratch)
            w = numpy_helper.to_array(tensor)
            tensor.ClearField("raw_data")
            return w.T if transposed else w

        layers = ((name, weight(w, transposed), [r[source] for r in runs]) for name, source, w, transposed in targets)
        return rank_by_int8_error(layers, mode=mode)


def rank_by_int8_error(layers: Iterable[tuple[str, np.ndarray, Sequence[Captured]]], *,
                       mode: Int8Mode) -> list[RankedLayer]:
    """Each (name, weight [in, out], captured input activations) with its mean relative int8 error, worst first.
    ``layers`` is consumed one at a time: a generator that loads each weight as it comes holds one at most."""
    errors = []
    for name, w, captures in layers:
        w = np.asarray(w, np.float32)
        wq = _quantized_weight(w, mode).astype(np.float32)
        calibrated = (min(c.low for c in captures), max(c.high for c in captures))
        errs = [_fake_quant_error(c.rows, w, wq, _input_range(mode, c, calibrated)) for c in captures]
        errors.append(RankedLayer(name, float(np.mean(errs)), int(w.size)))
    return sorted(errors, key=lambda e: -e.error)


def _input_range(mode: Int8Mode, capture: Captured, calibrated: tuple[float, float]) -> tuple[float, float] | None:
    """The range ``mode`` quantizes this batch's activations over; None where they stay float."""
    if mode in (Int8Mode.WEIGHTS, Int8Mode.INT4_WEIGHTS):
        return None
    return calibrated if mode is Int8Mode.STATIC else (capture.low, capture.high)


def paying_limit(ranking: Sequence[RankedLayer], *, quantized_ms: float, float_ms: float, best_ms: float) -> int:
    """The most layers (taken in ranking order) the search may keep in fp32 while the variant keeps at least half
    of int8's gain over the fastest variant accepted so far; 0 when even the fully quantized variant has no gain.

    ``quantized_ms``: the fully quantized variant's time per text; ``float_ms``: the float graph it quantizes;
    ``best_ms``: the fastest accepted variant's (all from the same timing inputs). A variant with layers kept in
    fp32 is predicted between the two by the share of weights kept: matrix products dominate these models, and
    int8 speeds up a layer in proportion to its weights. Past the limit a passing set would not be chosen (or
    would keep so little of int8's gain that int8's risk is not worth it), so finding it is wasted: on GPT-2 small
    openvino-int8-weights passed with 16 of 49 layers kept after 7 attempts and 240 s, and was then slower than
    onnx-fp32 (`python benchmarks/optimize_profile.py`, 2-core AMX Xeon).
    """
    gain = best_ms - quantized_ms
    if gain <= 0 or float_ms <= quantized_ms:
        return 0
    allowed = quantized_ms + gain / 2  # the slowest time that keeps half the gain
    total = sum(layer.weights for layer in ranking) or 1
    kept, limit = 0, 0
    for count, layer in enumerate(ranking[:-1], start=1):  # at least one layer stays quantized
        kept += layer.weights
        if quantized_ms + (float_ms - quantized_ms) * kept / total > allowed:
            break
        limit = count
    return limit


def share_limit(layers: int, max_share: float = 0.5) -> int:
    """The most of ``layers`` a search keeps in fp32 by count: ``max_share`` of them, and never all (excluding every
    layer is just the fp32 model)."""
    return max(1, min(layers - 1, int(layers * max_share)))


def _crossing(failing: int, passing: int, values: dict[int, float], floor: float | None) -> int | None:
    """The count strictly inside (failing, passing) where the line through both counts' agreements reaches ``floor``;
    None where a value is unknown or the line does not rise. GPT-2 small's openvino-int8-weights: 0.9332 with 1 layer,
    0.9548 with 21, floor 0.95 -> 17."""
    low, high = values.get(failing), values.get(passing)
    if floor is None or low is None or high is None or high <= low:
        return None
    crossing = failing + math.ceil((floor - low) / (high - low) * (passing - failing))
    return min(passing - 1, max(failing + 1, crossing))


def exclusion_search(
    names: Sequence[str],
    attempt: Callable[[list[str]], tuple[float, bool]],
    *, max_share: float = 0.5, limit: int | None = None, start: float | None = None, floor: float | None = None,
) -> SearchResult:
    """Keep the worst layers (``names``, worst first) in fp32 until ``attempt`` (rebuild + validate) accepts,
    excluding as few as found.

    The most layers the search may keep comes first: at most ``max_share`` of them, or the caller's ``limit``
    (kiln optimize's ``paying_limit``, from its timings), whichever is fewer. When that set fails, no smaller one is
    tried: it holds every smaller set's layers, and on GPT-2 small the doubling that used to come first spent five
    attempts (75 s) climbing to the same rejection (`python benchmarks/optimize_profile.py`, before and after).
    When it passes, one layer is tried (the common case of an encoder), then the count is narrowed between the
    last failing and the first passing count. Given ``start`` (the agreement with no layer in fp32) and ``floor``
    (the agreement the gate needs), every other step guesses the count where the line between the two bracketing
    attempts' agreements crosses the floor, and the steps between halve the bracket, so a bad guess costs at most
    one attempt more than bisection. Without them, the count doubles from 1 before bisecting.
    A variant with most layers in fp32 keeps less than half of int8's gain at int8's risk (GPT-2 small's dynamic
    int8 passed with 40 of its 49 layers in fp32, after 12 rebuilds and 300 s of checks: fp32 in all but name).
    No count is attempted twice, so the last attempt need not be the returned set: its files may be overwritten.
    """
    rounds: list[Round] = []
    share = share_limit(len(names), max_share)
    limit = share if limit is None else min(limit, share)
    if limit < 1:
        return SearchResult((), (), False)
    values: dict[int, float] = {} if start is None else {0: start}

    def run(n: int) -> bool:
        value, accepted = attempt(list(names[:n]))
        rounds.append(Round(n, value, accepted))
        values[n] = value
        return accepted

    # Agreement is not strictly monotone in the count near the floor (openvino-int8-weights on GPT-2 small: 13 layers
    # 0.9540, 14 layers 0.9491 in one run), so a smaller set could pass where the most allowed just misses; that is a
    # coin toss at the floor, not a set worth five more attempts to find.
    if not run(limit):
        return SearchResult((), tuple(rounds), False)
    failing, passing = 0, limit
    interpolate = floor is not None and start is not None
    if not interpolate:
        count = 1
        while count < limit and not run(count):
            failing, count = count, min(count * 2, limit)
        passing = count
    elif limit > 1:
        if run(1):
            passing = 1
        else:
            failing = 1
    steps = 0
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if interpolate and steps % 2 == 0:  # every other step a guess; the ones between halve the bracket
            middle = _crossing(failing, passing, values, floor) or middle
        steps += 1
        if run(middle):
            passing = middle
        else:
            failing = middle
    # No attempt is made twice: when a later, failing attempt overwrote the passing set's files, the caller rebuilds
    # them (kiln optimize's full check does), instead of paying another screen of a set already judged (GPT-2 small:
    # 15 s, `python benchmarks/optimize_profile.py`; MiniLM's onnx-int8-dynamic-rows: one more check of 3 layers).
    return SearchResult(tuple(names[:passing]), tuple(rounds), True)
