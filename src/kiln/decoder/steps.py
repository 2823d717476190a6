"""One decoding step on an engine, with the KV cache kept where the runtime keeps it.

A ``Past`` is the cache of a batch: per past input name, an array [batch, heads, length, head size]. Between steps
of an unchanged batch it stays in the runtime's own values: ONNX Runtime's IOBinding hands each step's ``present``
outputs (OrtValues) to the next step as inputs, so the cache is never copied into numpy and back (on a GPU it stays
in device memory); OpenVINO's steps keep it in buffers of whole buckets of positions, fed shared. Only when
sequences join or leave is the cache brought out as numpy to be cut or padded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kiln.decoder.graph import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_AT,
    POSITION_IDS,
    SEQLENS_K,
    TOTAL_LENGTH,
    CacheShape,
)


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

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, past: Past,
             last: bool = False) -> tuple[np.ndarray, Past]:
        """Logits of every new position [batch, new, vocab] and the cache grown by the new tokens. ``last``: only
        each row's last new token's logits are wanted (a prefill for generation; left-padded, the last column's);
        a stepper may then return [batch, 1, vocab], so callers read ``logits[:, -1]``."""


class ArraySteps:
    """Any engine whose graph has the cache inputs: numpy in, numpy out."""

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        self.engine, self.shape = engine, shape
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))

    def step(self, input_ids, attention_mask, position_ids, past, last=False):
        feed = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask, POSITION_IDS: position_ids, **past.arrays()}
        if LOGITS_AT in self.engine.input_names:
            feed[LOGITS_AT] = wanted_positions(*input_ids.shape, last)
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

    def step(self, input_ids, attention_mask, position_ids, past, last=False):
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


class _Stamps:
    """What a batch's cache buffers know of the states made on them: the stamp of the newest (only that one is
    stepped on in place) and (stamp, length) of each state cut short in place: past its length, what any older
    state held may since have been written over."""

    def __init__(self) -> None:
        self.newest = 0
        self.cuts: list[tuple[int, int]] = []

    def stamp(self) -> int:
        """A stamp for a new state, now the newest."""
        self.newest += 1
        return self.newest

    def cut(self, length: int) -> int:
        """The stamp of the newest state cut to ``length`` in place, the cut recorded."""
        stamp = self.stamp()
        self.cuts.append((stamp, length))
        return stamp

    def intact(self, stamp: int, longest: int) -> bool:
        """Whether a state of ``stamp`` still holds its ``longest`` columns: no later cut went below them."""
        return all(longest <= length for after, length in self.cuts if after > stamp)


class _Bank(_Stamps):
    """One batch's buffers for ``BucketSteps`` (per past name [batch, heads, capacity, head size])."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.values = values
        self.capacity = next(iter(values.values())).shape[2]


@dataclass
class _Held:
    """Where a ``Past`` made by ``BucketSteps`` stands: its bank, holding its columns at positions 0..length-1."""

    bank: _Bank
    length: int
    stamp: int

    @property
    def newest(self) -> bool:
        return self.bank.newest == self.stamp

    @property
    def intact(self) -> bool:
        """Whether every column is still in the bank: no later cut went below it."""
        return self.bank.intact(self.stamp, self.length)

    def view(self, buffer: np.ndarray) -> np.ndarray:
        return buffer[:, :, : self.length]

    @classmethod
    def next_on(cls, bank: _Bank, length: int) -> _Held:
        return cls(bank, length, bank.stamp())


class BucketSteps:
    """OpenVINO: the cache is fed in lengths that are whole buckets of ``BUCKET`` positions, so the step graph meets a
    few shapes instead of one per past length. OpenVINO's CPU plugin keeps memory for each input shape it has run and
    does not hand it back (0.62 MiB a new shape on SmolLM2-135M's int8 IR, `benchmarks/serving_memory.py shapes`):
    a server stepping every past length at every batch size grew for as long as it ran.

    The cache lives in buffers of ours: the caller's past columns at their own positions, then columns the mask hides
    (a hidden column adds nothing to attention: its weight after the softmax is 0). A step feeds the whole buffer,
    shared, uncopied, as the past; its ``present`` holds the buffer and then the new tokens, and only the new
    tokens' columns are copied into the buffer, after the caller's. More than one new token (a prompt) is padded on
    the right to a whole bucket too: causal attention keeps every real token from seeing the padding after it.
    Buffers grow a bucket at a time (the cache copied once every BUCKET tokens). Logits are copied out: callers keep
    them across steps. Token ids, mask and positions are built anew each step, so OpenVINO never holds arrays the
    caller goes on using.
    """

    BUCKET = 32

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        self.engine, self.shape = engine, shape
        compiled = engine.compiled_model
        self._request = compiled.create_infer_request()
        self._types = engine.input_types
        self._outputs = {o.get_any_name(): o for o in compiled.outputs}
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))
        self._some_logits = LOGITS_AT in engine.input_names  # kiln.engines.openvino.logits_where_asked

    def _bucket(self, length: int) -> int:
        return -(-length // self.BUCKET) * self.BUCKET

    def step(self, input_ids, attention_mask, position_ids, past, last=False):
        batch, new = input_ids.shape
        length = past.length
        held = past.owner if isinstance(past.owner, _Held) else None
        if held is not None and not held.intact:  # stepping on after a cut, then from before it: refused, never stale
            raise RuntimeError("a decoding state older than a cut of its cache was stepped on again")
        bank = held.bank if held is not None and held.newest else self._bank(past.arrays(), length, length)
        capacity = bank.capacity
        padded = self._bucket(new) if new > 1 else 1
        mask = np.zeros((batch, capacity + padded), self._types[ATTENTION_MASK])
        mask[:, :length] = attention_mask[:, :length]
        mask[:, capacity : capacity + new] = attention_mask[:, length:]
        ids = np.zeros((batch, padded), self._types[INPUT_IDS])
        ids[:, :new] = input_ids
        where = np.zeros((batch, padded), self._types[POSITION_IDS])
        where[:, :new] = position_ids
        where[:, new:] = position_ids[:, -1:] + np.arange(1, padded - new + 1)  # padding after the last real token
        feed = {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: where, **bank.values}
        if self._some_logits:  # the real tokens' logits only (the last one's for a prefill), never the padding's
            feed[LOGITS_AT] = wanted_positions(batch, new, last)
        result = self._request.infer(feed, share_inputs=True, share_outputs=True)
        self.engine.release_mapped_weights()
        logits = np.array(result[self._outputs[LOGITS]][:, :new], dtype=np.float32)
        if length + new > capacity:  # a bucket or more further: new buffers; the old ones keep the older states
            bank = self._bank(bank.values, length, length + new)
        for past_name, present_name in self._pairs:
            present = result[self._outputs[present_name]]
            bank.values[past_name][:, :, length : length + new] = present[:, :, capacity : capacity + new]
        grown = _Held.next_on(bank, length + new)
        return logits, Past(dict(bank.values), grown.length, grown.view, owner=grown)

    def _bank(self, arrays: dict[str, np.ndarray], length: int, needed: int) -> _Bank:
        """New buffers with room for ``needed`` positions in whole buckets, holding ``arrays``' first ``length``."""
        capacity = self._bucket(needed)
        values = {}
        for name in self.shape.past_names():
            old = arrays[name]
            values[name] = np.zeros((*old.shape[:2], capacity, old.shape[3]), np.float32)
            values[name][:, :, :length] = old[:, :, :length]
        return _Bank(values)

    def cut(self, past: Past, length: int) -> Past:
        """``past`` keeping its first ``length`` columns. The newest state is cut in place: its bank's columns after
        ``length`` are masked from then on and written over by the next steps."""
        held = past.owner
        if not (isinstance(held, _Held) and held.newest) or length >= past.length:
            return cut_arrays(past, length)
        kept = _Held(held.bank, length, held.bank.cut(length))
        return Past(dict(held.bank.values), length, kept.view, owner=kept)


class _Buffers(_Stamps):
    """One batch's cache buffers for ``BufferSteps`` (per past name an OrtValue [batch, heads, capacity, head
    size])."""

    def __init__(self, values: dict[str, Any], capacity: int) -> None:
        super().__init__()
        self.values, self.capacity = values, capacity
        self.binding: Any = None  # the IOBinding with these buffers bound as past and present, made on first use


@dataclass
class _Rows:
    """Where a ``Past`` made by ``BufferSteps`` stands: each row's token count in the buffers (its tokens sit at
    positions 0..count-1) and the attention mask they came with (which of the caller's columns they are)."""

    buffers: _Buffers
    lengths: np.ndarray  # int64 [batch]
    columns: np.ndarray  # bool [batch, past length]: the caller's columns that hold a row's tokens
    stamp: int

    @property
    def newest(self) -> bool:
        return self.buffers.newest == self.stamp

    @property
    def intact(self) -> bool:
        """Whether every row's tokens are still in the buffers: no later cut went below them."""
        return self.buffers.intact(self.stamp, int(self.lengths.max(initial=0)))

    def expand(self, value: Any) -> np.ndarray:
        """A buffer as the caller's layout: each row's tokens at its own columns, zeros where it had padding."""
        compact = _ort_numpy(value)
        out = np.zeros((*compact.shape[:2], self.columns.shape[1], compact.shape[3]), np.float32)
        for row, (count, columns) in enumerate(zip(self.lengths, self.columns)):
            out[row, :, columns] = compact[row, :, :count].transpose(1, 0, 2)
        return out


class BufferSteps:
    """ONNX Runtime on the fused step graph (kiln.exporting.fused_decoder): the cache is one buffer per layer and kind,
    bound as both the past input and the present output, so a step writes only the new tokens' keys and values.

    Callers see the same ``Stepper`` as everywhere: an attention mask over their columns (left padding, rows that
    joined later, right-padded teacher forcing). The buffers hold only each row's real tokens, from position 0 (the
    layout GroupQueryAttention reads); a new token whose mask is 0 is written after the row's tokens and not
    counted, so the next one overwrites it. A ``Past`` that is not the newest made on its buffers, or one brought
    out as numpy (sequences joining or leaving), is copied into new buffers first.
    """

    GROW = 128  # positions allocated beyond what a step needs, so a buffer is reallocated every GROW tokens at most

    def __init__(self, engine: Any, shape: CacheShape) -> None:
        import onnxruntime as ort

        self._ort, self.engine, self.shape = ort, engine, shape
        self._session = engine.session
        self._device = "cuda" if getattr(engine, "_on_gpu", False) else "cpu"
        self._pairs = tuple(zip(shape.past_names(), shape.present_names()))
        self._vocab = next(o.shape[-1] for o in self._session.get_outputs() if o.name == LOGITS)

    def step(self, input_ids, attention_mask, position_ids, past, last=False):
        batch, new = input_ids.shape
        own = past.owner if isinstance(past.owner, _Rows) else None
        # The caller's columns that hold a token: only a cache in the caller's layout (numpy) is read by them.
        held = None if own else np.asarray(attention_mask[:, : past.length]) != 0
        lengths = own.lengths if own else held.sum(axis=1).astype(np.int64)
        if new > 1 and batch > 1 and lengths.any():
            # GroupQueryAttention takes several new tokens on a cache for one row only: one column at a time.
            return self._column_by_column(input_ids, attention_mask, position_ids, past, last)
        real = np.asarray(attention_mask[:, past.length :]) != 0
        counts = real.sum(axis=1)
        ids, where = input_ids, position_ids
        if new > 1 and not real.all():  # the op reads each row's new tokens from the first column on
            ids, where = _packed(input_ids, real), _packed(position_ids, real)
        after = lengths + np.maximum(counts, 1)  # a padding token is written, and overwritten by the next
        buffers = self._buffers(past, own, held, lengths, int(after.max()))
        binding = buffers.binding
        if binding is None:
            # Bound once for all the steps made on them, and the logits written straight into an array of ours
            # (get_outputs wrapped every present buffer too): SmolLM2-135M's shape, int4, 128-token prompt, 0.40 ms
            # a token less at batch 1 (8.54 against 9.00, median of 20 paired rounds) and 0.88 at batch 4 (20.02
            # against 20.94; 2-core AMD EPYC).
            binding = buffers.binding = self._session.io_binding()
            for past_name, present_name in self._pairs:
                binding.bind_ortvalue_input(past_name, buffers.values[past_name])
                binding.bind_ortvalue_output(present_name, buffers.values[past_name])
        for name, array in ((INPUT_IDS, ids), (POSITION_IDS, where)):
            binding.bind_cpu_input(name, np.ascontiguousarray(array, dtype=np.int64))
        binding.bind_cpu_input(SEQLENS_K, (after - 1).astype(np.int32))
        binding.bind_cpu_input(TOTAL_LENGTH, np.array(int(after.max()), np.int32))
        # Which packed positions get logits: each row's last real one, or all (the head is ~30% of a prefill's
        # multiply-adds on GPT-2 small, and its [batch, new, vocab] output 103 MB at batch 4 x 128 tokens).
        wanted = np.maximum(counts - 1, 0)[:, None] if last else np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        binding.bind_cpu_input(LOGITS_AT, np.ascontiguousarray(wanted, dtype=np.int64))
        logits = np.empty((batch, wanted.shape[1], self._vocab), np.float32)
        binding.bind_output(LOGITS, "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        self._session.run_with_iobinding(binding)
        if ids is not input_ids and not last:  # back to the caller's columns; its padding columns get zeros
            spread = np.zeros((batch, new, logits.shape[-1]), np.float32)
            for row in range(batch):
                spread[row, real[row]] = logits[row, : counts[row]]
            logits = spread
        state = _Rows(buffers, lengths + counts, np.asarray(attention_mask) != 0, buffers.stamp())
        return logits, Past(dict(buffers.values), past.length + new, state.expand, owner=state)

    def _buffers(self, past: Past, own: _Rows | None, held: np.ndarray | None, lengths: np.ndarray,
                 needed: int) -> _Buffers:
        """Buffers holding ``past`` with room for ``needed`` positions a row: its own, when it is the newest made on
        them and they are large enough; otherwise new ones, filled from its buffers (whose rows' first tokens no
        later step overwrote: steps write past the newest's lengths, never below an older one's) or, for a cache in
        the caller's layout, from the columns ``held`` marks."""
        if own is not None and own.newest and own.buffers.capacity >= needed:
            return own.buffers
        if own is not None and not own.intact:  # stepping on after a cut, then from before it: refused, never stale
            raise RuntimeError("a decoding state older than a cut of its cache was stepped on again")
        capacity = -(-(needed + self.GROW) // 64) * 64
        values = {}
        for name in self.shape.past_names():
            buffer = np.zeros((len(lengths), self.shape.heads, capacity, self.shape.head_size), np.float32)
            if own is not None:
                old = _ort_numpy(own.buffers.values[name])
                for row, count in enumerate(lengths):
                    buffer[row, :, :count] = old[row, :, :count]
            elif past.length:
                cache = past.to_numpy(past.values[name])
                for row in range(len(lengths)):
                    buffer[row, :, : lengths[row]] = cache[row][:, held[row]]
            values[name] = self._ort.OrtValue.ortvalue_from_numpy(buffer, self._device, 0)
        return _Buffers(values, capacity)

    def cut(self, past: Past, length: int) -> Past:
        """``past`` keeping its first ``length`` columns. The newest state of rows with a token in every column (one
        sequence, no padding: speculative decoding's) is cut in place, by its lengths: the next step writes over
        what lay past the cut. Anything else is brought out and cut as numpy."""
        own = past.owner
        if not (isinstance(own, _Rows) and own.newest and own.columns.all()) or length >= past.length:
            return cut_arrays(past, length)
        stamp = own.buffers.cut(length)
        state = _Rows(own.buffers, np.minimum(own.lengths, length), own.columns[:, :length], stamp)
        return Past(past.values, length, state.expand, owner=state)

    def _column_by_column(self, input_ids, attention_mask, position_ids, past, last):
        outputs = []
        for column in range(input_ids.shape[1]):
            end = past.length + column + 1
            logits, past = self.step(input_ids[:, column : column + 1], attention_mask[:, :end],
                                     position_ids[:, column : column + 1], past)
            outputs.append(logits)
        return (outputs[-1] if last else np.concatenate(outputs, axis=1)), past


def wanted_positions(batch: int, new: int, last: bool) -> np.ndarray:
    """``LOGITS_AT`` for ``new`` tokens a row: every position, or (``last``) the last one."""
    return (np.full((batch, 1), new - 1, np.int64) if last
            else np.ascontiguousarray(np.broadcast_to(np.arange(new, dtype=np.int64), (batch, new))))


def cut_arrays(past: Past, length: int) -> Past:
    """``past``'s first ``length`` columns as numpy (copies: no runtime memory is held)."""
    if length >= past.length:
        return past
    return Past({n: np.ascontiguousarray(a[:, :, :length]) for n, a in past.arrays().items()}, length)


def cut(steps: Stepper, past: Past, length: int) -> Past:
    """``past`` keeping its first ``length`` columns: in place where the stepper can (``BufferSteps``)."""
    own = getattr(steps, "cut", None)
    return own(past, length) if own is not None else cut_arrays(past, length)


def _packed(array: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Each row's entries where ``real``, moved to the front, the rest zeros: [batch, most real in a row]."""
    out = np.zeros((array.shape[0], int(real.sum(axis=1).max())), array.dtype)
    for row in range(array.shape[0]):
        kept = array[row][real[row]]
        out[row, : len(kept)] = kept
    return out


def _ort_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


# Engine name -> how a decoding step runs on it; engines not listed exchange numpy arrays.
STEPPERS: dict[str, Callable[[Any, CacheShape], Stepper]] = {"onnxruntime": BoundSteps, "openvino": BucketSteps}


def stepper(engine: Any, shape: CacheShape) -> Stepper:
    if SEQLENS_K in engine.input_names:  # the fused step graph: its cache is one buffer, updated in place
        return BufferSteps(engine, shape)
    return STEPPERS.get(engine.name, ArraySteps)(engine, shape)


def empty_past(shape: CacheShape, batch: int) -> Past:
    return Past(shape.empty(batch), 0)
