"""The engine protocol: run one padded batch of token ids, return raw outputs by name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kiln.choices import Device, Precision, parse_choice
from kiln.decoder.graph import LOGITS_AT, SEQLENS_K, TOTAL_LENGTH
from kiln.errors import UsageError

if TYPE_CHECKING:
    from kiln.records.artifact import VariantRecord


class Engine(Protocol):
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    providers: tuple[str, ...]
    # True when the engine computes every padded position (all of kiln's engines today); a varlen engine
    # would report False so the batcher can skip padding-aware grouping.
    is_padded: bool
    # Batches are padded to a multiple of this length; >1 where the runtime caches work per input shape.
    pad_multiple: int

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Extra arrays in ``inputs`` are ignored; outputs are float32 numpy arrays."""

    def warmup(self) -> None:
        """Run a small batch once so the first real request does not pay for lazy initialisation."""


THROUGHPUT_STREAMS = 0  # EngineOptions.streams: the runtime's throughput hint picks the number of streams
# KILN_SPIN_WAIT=0 makes sleeping between runs the default for every ONNX Runtime session of the process (and of the
# servers it starts), the way OMP_WAIT_POLICY=PASSIVE does for OpenMP: for boxes with more busy threads than cores,
# where spinning threads take the cores from the ones with work. kiln's suite runs 3 workers on 2 cores; 4 of its
# integration files took 260 s of wall and 462 s of user CPU with spinning, 178 s and 300 s with both set
# (`pytest -n 3 --dist loadfile` on test_optimize, test_generation, test_tasks and test_bench, 2-core AMD EPYC).
SPIN_WAIT_ENV = "KILN_SPIN_WAIT"


def default_spin_wait() -> bool:
    """Whether ONNX Runtime's threads spin between runs unless a caller says: KILN_SPIN_WAIT, else yes."""
    value = os.environ.get(SPIN_WAIT_ENV, "1").strip()
    if value not in ("0", "1"):
        raise UsageError(f"{SPIN_WAIT_ENV} must be 0 or 1 (got {value!r})")
    return value == "1"


@dataclass(frozen=True)
class EngineOptions:
    intra_op_threads: int | None = None  # None: the runtime's default (all cores it may use)
    inter_op_threads: int | None = None
    device: Device = Device.CPU  # tensorrt: ONNX Runtime only
    precision: Precision = Precision.FP32  # torch: autocast dtype; OpenVINO: inference precision hint
    # OpenVINO CPU streams: one per session (engines.open_sessions); THROUGHPUT_STREAMS: as many as its throughput
    # hint picks for this model and CPU
    streams: int | None = None
    rows_alone: bool = False  # run each row of a batch on its own (kiln.engines.rows): batch-invariant answers
    # ONNX Runtime's worker threads spin between runs (the default): the fastest for back-to-back runs of one
    # session (greedy decoding: 127 tokens/s spinning, 110 sleeping), but two sessions taking turns lose the cores
    # to each other's spinning (speculative decoding, model + draft: 125 tokens/s spinning, 168 sleeping;
    # `python benchmarks/speculative.py` with and without spinning, one sitting, 2-core AMD EPYC).
    spin_wait: bool = field(default_factory=default_spin_wait)
    # ONNX Runtime's CPU arena keeps the largest run's buffers for the session's life. Serving wants that (no
    # allocation per request); validation runs a few big batches per session and holds several sessions, where
    # the arenas were most of kiln optimize's peak on a decoder (GPT-2 small: benchmarks/optimize_profile.py).
    # False also has a decoder's teacher-forced calls hand their freed memory back as they go (kiln.decoder.teacher).
    memory_arena: bool = True

    def __post_init__(self) -> None:
        for flag, value in (("threads", self.intra_op_threads), ("inter_op_threads", self.inter_op_threads)):
            if value is not None and not 1 <= value <= (os.cpu_count() or 1) * 4:
                raise UsageError(f"{flag} must be between 1 and {(os.cpu_count() or 1) * 4} (got {value})")
        object.__setattr__(self, "device", parse_choice(Device, self.device, "device"))


    @classmethod
    def for_variant(cls, record: VariantRecord, threads: int | None = None, device: Device | str = Device.CPU
                    ) -> EngineOptions:
        """Options a manifest variant record asks for (precision hint, streams), with the caller's threads."""
        return cls(intra_op_threads=threads, device=device, precision=record.options.precision,
                   streams=record.options.streams, rows_alone=record.options.rows_alone)




def require_cpu(device: str, runtime: str) -> None:
    """A UsageError for a GPU ``device`` on a runtime kiln runs on the CPU only."""
    if device != "cpu":
        raise UsageError(f"device {device}: kiln runs {runtime} on the cpu device only")


def warm_every_length(engine: Engine, max_length: int, multiple: int | None = None) -> int:
    """Warm ``engine``, and where batches are padded to a ``multiple`` (default: the engine's; OpenVINO 16), run
    each length bucket once; returns the runs.

    The CPU plugin builds kernels per new input shape: a server's first requests of each length would pay
    for it (on MiniLM openvino-fp32 a first pass over 1,024 mixed texts ran 49.8 texts/s, later ones 50.3-
    52.5). Warming every bucket before /ready turns 200 moves that cost to start-up.
    """
    engine.warmup()
    multiple = multiple or getattr(engine, "pad_multiple", 1)
    if multiple <= 1:
        return 1
    lengths = range(multiple, max_length + multiple, multiple)
    for length in lengths:
        engine.run(warmup_inputs(engine.input_names, min(length, max_length)))
    return 1 + len(lengths)


def warmup_inputs(input_names: tuple[str, ...], length: int = 8,
                  float_shapes: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """One row of ``length`` tokens; float inputs (a decoder's past keys/values) get their declared shape with each
    dynamic axis 1 for the batch and 0 elsewhere (an empty past)."""
    arrays = {
        "input_ids": np.ones((1, length), dtype=np.int64),
        "attention_mask": np.ones((1, length), dtype=np.int64),
        "token_type_ids": np.zeros((1, length), dtype=np.int64),
        "position_ids": np.arange(length, dtype=np.int64)[None],
        # the fused decoder step graph's (kiln.exporting.fused_decoder): the row's tokens - 1, the longest row's
        SEQLENS_K: np.array([length - 1], dtype=np.int32),
        TOTAL_LENGTH: np.array(length, dtype=np.int32),
        LOGITS_AT: np.arange(length, dtype=np.int64)[None],
    }
    for name, dims in (float_shapes or {}).items():
        shape = [d if isinstance(d, int) else (1 if axis == 0 else 0) for axis, d in enumerate(dims)]
        arrays[name] = np.zeros(shape, dtype=np.float32)
    return {n: arrays[n] for n in input_names}
