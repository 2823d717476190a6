"""Teacher forcing through the cache path: a whole padded batch's logits, computed the way generation computes them.

Validation compares variants on the logits of every position of real text. Running the graph once on the whole
text would never use the cache; here the first half (of the shortest row) is one prefill and every later
position is a step on the cache the previous step returned, so the figures cover both halves of what generation
does. A batch steps one token at a time: generation's single-token step, at every position of every row. A row run
alone (validation's "alone" batching) steps ALONE_CHUNK tokens at a time: the multi-token step on a cache that
speculative decoding verifies with. So a check covers both kinds of cached step, and the drift between the sorted
batch and the rows alone bounds chunking as well as batching. The alone rows were most of a decoder's check, one
single-token step per position at batch 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kiln.decoder.graph import ATTENTION_MASK, INPUT_IDS, LOGITS, CacheShape, positions
from kiln.decoder.steps import Stepper, empty_past, stepper
from kiln.system.disk_rows import DiskRows
from kiln.system.memory import trim_heap

# steps between heap trims (`git show 533a23f:benchmarks/teacher_memory.py`: every 1-2 steps +1.54 GB, 8 +1.82)
TRIM_EVERY = 4
ALONE_CHUNK = 8  # tokens per cached step for a row run alone (kiln.decoder.speculative verifies up to 17)


class TeacherForced:
    """An Engine view of a KV-cache graph: ``run`` takes right-padded ``input_ids`` and ``attention_mask`` and
    returns ``logits`` [batch, sequence, vocab] like a plain forward pass."""

    output_names = (LOGITS,)
    is_padded = True
    pad_multiple = 1
    # A run is a prefill and then one step per position up to its longest row, each step with a call's fixed cost:
    # more, narrower batches would step more often in all. So the length plan (kiln.runtime.batch_plan) counts a run
    # as dear as this and keeps the fewest batches, cut where they pad least.
    run_tokens = 1 << 30

    def __init__(self, engine: Any, shape: CacheShape, *, trim: bool = False) -> None:
        """``trim`` (validation, whose engines hold no memory between calls): hand freed heap memory back every few
        steps of a batch, never while timing or serving, where it cost OpenVINO ~15% of a call; and write
        ``run_rows``' rows to a temporary file as each step computes them. In memory, a batch's rows all sat under
        the engine's own peak (0.46 GB for GPT-2 small's 32 agreement texts): its openvino-fp32 check peaked at
        3.27 GB with them in memory and 2.72 GB with them on disk (benchmarks/optimize_profile.py amx-lean2 and
        amx-lean3, an AMX Xeon)."""
        self.step_engine = engine
        self.trim_every = TRIM_EVERY if trim else 0
        self.to_disk = trim
        self.steps = stepper(engine, shape)
        self.name, self.providers = engine.name, engine.providers
        self.input_names = (INPUT_IDS, ATTENTION_MASK)
        self.shape = shape

    def new_stepper(self) -> Stepper:
        """A stepper of its own on the same engine (OpenVINO: its own infer requests), for work whose cache must
        not share runtime memory with ``steps``' (the server's beam searches beside its batch)."""
        return stepper(self.step_engine, self.shape)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = inputs[INPUT_IDS]
        out: np.ndarray | None = None
        # Written in place, step by step: gathering the steps' logits and concatenating them held the batch's
        # logits twice (1.6 GB for 32 rows of 128 tokens over GPT-2's 50k vocabulary).
        for start, end, logits in self._forced(inputs):
            if out is None:
                out = np.empty((ids.shape[0], ids.shape[1], logits.shape[-1]), np.float32)
            out[:, start:end] = logits
        return {LOGITS: out}

    def run_rows(self, inputs: dict[str, np.ndarray]) -> list[Any]:
        """``run``'s logits cut to each row's real positions, written there directly: validation keeps only those,
        and the padded batch is 1.8x their size on the agreement texts (0.82 GB for 32 rows of up to 128 tokens
        over GPT-2's vocabulary, held beside the rows cut from it)."""
        lengths = [int(n) for n in np.asarray(inputs[ATTENTION_MASK]).sum(axis=1)]
        rows: list[Any] = []
        for start, end, logits in self._forced(inputs):
            if not rows:  # the prefill: the vocabulary is known now
                rows, write = self._rows([(n, logits.shape[-1]) for n in lengths])
            for i, n in enumerate(lengths):
                if start < n:  # positions past a row's end (its padding) are computed with the batch, not kept
                    write(i, start, logits[i, : min(end, n) - start])
        return rows

    def _rows(self, shapes: list[tuple[int, int]]) -> tuple[list[Any], Callable[[int, int, np.ndarray], None]]:
        """Rows of ``shapes`` and how to write one row's positions from a start: in a temporary file (``to_disk``,
        the rows handed back are stand-ins read where used), or in memory."""
        if self.to_disk:
            disk = DiskRows.empty(shapes, np.float32)
            return disk.lazy(), disk.write
        arrays = [np.empty(shape, np.float32) for shape in shapes]

        def write(i: int, start: int, values: np.ndarray) -> None:
            arrays[i][start : start + len(values)] = values

        return arrays, write

    def _forced(self, inputs: dict[str, np.ndarray]) -> Iterator[tuple[int, int, np.ndarray]]:
        """(first position, end, logits [batch, end - first, vocab]) of the prefill, then of each step."""
        ids = np.ascontiguousarray(inputs[INPUT_IDS], np.int64)
        mask = np.ascontiguousarray(inputs[ATTENTION_MASK], np.int64)
        first = max(1, int(mask.sum(axis=1).min()) // 2)
        # A stepper of this call's own: its runtime memory (OpenVINO's request holding a batch's whole cache as
        # outputs, beside the buffers fed to it) goes when the call ends, not at the engine's. Each step allocates a
        # cache one position longer (OpenVINO's, a bucket longer every 32 steps) and frees the last; glibc keeps the
        # freed blocks, so where asked (``trim``) the heap is trimmed every few steps. On GPT-2 small (OpenVINO, 32
        # rows of 16-128 tokens, `git show 533a23f:benchmarks/teacher_memory.py`, with the cache then as two
        # requests' outputs) the call's peak above the engine fell from 2.2-2.26 GB to 1.64-1.68, at 14.4-15.3 s
        # against 12.5-13.2.
        steps = self.new_stepper()
        logits, past = steps.step(ids[:, :first], mask[:, :first], positions(mask[:, :first], first),
                                  empty_past(self.shape, ids.shape[0]))
        yield 0, first, logits
        stride = ALONE_CHUNK if ids.shape[0] == 1 else 1
        for column in range(first, ids.shape[1], stride):
            end = min(column + stride, ids.shape[1])
            seen = mask[:, :end]
            logits, past = steps.step(ids[:, column:end], seen, positions(seen, end - column), past)
            if self.trim_every and ids.shape[0] > 1 and column % self.trim_every == 0:  # one row's cache is small
                trim_heap()
            yield column, end, logits
        del steps, past
        if self.trim_every:
            trim_heap()

    def warmup(self) -> None:
        self.run({INPUT_IDS: np.ones((1, 4), np.int64), ATTENTION_MASK: np.ones((1, 4), np.int64)})
