"""The typed parts of an artifact's manifest: where the model came from, its tokenizer, each variant (files,
recipe, engine hints and, after kiln optimize, how it fared), and what the build recorded about the run.

Frozen dataclasses, serialised only by :mod:`kiln.records`; code reads fields, never string keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.choices import Choice, Precision
from kiln.records.batching import BatchedAgreement
from kiln.records.figures import Agreement
from kiln.records.parity import ParityReport
from kiln.records.timing import Timing


class Status(Choice):
    """What happened to a variant in kiln optimize."""

    ACCEPTED = "accepted"  # built, validated, within tolerance
    REJECTED = "rejected"  # built and validated, outside tolerance
    SKIPPED = "skipped"  # cannot be built here (missing package, CPU feature)
    FAILED = "failed"  # a pass or its validation raised


@dataclass(frozen=True)
class SourceRecord:
    """The model an artifact was built from."""

    model: str = ""  # as the user named it (directory, hub id, or the bundled model's name)
    path: str | None = None  # where it was read from on the building machine
    content_sha256: str = ""
    model_type: str = ""
    architecture: str = ""
    parameters: int = 0
    adapter: str = ""  # the task LoRA adapter merged into the weights (Jina v3's retrieval.query, ...); empty: none


@dataclass(frozen=True)
class TokenizerRecord:
    path: str  # tokenizer.json, relative to the artifact root
    pad_id: int
    input_names: tuple[str, ...]


@dataclass(frozen=True)
class EngineHints:
    """Engine settings a variant needs to compute what was validated (OpenVINO's precision hint, its streams)."""

    precision: Precision = Precision.FP32
    streams: int | None = None
    rows_alone: bool = False  # each row of a batch run on its own: batch-invariant (kiln.engines.rows)


@dataclass(frozen=True)
class Round:
    """One attempt of the int8 exclusion search: how many layers were kept in fp32, and the result."""

    excluded: int
    agreement: float
    accepted: bool


@dataclass(frozen=True)
class Sensitivity:
    """The int8 exclusion search of one variant: the ranking it used and what it found."""

    ranking: tuple[tuple[str, float], ...]  # (layer, relative int8 error), worst first (top 10)
    rounds: tuple[Round, ...]
    excluded: tuple[str, ...]  # layers kept in fp32 in the final variant
    accepted: bool
    speed_cost: float | None = None  # time with the exclusions / time fully quantized (> 1: slower)
    bound: str = ""  # how many layers the search could keep in fp32 and why (kiln.optimizing.sensitivity.paying_limit)


@dataclass(frozen=True)
class VariantRecord:
    """One variant: its files and how they were made (every artifact), and how it fared (after kiln optimize)."""

    name: str
    engine: str  # the kiln.engines registry name
    path: str  # the model file, relative to the artifact root
    files: tuple[str, ...]  # every file it needs (some may be shared with another variant)
    recipe: tuple[Mapping[str, Any], ...] = ()  # the passes that made it, each with its own parameters
    options: EngineHints = EngineHints()
    parity: ParityReport | None = None  # kiln export's check against PyTorch
    status: Status = Status.ACCEPTED
    reason: str = ""  # why it was accepted or rejected, in the gate's words
    agreement: Agreement | None = None
    task_metric: Mapping[str, float] | None = None
    timing: Timing | None = None
    size_bytes: int = 0
    parameters: Mapping[str, Any] = field(default_factory=dict)  # alternative build parameters that were kept
    sensitivity: Sensitivity | None = None
    batched: BatchedAgreement | None = None  # agreement under each batching, and the drift between them

    @property
    def batch_invariant(self) -> bool | None:
        """Bit-identical answers whatever the batch (None: not measured, e.g. a plain export)."""
        return self.batched.drift.invariant if self.batched else None

    @property
    def validated(self) -> bool:
        """Judged by kiln optimize (a plain export carries parity only)."""
        return self.agreement is not None or self.status is not Status.ACCEPTED

    def summary(self) -> str:
        """How it fared, in one line (kiln info): the gate's verdict in its own words, speed and batch drift after
        kiln optimize; the export's parity check against PyTorch where there is one."""
        parts = []
        if self.validated:
            parts.append(f"{self.status.value}: {self.reason}" if self.reason else self.status.value)
            if self.timing is not None:  # on the machine that built it
                timing = self.timing
                parts.append(f"{timing.sequences_per_second:.1f} seq/s at batch {timing.batch_size} when built")
            if self.batched is not None:
                drift = self.batched.drift
                parts.append(drift.describe() if drift.invariant else f"moves with the batch: {drift.describe()}")
        if self.parity is not None:
            parts.append(f"parity vs PyTorch: max |diff| {self.parity.max_abs_diff:.2e}, "
                         f"min cosine {self.parity.min_cosine:.6f}")
        return "; ".join(parts) or "no parity recorded"


@dataclass(frozen=True)
class ServingDefault:
    """kiln bench's fastest way to run one variant on the machine it measured (serving.json)."""

    variant: str
    sessions: int = 1
    threads: int | None = None
    batch_size: int = 32
    pad_multiple: int | None = None


@dataclass(frozen=True)
class ReferenceTiming:
    """The PyTorch fp32 baseline's timing, and the attention implementation it ran."""

    sequences: int
    seconds: float
    batch_size: int
    attention: str = "eager"
    new_tokens: int = 0  # a decoder's: each sequence a prompt continued by this many tokens (bench.measure.Timing)

    @property
    def ms_per_sequence(self) -> float:
        return 1000 * self.seconds / self.sequences


@dataclass(frozen=True)
class StoredVectors:
    """What storing an embedding at one (Matryoshka size, output precision) costs in retrieval, measured by kiln
    optimize --precisions / --matryoshka-dims (kiln.validation.stored_vectors)."""

    dimensions: int
    precision: str  # kiln.runtime.precision.Precision's value
    search: str  # how it was searched (kiln.validation.stored_vectors.Search): cosine, decoded cosine, hamming...
    recall_at_10: float  # of the full-size float32 neighbours
    bytes_per_vector: int
    mib_per_million: float
    queries_per_s: float  # exact search of the held-out corpus, on the machine that built the artifact
    accepted: bool  # recall_at_10 >= 1 - the retrieval tolerance (and NDCG@10 within it of float32's, if measured)
    ndcg_at_10: float | None = None  # on the user's --eval judgements (query, text, relevance); None: none given



@dataclass(frozen=True)
class BuildRecord:
    """What the run that built the artifact recorded beside its variants."""

    best: str | None = None  # the variant kiln.load picks by default
    skipped: Mapping[str, str] = field(default_factory=dict)  # variants with no files: why
    tolerance: float | None = None
    cpu: Mapping[str, Any] = field(default_factory=dict)  # kiln.system.cpu.CpuInfo.to_dict() of the building CPU
    calibration: str | None = None  # where the int8 calibration inputs came from
    reference_timing: ReferenceTiming | None = None
    eval: str | None = None  # where the task metric's labelled data came from
    reference: SourceRecord | None = None  # the original judged against, when not the model itself
    reference_metric: Mapping[str, float] | None = None
    serving_default: ServingDefault | None = None
    # The original exported in fp32, kept beside the variants (never a candidate for best): what kiln serve
    # --shadow-rate runs sampled live inputs through to measure the served variant's agreement.
    reference_variant: VariantRecord | None = None
    # Embedding tasks: the fp32 reference's vectors of the calibration texts (an .npy beside the manifest), which
    # int8/uint8 output precision takes its per-dimension ranges from, so every server and job quantizes alike.
    output_calibration: str | None = None
    # What each stored (size, precision) costs in retrieval, and which passed --retrieval-tolerance; kiln serve
    # refuses a rejected one (empty: not measured, nothing refused).
    stored_vectors: tuple[StoredVectors, ...] = ()
    retrieval_tolerance: float | None = None
    # The inputs every variant was judged on (a JSON list beside the manifest): on a CPU of another class than
    # ``cpu``'s, loading re-validates the variants with them against the kept fp32 reference (kiln.artifact.cpu_pick).
    agreement_inputs: str | None = None
    # kiln optimize --for: CPU classes it was asked to validate for and could not here, each with why.
    unchecked_classes: Mapping[str, str] = field(default_factory=dict)
    # kiln optimize --for, classes with fewer instructions than the building CPU's: each OpenVINO variant judged with
    # oneDNN capped to them (kiln.artifact.emulation): {class: {"isa", "variants": {name: verdict, kernels}} | "error"}.
    emulated_classes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Where kiln optimize validated and timed the variants: "cuda" for --target cuda on a CUDA machine. best is then
    # the GPU's fastest, and the CPU class of the machine that loads it does not change the pick.
    device: str = "cpu"
