"""The benchmark's results file and the report's input: one typed record, versioned, serialised by kiln.records.

`kiln bench` fills every part; `kiln optimize`'s report carries the optimize section alone. ``read_results``
reads kiln.bench/1 files (written before typed records) as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kiln.artifact.manifest import Manifest
from kiln.artifact.records import ReferenceTiming, Status, StoredVectors
from kiln.bench.measure import Timing
from kiln.bench.worker import BenchSettings, SweepPoint, TargetResult
from kiln.errors import ArtifactError
from kiln.records import from_jsonable, read_json
from kiln.validation.batching import BatchedAgreement
from kiln.validation.figures import Agreement

SCHEMA = "kiln.bench/2"  # 2: typed records; 1 still read
READABLE_SCHEMAS = ("kiln.bench/1", SCHEMA)
RESULTS_FILE = "results.json"


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
    environment: Mapping[str, Any]  # kiln.bench.environment.fingerprint(): CPU, libraries, int8 kernels
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
