"""The benchmark's results file and the report's input: one typed record, versioned, serialised by kiln.records.

`kiln bench` fills every part; `kiln optimize`'s report carries the optimize section alone. ``read_results``
reads kiln.bench/1 files (written before typed records) as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import ArtifactError
from kiln.records import from_jsonable, read_json
from kiln.records.artifact import ReferenceTiming, Status, StoredVectors
from kiln.records.batching import BatchedAgreement
from kiln.records.figures import Agreement
from kiln.records.timing import GenerationCell, LatencyStats, MixResult, Timing

SCHEMA = "kiln.bench/2"  # 2: typed records; 1 still read
READABLE_SCHEMAS = ("kiln.bench/1", SCHEMA)
RESULTS_FILE = "results.json"
INT8, FP32, BF16 = "int8", "fp32", "bf16"  # the precisions a weight GEMM is timed in (kiln.benchmarking.gemm)

if TYPE_CHECKING:  # read by the constructors below, whose callers hold them already
    from kiln.artifact.manifest import Manifest
    from kiln.benchmarking.worker import BenchSettings


@dataclass(frozen=True)
class VariantSummary:
    """What kiln optimize measured of one variant, as the report's summary shows it."""

    status: Status = Status.ACCEPTED
    reason: str = ""
    agreement: Agreement | None = None
    task_metric: Mapping[str, float] | None = None
    timing: Timing | None = None
    size_bytes: int = 0
    batched: BatchedAgreement | None = None


@dataclass(frozen=True)
class OptimizeSection:
    """What kiln optimize recorded for the artifact (None in a results file for a plain export)."""

    variants: Mapping[str, VariantSummary]
    best: str | None = None
    tolerance: float | None = None
    reference_timing: ReferenceTiming | None = None
    reference_metric: Mapping[str, float] | None = None
    skipped: Mapping[str, str] = field(default_factory=dict)
    calibration: str | None = None
    reference: str | None = None  # the original judged against, when not the model itself
    stored_vectors: tuple[StoredVectors, ...] = ()  # retrieval cost per (size, output precision)
    retrieval_tolerance: float | None = None

    @classmethod
    def of(cls, manifest: Manifest) -> OptimizeSection | None:
        if not any(record.validated for record in manifest.variants.values()):
            return None
        build = manifest.build
        return cls(
            variants={name: VariantSummary(r.status, r.reason, r.agreement, r.task_metric, r.timing, r.size_bytes,
                                           r.batched) for name, r in manifest.variants.items()},
            best=build.best, tolerance=build.tolerance, reference_timing=build.reference_timing,
            reference_metric=build.reference_metric, skipped=build.skipped, calibration=build.calibration,
            reference=build.reference.model if build.reference else None, stored_vectors=build.stored_vectors,
            retrieval_tolerance=build.retrieval_tolerance)


@dataclass(frozen=True)
class SettingsRecord:
    """BenchSettings as recorded: the length mix by its size, not its texts."""

    batch_sizes: tuple[int, ...] = ()
    seq_lens: tuple[int, ...] = ()
    mix_texts: int = 0
    threads: int = 0
    budget_s: float = 0.0
    batch_size: int = 32
    sweep: tuple[tuple[int, int, int], ...] = ()
    pad_multiples: tuple[int, ...] = ()
    min_runs: int = 5
    mix_rounds: int = 2
    new_tokens: int = 32
    generation_runs: int = 3

    @classmethod
    def of(cls, settings: BenchSettings) -> SettingsRecord:
        return cls(settings.batch_sizes, settings.seq_lens, len(settings.mix), settings.threads, settings.budget_s,
                   settings.batch_size, settings.sweep, settings.pad_multiples, settings.min_runs,
                   settings.mix_rounds, settings.new_tokens, settings.generation_runs)


@dataclass(frozen=True)
class ServingRecord:
    """The sweep point kiln bench wrote into the artifact as its serving default, and the sweep it came from."""

    variant: str
    sessions: int
    threads: int
    batch_size: int
    pad_multiple: int
    measured_sorted_per_s: float = 0.0
    sweep: tuple[SweepPoint, ...] = ()


@dataclass(frozen=True)
class BenchResults:
    """results.json of `kiln bench`, and the input of report.html / report.md (kiln optimize's too)."""

    model: str | None
    task: str
    command: str
    environment: Mapping[str, Any]  # kiln.benchmarking.environment.fingerprint(): CPU, libraries, int8 kernels
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    artifact: str | None = None
    settings: SettingsRecord | None = None
    baseline: str = "pytorch-fp32"
    targets: tuple[TargetResult, ...] = ()
    optimize: OptimizeSection | None = None
    serving_default: ServingRecord | None = None

    def target(self, name: str) -> TargetResult:
        return next(t for t in self.targets if t.name == name)


def _from_version_1(body: dict[str, Any]) -> dict[str, Any]:
    """kiln.bench/1 kept the length mix as {"texts": N}."""
    settings = dict(body.get("settings") or {})
    mix = settings.pop("mix", None)
    settings["mix_texts"] = mix.get("texts", 0) if isinstance(mix, dict) else 0
    return {**body, "settings": settings}


def read_results(path: Path) -> BenchResults:
    """A results.json written by `kiln bench` (kiln.bench/1 or /2); ArtifactError for anything else."""
    body = read_json(Path(path), READABLE_SCHEMAS)
    if body["schema"] == "kiln.bench/1":
        body = _from_version_1(body)
    try:
        return from_jsonable(BenchResults, body)
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{path} is missing or has malformed fields ({err})") from err


@dataclass(frozen=True)
class SkippedCell:
    batch_size: int
    seq_len: int
    reason: str


@dataclass(frozen=True)
class SweepPoint:
    """Throughput of ``sessions`` engine sessions with ``threads`` each on the sorted mix in batches of
    ``batch_size`` padded to a multiple of ``pad_multiple`` tokens, and batch-1 latency at 128."""

    sessions: int
    threads: int
    sorted_per_s: float
    b1_128_ms: float
    batch_size: int = 32
    pad_multiple: int = 1


@dataclass(frozen=True)
class TargetResult:
    name: str
    load_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    grid: tuple[LatencyStats, ...] = ()
    skipped_cells: tuple[SkippedCell, ...] = ()
    mix: MixResult | None = None
    sweep: tuple[SweepPoint, ...] = ()
    gemm: GemmBound | None = None
    generation: tuple[GenerationCell, ...] = ()  # decoders: time to first token and per-token latency
    error: str | None = None


@dataclass(frozen=True)
class GemmBound:
    """The weight GEMMs of a variant timed alone, and what the variant itself reached, at 32 x 128 tokens."""

    gemms: int
    int8_gemms: int
    gop_per_sequence: float  # weight GEMM work of one 128-token sequence (a multiply-add counts 2)
    int8_gops: float  # this CPU's measured rate on these shapes, every GEMM in int8
    fp32_gops: float  # the same, every GEMM in fp32
    int8_bound_per_s: float  # sequences/s if every weight GEMM ran in int8 and nothing else ran
    own_bound_per_s: float  # sequences/s with each GEMM in the variant's own precision
    reached_per_s: float  # the variant, 32 x 128 tokens
    of_int8_bound: float  # reached / int8 bound
    of_own_bound: float  # reached / own bound
    kernel: str
    bf16_gops: float | None = None  # the same GEMMs in bf16 (OpenVINO), where the CPU has native bf16; else None
    bf16_bound_per_s: float | None = None  # sequences/s if every weight GEMM ran in bf16 and nothing else ran
    reached_as: str = ""  # how the variant reached it: "sessions x threads" (kiln bench: the faster of its ways)

    @property
    def best_precision(self) -> str:
        """The precision whose bound is highest on this CPU (int8, or bf16 where it is faster: AMX)."""
        return BF16 if (self.bf16_bound_per_s or 0.0) > self.int8_bound_per_s else INT8

    @property
    def best_bound_per_s(self) -> float:
        """The ceiling of any variant of this model on this CPU: the faster of the int8 and bf16 bounds."""
        return max(self.int8_bound_per_s, self.bf16_bound_per_s or 0.0)

    @property
    def of_best_bound(self) -> float:
        return self.reached_per_s / self.best_bound_per_s

    def with_reached(self, reached_per_s: float, reached_as: str = "") -> GemmBound:
        """The same bounds against another figure of what the variant reached (``reached_as``: how)."""
        return replace(self, reached_per_s=reached_per_s, of_int8_bound=reached_per_s / self.int8_bound_per_s,
                       of_own_bound=reached_per_s / self.own_bound_per_s, reached_as=reached_as)
