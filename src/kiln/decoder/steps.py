"""One decoding step on an engine, with the KV cache kept where the runtime keeps it.

A ``Past`` is the cache of a batch: per past input name, an array [batch, heads, length, head size]. Between steps
of an unchanged batch it stays in the runtime's own values: ONNX Runtime's IOBinding hands each step's ``present``
outputs (OrtValues) to the next step as inputs, so the cache is never copied into numpy and back (on a GPU it stays
in device memory); OpenVINO's steps read the outputs in place and share them as the next step's inputs. Only when
sequences join or leave is the cache brought out as numpy to be cut or padded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kiln.decoder.graph import ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS, CacheShape


@dataclass
class Past:
    """A batch's KV cache by past input name; ``values`` are numpy arrays or a runtime's own (``to_numpy``)."""

    values: dict[str, Any]
    length: int
    to_numpy: Callable[[Any], np.ndarray] = np.asarray
    owner: Any = None  # the runtime object whose memory holds ``values``, when they are views into it

    def arrays(self) -> dict[str, np.ndarray]:
        return {n: self.to_numpy(v) for n, v in self.values.items()}


class Stepper(Protocol):
    shape: CacheShape

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, past: Past
             ) -> tuple[np.ndarray, Past]:
        """Logits of every new position [batch, new, vocab] and the cache grown by the new tokens."""


class ArraySteps:
    """Any engine whose graph has the cache inputs: numpy in, numpy out."""

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        self.engine, self.shape = engine, shape
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))

    def step(self, input_ids, attention_mask, position_ids, past):
        feed = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask, POSITION_IDS: position_ids, **past.arrays()}
        out = self.engine.run(feed)
        grown = {p: out[q] for p, q in self._pairs}
        return out[LOGITS], Past(grown, past.length + input_ids.shape[1])


class BoundSteps:
    """ONNX Runtime with IOBinding: the cache stays in OrtValues on the engine's device between steps."""

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        import onnxruntime as ort

        self._ort, self.engine, self.shape = ort, engine, shape
        self._session = engine.session
        self._device = "cuda" if getattr(engine, "_on_gpu", False) else "cpu"
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))
        self._outputs = (LOGITS, *shape.present_names())  # the order the outputs are bound in, below
        self._types = engine._input_types

    def _value(self, array: Any) -> Any:
        if isinstance(array, self._ort.OrtValue):
            return array
        return self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self._device, 0)

    def step(self, input_ids, attention_mask, position_ids, past):
        binding = self._session.io_binding()
        for name, array in ((INPUT_IDS, input_ids), (ATTENTION_MASK, attention_mask), (POSITION_IDS, position_ids)):
            binding.bind_ortvalue_input(name, self._value(array.astype(self._types[name], copy=False)))
        for name, value in past.values.items():
            binding.bind_ortvalue_input(name, self._value(value))
        binding.bind_output(LOGITS, "cpu")  # the logits are read on the host every step
        for present in self._outputs[1:]:
            binding.bind_output(present, self._device)
        self._session.run_with_iobinding(binding)
        outputs = dict(zip(self._outputs, binding.get_outputs()))
        grown = {p: outputs[q] for p, q in self._pairs}
        return outputs[LOGITS].numpy(), Past(grown, past.length + input_ids.shape[1], _ort_numpy)


class SharedSteps:
    """OpenVINO: each step's ``present`` outputs are read as views of the infer request's own output memory and
    shared, uncopied, as the next step's inputs. Per token on GPT-2 small (benchmarks/openvino_steps.py): 47.2 against
    96.1 ms copying the cache out and back in as ArraySteps does (batch 4, 512-token prompt), 23.8 against 31.3 ms
    (batch 1, 128).

    A request's outputs stay valid until that request runs again, so two requests take turns: a step runs on the
    request that did not run last (the last one's outputs may be the running batch's cache while newcomers are
    prefilled for a join), unless that request's memory holds the step's own input cache. Logits are copied out:
    callers keep them across steps. Token ids, mask and positions are copied in, so OpenVINO never holds arrays the
    caller goes on using (a shared input may be written over).
    """

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        self.engine, self.shape = engine, shape
        compiled = engine.compiled_model
        self._requests = (compiled.create_infer_request(), compiled.create_infer_request())
        self._last = 1
        self._types = engine.input_types
        self._outputs = {o.get_any_name(): o for o in compiled.outputs}
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))

    def step(self, input_ids, attention_mask, position_ids, past):
        index = 1 - self._last
        if past.owner is self._requests[index]:
            index = self._last
        self._last, request = index, self._requests[index]
        feed = {name: np.array(array, dtype=self._types[name])
                for name, array in ((INPUT_IDS, input_ids), (ATTENTION_MASK, attention_mask),
                                    (POSITION_IDS, position_ids))}
        feed.update({n: np.ascontiguousarray(v, dtype=np.float32) for n, v in past.values.items()})
        result = request.infer(feed, share_inputs=True, share_outputs=True)
        grown = {p: result[self._outputs[q]] for p, q in self._pairs}
        logits = np.array(result[self._outputs[LOGITS]], dtype=np.float32)
        return logits, Past(grown, past.length + input_ids.shape[1], owner=request)


def _ort_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


# Engine name -> how a decoding step runs on it; engines not listed exchange numpy arrays.
STEPPERS: dict[str, Callable[[Any, CacheShape], Stepper]] = {"onnxruntime": BoundSteps, "openvino": SharedSteps}


def stepper(engine: Any, shape: CacheShape) -> Stepper:
    return STEPPERS.get(engine.name, ArraySteps)(engine, shape)


def empty_past(shape: CacheShape, batch: int) -> Past:
    return Past(shape.empty(batch), 0)
