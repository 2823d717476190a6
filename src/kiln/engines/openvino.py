"""OpenVINO engine: CPU plugin with an inference-precision hint (fp32 / bf16); streams serve parallel sessions."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from kiln.choices import Precision
from kiln.decoder.graph import INPUT_IDS, LOGITS, LOGITS_AT, PAST_PREFIX
from kiln.engines.base import THROUGHPUT_STREAMS, EngineOptions, require_cpu, warmup_inputs
from kiln.errors import ArtifactError, UsageError, missing_dependency
from kiln.system.memory import page_out

# oneDNN's process-wide cache of compiled primitives (1,024 by default) grows with every new shape a decoder's step
# graph meets (a new past length each step) and is handed back by nothing: not the runtime cache setting, not
# dropping the compiled model. SmolLM2-135M's int8 IR, 400 new (batch, past) shapes: +340 MiB resident at the
# default, +134 at 64 and no slower over three passes of the same shapes (2-core EPYC, AVX2;
# `python benchmarks/serving_memory.py shapes OUT/openvino-int8-weights/model.xml`). oneDNN reads it once, when it
# first builds a primitive: set before a decoder compiles unless the user set it.
DECODER_PRIMITIVE_CACHE = "64"
_PRECISION_HINT = {Precision.FP32: "f32", Precision.BF16: "bf16", Precision.FP16: "f16"}


def prime_numpy_views(request: Any) -> None:
    """Call on one thread before ``request``'s model (or any OpenVINO model) runs on several threads at once.

    The binding's first tensor-to-numpy conversion builds a function-local static map of numpy dtypes (OpenVINO's
    Common::type_helpers::ov_type_to_dtype) by calling into numpy. Two sessions making their first calls at once
    deadlocked on it (kiln.load's split plan, MiniLM, 2026-11-27; py-spy: one thread in __cxa_guard_acquire holding
    the GIL, the other inside the initializer waiting for the GIL). Built once per process, on one thread, it leaves
    no first call to race (tests/integration/test_engines.py: eight sessions' first calls at once hung 9 of 10 processes
    without it)."""
    _ = request.get_input_tensor(0).data, request.get_output_tensor(0).data


def _call(request: Any, inputs: dict[str, np.ndarray], input_names: tuple[str, ...],
          output_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """One call on ``request``: the inputs copied into the request's own tensors, the outputs copied out.

    Neither side shares the caller's memory. With shared zero-copy inputs (the default of CompiledModel.__call__),
    OpenVINO 2026.4 was seen writing into the caller's arrays once a second infer request of the model had run
    (MiniLM, sorted batches up to 208 tokens): that batch's next use read other token ids and gave cosine 0.24.
    The outputs are read before the request can serve another call and copied, so they stay valid after it does.

    Why not ``request.infer(dict)``: the binding then wraps each array in a new tensor and sets it on the request.
    Resizing the request's own tensors and copying into them cost the calling thread 421 against 467 us a call in a
    server under 64 clients, 425 against 450 offline (MiniLM int8, 2-core EPYC; the same outputs bit for bit;
    benchmarks/experiments/serve_overhead/run.py at 91ffdaf --mode calls). In a server that CPU is taken from the
    engine's other stream and the event loop.

    Why the synchronous ``infer()`` and not ``start_async()`` + ``wait()``, whose wait spins less (328 against 421
    us a call served, 343 against 425 offline, the same command): on OpenVINO 2026.4 a call that fails that way
    (ids and mask of different widths) leaves the stream unable to run that shape again: every later call of it
    fails, on any request of the model, until another shape has run. The synchronous call recovers
    (tests/integration/test_engines.py).
    """
    for k, name in enumerate(input_names):
        array = np.asarray(inputs[name])
        tensor = request.get_input_tensor(k)
        tensor.shape = array.shape
        tensor.data[...] = array  # cast to the input's own element type where the caller's differs
    request.infer()
    return {name: np.array(request.get_output_tensor(k).data, dtype=np.float32)
            for k, name in enumerate(output_names)}


def embedding_rows(model: Any, ids: str = INPUT_IDS) -> int | None:
    """Rows of the table that input ``ids`` indexes: dimension 0 of the data of the Gather its values reach (through
    Converts), or None where the graph shows no such Gather or its table's rows are not static."""
    frontier = [p for p in model.get_parameters() if ids in p.output(0).get_names()]
    while frontier:
        node = frontier.pop()
        for target in node.output(0).get_target_inputs():
            consumer = target.get_node()
            kind = consumer.get_type_name()
            if kind == "Convert":
                frontier.append(consumer)
            elif kind == "Gather" and target.get_index() == 1:
                rows = consumer.input_value(0).get_partial_shape()
                if rows.rank.is_static and rows.rank.get_length() >= 1 and rows[0].is_static:
                    return rows[0].get_length()
    return None


def logits_where_asked(model: Any) -> None:
    """Give a decoder step graph the input ``LOGITS_AT`` ([batch, wanted] positions among the new tokens) and compute
    the output head only there: a Gather of those positions' hidden states before the head's MatMul, as ONNX Runtime's
    fused step graph has it (kiln.exporting.fused_decoder) and OpenVINO GenAI slices its models before the MatMul.
    A prompt's step then computes one row of logits, not one a token: SmolLM2-135M's head is a fifth of a prefill's
    multiply-adds, and its logits for 8 prompts of 600 tokens alone are 0.9 GB. A graph already taking the input, or
    whose logits do not come from a MatMul over the hidden states, is left as it is."""
    import openvino as ov
    from openvino import opset13

    if any(LOGITS_AT in i.get_names() for i in model.inputs):
        return
    logits = next((o for o in model.outputs if LOGITS in o.get_names()), None)
    if logits is None:
        return
    node = logits.get_node().input_value(0).get_node()  # the Result's producer
    while node.get_type_name() in ("Convert", "Multiply", "Divide", "Tanh", "Add"):  # a final scale or soft cap
        node = node.input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        return
    hidden = [k for k in range(2) if node.input_value(k).get_partial_shape().rank.get_length() == 3
              and node.input_value(k).get_partial_shape()[0].is_dynamic]  # [batch, new, hidden]; the weights static
    if len(hidden) != 1:
        return
    positions = opset13.parameter([-1, -1], ov.Type.i64, name=LOGITS_AT)
    positions.output(0).set_names({LOGITS_AT})
    wanted = opset13.gather(node.input_value(hidden[0]), positions, axis=1, batch_dims=1)
    node.input(hidden[0]).replace_source_output(wanted.output(0))
    model.add_parameters([positions])
    model.validate_nodes_and_infer_types()


class OpenVinoEngine:
    name = "openvino"
    is_padded = True
    # OpenVINO's CPU plugin reuses compiled kernels per input shape: on MiniLM, int8, batches padded to a
    # multiple of 16 ran 185-189 seq/s against 152-162 unpadded (1,024 mixed texts, two repetitions).
    pad_multiple = 16

    def __init__(self, path: Path, options: EngineOptions = EngineOptions()) -> None:
        self.holds_memory = options.memory_arena  # False: validation; calls hand their memory back
        try:
            import openvino as ov
        except ImportError as err:
            raise missing_dependency("openvino", "openvino", err) from err
        require_cpu(options.device, "OpenVINO")
        # THROUGHPUT_STREAMS: the CPU plugin's throughput hint sizes the streams to the model and the cores (2 x 1
        # for MiniLM on 2 cores; on a large server it keeps several cores per stream where one each would not pay)
        hint = "THROUGHPUT" if options.streams == THROUGHPUT_STREAMS else "LATENCY"
        config = {"INFERENCE_PRECISION_HINT": _PRECISION_HINT[options.precision], "PERFORMANCE_HINT": hint}
        if options.intra_op_threads:
            config["INFERENCE_NUM_THREADS"] = options.intra_op_threads
        if options.streams:
            config["NUM_STREAMS"] = options.streams
        core = ov.Core()
        try:
            model = core.read_model(str(path))
            decoder = any(i.get_any_name().startswith(PAST_PREFIX) for i in model.inputs)
            if decoder:
                # A decoding step's shapes almost never repeat (the past grows by one each step), so the CPU
                # plugin's per-shape kernel cache only grows: GPT-2 small, batch 8, past lengths 0-259 in a row
                # ended at 4.84 GB RSS and 42.4 s with the default cache against 2.66 GB and 29.7 s without it,
                # and kiln optimize's validation passed 24 GB with it (killed).
                config["CPU_RUNTIME_CACHE_CAPACITY"] = 0
                os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", DECODER_PRIMITIVE_CACHE)
                logits_where_asked(model)
            self.compiled_model = core.compile_model(model, "CPU", config)
        except RuntimeError as err:
            raise ArtifactError(f"OpenVINO cannot load {path}: {err}") from err
        self.streams = int(self.compiled_model.get_property("NUM_STREAMS"))
        self._request = self.compiled_model.create_infer_request()
        prime_numpy_views(self._request)
        # The IR's weights file, mapped by OpenVINO; its pages are handed back after the first call (page_out).
        self._mapped = path.with_suffix(".bin")
        self._paged_out = False
        self._own = threading.Lock()  # held while a call runs on this session's own request
        self._spares: queue.SimpleQueue = queue.SimpleQueue()  # shared by this engine's sessions (requests())
        self.input_names = tuple(i.get_any_name() for i in self.compiled_model.inputs)
        self.output_names = tuple(o.get_any_name() for o in self.compiled_model.outputs)
        # OpenVINO's synchronous call runs inputs it cannot make sense of (ids and mask of different widths, 3-D ids)
        # and answers something (OpenVINO 2026.4); ONNX Runtime refuses them. Checked here so that both refuse.
        ranks = (i.get_partial_shape().rank for i in self.compiled_model.inputs)
        self._ranks = tuple(r.get_length() if r.is_static else None for r in ranks)  # None: any rank
        self._one_shape = not decoder  # an encoder's inputs are all [batch, length]; a decoder's past differ
        # OpenVINO's Gather reads past its table for an id out of range and answers (2026.4: a row of other memory,
        # no error); ONNX Runtime refuses it ("input index out of range"). None: the graph shows no table to check.
        self._vocabulary = embedding_rows(model)
        self.providers = (f"openvino-cpu-{options.precision.value}",)
        # Token inputs are int64; a decoder's past keys/values are float.
        self.input_types = {i.get_any_name(): (np.float32 if i.get_element_type().is_real() else np.int64)
                            for i in self.compiled_model.inputs}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Thread-safe: an infer request runs one call at a time, so a call made while this session's own request
        is busy (several user threads on one predictor) takes a spare request, created on first need and kept.
        The server's sessions each call from their own thread and so always find their own request free."""
        self._check(inputs)
        own = self._own.acquire(blocking=False)
        if own:
            request = self._request
        else:
            try:
                request = self._spares.get_nowait()
            except queue.Empty:
                request = self.compiled_model.create_infer_request()
        try:
            outputs = _call(request, inputs, self.input_names, self.output_names)
        finally:
            if own:
                self._own.release()
            else:
                self._spares.put(request)
        self.release_mapped_weights()
        return outputs

    def _check(self, inputs: dict[str, np.ndarray]) -> None:
        """Refuse inputs of the wrong rank, an encoder's inputs whose shapes differ, and token ids outside the
        model's vocabulary; a missing one is a KeyError naming it."""
        shapes = {name: np.shape(inputs[name]) for name in self.input_names}
        for (name, shape), rank in zip(shapes.items(), self._ranks):
            if rank is not None and len(shape) != rank:
                raise UsageError(f"OpenVINO input {name!r} takes {rank}-D arrays (got shape {shape})")
        if self._one_shape and len(set(shapes.values())) > 1:
            raise UsageError(f"the inputs of one call must share one [batch, length] shape (got {shapes})")
        ids = inputs.get(INPUT_IDS)
        if self._vocabulary is not None and ids is not None and np.size(ids):
            low, high = int(np.min(ids)), int(np.max(ids))
            if low < 0 or high >= self._vocabulary:
                bad = low if low < 0 else high
                raise UsageError(f"OpenVINO input {INPUT_IDS!r}: token id {bad} is outside the model's vocabulary "
                                 f"(0 to {self._vocabulary - 1})")

    def release_mapped_weights(self) -> None:
        """Once a call has run (by this engine or on its compiled model's requests): hand back the resident pages
        of the IR's mapped weights file. The CPU plugin has copied the weights into its own layout by then; a
        weight it still reads (a token embedding's rows) comes back from the page cache. GPT-2 small in fp32 held
        474 MiB of the file besides the plugin's copy."""
        if not self._paged_out:
            self._paged_out = True
            page_out(self._mapped)

    def requests(self, count: int) -> list[OpenVinoEngine]:
        """``count`` sessions on this compiled model: this engine and ``count - 1`` more infer requests. With as
        many streams, the CPU plugin runs requests from different threads in parallel, each on its stream's
        cores (what an AsyncInferQueue does, driven by the caller's session threads)."""
        import copy

        views = [self]
        for _ in range(count - 1):
            view = copy.copy(self)
            view._request = self.compiled_model.create_infer_request()
            view._own = threading.Lock()
            views.append(view)
        return views

    def warmup(self) -> None:
        shapes = {i.get_any_name(): [d.get_length() if d.is_static else "dynamic" for d in i.get_partial_shape()]
                  for i in self.compiled_model.inputs if i.get_element_type().is_real()}
        self.run(warmup_inputs(self.input_names, float_shapes=shapes))
