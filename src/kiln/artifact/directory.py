"""Open a verified artifact directory and build predictors from its variants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kiln.artifact.manifest import Manifest, read_manifest, verify
from kiln.artifact.plan import ServingPlan
from kiln.engines import Engine, EngineOptions, create_engine, open_sessions
from kiln.errors import ArtifactError, UsageError
from kiln.log import get_logger
from kiln.records.artifact import BuildRecord, ServingDefault, Status, VariantRecord
from kiln.records.task import TaskConfig
from kiln.runtime.predictor import Predictor
from kiln.runtime.tokenization import TextEncoder
from kiln.tasks import task_handler

if TYPE_CHECKING:
    from kiln.artifact.cpu_pick import CpuPick

_log = get_logger("artifact")


@dataclass
class Artifact:
    path: Path
    manifest: Manifest
    _pick: CpuPick | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path, *, check: bool = True) -> Artifact:
        """Open ``path``; with ``check`` (the default) every file's checksum is verified first."""
        directory = Path(path).expanduser()
        return cls(directory, verify(directory) if check else read_manifest(directory))

    @property
    def task_config(self) -> TaskConfig:
        return self.manifest.task

    def variant_name(self, name: str | None = None) -> str:
        """``name``, checked; None: the variant for this CPU (``cpu_pick``)."""
        variants = self.manifest.variants
        if name is None:
            name = self.cpu_pick().variant if variants else None
        if name not in variants:
            raise UsageError(f"variant must be one of: {', '.join(variants) or '(none)'} (got {name!r})")
        return name

    def cpu_pick(self) -> CpuPick:
        """The variant run on this CPU when none is named, and why: kiln optimize's best on the CPU class it was
        validated on, else the fastest that passes re-validation here (kiln.artifact.cpu_pick; once per instance)."""
        if self._pick is None:
            from kiln.artifact.cpu_pick import pick_variant

            self._pick = pick_variant(self)
        return self._pick

    def variant(self, name: str | None = None) -> VariantRecord:
        return self.manifest.variants[self.variant_name(name)]

    def encoder(self) -> TextEncoder:
        spec = self.manifest.tokenizer
        return TextEncoder.from_file(self.path / spec.path, max_length=self.task_config.max_length,
                                     pad_id=spec.pad_id, input_names=spec.input_names)

    def serving_default(self, variant: str | None = None, device: str = "cpu") -> ServingDefault | None:
        """`kiln bench`'s best sessions x threads x batch size x padding for this variant (None when it was not
        benchmarked, or for a GPU device: the sweep ran on the CPU)."""
        default = self.manifest.build.serving_default
        fits = default is not None and device == "cpu" and default.variant == self.variant_name(variant)
        return default if fits else None

    def serving_plan(self, variant: str | None = None, *, threads: int | None = None, sessions: int | None = None,
                     batch_size: int | None = None, pad_multiple: int | None = None,
                     device: str = "cpu", spin_wait: bool | None = None, split_cores: bool = False) -> ServingPlan:
        """How to run a variant: each setting from the caller, else from `kiln bench`'s serving default
        (serving.json), else kiln's default (all usable cores, 1 session, batches of 32, the engine's padding).
        A split plan's batches default to ``SPLIT_CORES_BATCH``.

        ``split_cores`` (offline callers: ``kiln.load``, ``kiln embed``): where neither the caller nor serving.json
        says how, an OpenVINO variant of a one-pass task runs as many streams as OpenVINO's throughput hint picks
        (one single-thread stream per core on a small box), and a lone batch on one session of all cores
        (``ServingPlan.solo_threads``): see ``split_cores_plan``."""
        measured = self.serving_default(variant, device)
        default = measured or ServingDefault(self.variant_name(variant))
        solo_threads = None
        if split_cores and threads is None and sessions is None and measured is None:
            solo_threads = split_cores_plan(self.variant(variant).engine, self.task_config.task, device)
        threads = threads if threads is not None else default.threads
        options = EngineOptions.for_variant(self.variant(variant), threads, device)
        if spin_wait is not None:
            options = replace(options, spin_wait=spin_wait)
        if solo_threads is None and sessions is None:
            sessions = default.sessions  # else None with a solo: the runtime picks the streams
        if batch_size is None:
            batch_size = SPLIT_CORES_BATCH if solo_threads is not None else default.batch_size
        return ServingPlan(options, sessions, batch_size,
                           pad_multiple if pad_multiple is not None else default.pad_multiple,
                           solo_threads)

    def reference_variant(self) -> VariantRecord | None:
        """The fp32 export live answers are compared with: the kept reference, else an onnx-fp32 variant."""
        return self.manifest.build.reference_variant or self.manifest.variants.get("onnx-fp32")

    def engine(self, variant: str | None = None, options: EngineOptions | None = None) -> Engine:
        """The variant's engine; ``options`` default to what the variant's record asks for."""
        record = self.variant(variant)
        options = options or EngineOptions.for_variant(record)
        model_path = self.path / record.path
        if not model_path.exists():
            raise ArtifactError(f"variant {self.variant_name(variant)} points at {model_path}, which is missing")
        return create_engine(record.engine, model_path, options)

    def predictor(self, variant: str | None = None, plan: ServingPlan | None = None) -> Predictor:
        """A predictor for the variant run as ``plan`` says (default: ``serving_plan``): ``plan.sessions`` engine
        sessions take batches side by side."""
        plan = plan or self.serving_plan(variant)
        record = self.variant(variant)
        if record.status is Status.REJECTED:  # kept for comparison (timed, benchmarked), loaded only when named
            _log.warning("variant %s was rejected by kiln optimize (%s); its answers are outside the tolerance",
                         record.name, record.reason)
        return self.predictor_of(record, plan)

    def predictor_of(self, record: VariantRecord, plan: ServingPlan) -> Predictor:
        """A predictor for one variant record of this artifact (a variant, or the kept fp32 reference)."""
        model_path = self.path / record.path
        if not model_path.exists():
            raise ArtifactError(f"variant {record.name} points at {model_path}, which is missing")
        engines = open_sessions(record.engine, model_path, plan.options, plan.sessions)
        split = plan.solo_threads is not None and len(engines) > 1
        _log.info("variant %s: %d session(s)%s%s", record.name, len(engines),
                  " picked by the runtime" if plan.sessions is None else
                  f" x {plan.options.intra_op_threads or 'all'} thread(s)",
                  f", a lone batch on {plan.solo_threads} threads" if split else "")
        solo = None
        if split:
            solo = create_engine(record.engine, model_path, replace(plan.options, intra_op_threads=plan.solo_threads))
        return Predictor(task_handler(self.task_config), self.encoder(), engines[0], batch_size=plan.batch_size,
                         sessions=engines[1:], solo=solo, pad_multiple=plan.pad_multiple,
                         output_calibration=self.output_calibration(),
                         stored_vectors=self.manifest.build.stored_vectors)

    def output_calibration(self) -> np.ndarray | None:
        """The fp32 reference's vectors of the calibration texts (kiln optimize stores them for embedding tasks):
        where int8/uint8 output precision takes its ranges. None when the artifact has none."""
        name = self.manifest.build.output_calibration
        if name is None:
            return None
        path = self.path / name
        if not path.is_file():
            raise ArtifactError(f"{self.path}: the manifest names output calibration {name}, which is missing")
        return np.load(path, allow_pickle=False)


# The batch size of an offline pass split across single-thread streams (split_cores_plan) where serving.json does
# not say. Measured: the peers' 1,024 texts end to end through kiln.load(...).predict, openvino-int8-static MiniLM,
# 2-core AVX-512 VNNI EPYC, 5 alternated rounds (benchmarks/experiments/offline_sessions/batch_size.py at 91ffdaf):
# batches of 8 227.1 texts/s, 12 226.0, 16 224.5, 32 211.2 (medians; every round of 8 beat every round of 32). Why
# smaller batches run faster on a single-thread stream (activations staying in cache?) was not measured, nor was 8 on
# the AMX or AVX2-only CPUs; an earlier CPU of this project ran 2 x 1 streams with batches of 16 ~1.2x faster than
# 1 x 2 with 32 (FIELD-NOTES). kiln bench's sweep measures it on the machine at hand (serving.json).
SPLIT_CORES_BATCH = 8


def split_cores_plan(engine: str, task: str, device: str) -> int | None:
    """The solo session's threads where an offline predictor with no serving.json splits the cores, else None
    (kiln's one session of all cores). For an OpenVINO variant of a one-pass task it runs as many streams as
    OpenVINO's throughput hint picks (on the 2-core machines kiln was measured on: one single-thread stream per
    core; on a large server it sizes streams to the model rather than one per core), and a lone batch on a session
    of all cores (the returned count).

    Why: passes over many texts ran faster as one stream per core than as one stream of all cores (the peers'
    1,024 texts, openvino-bf16 MiniLM, a 2-core AMX Xeon: +6%, +29%, +10% and +5% in runs of
    benchmarks/experiments/offline_sessions at 91ffdaf, 1.62x, 1.40x, 1.05x alternated in benchmarks/peers.py), and kiln
    bench's sweep chose 2 x 1 on the EPYCs too: the threads of one request wait at every op for whichever was
    preempted, separate streams run on. A single text on one thread takes twice as long, hence the solo session
    for a call that makes one batch. Only OpenVINO: its streams are requests of one compiled model (the weights
    once); ONNX Runtime sessions each hold their weights and an arena.

    The price is memory: each stream's thread frees its buffers into its own heap arena, and the solo model is
    a second compiled model (same model and texts, resident after the pass,
    benchmarks/experiments/offline_sessions/memory.py at 91ffdaf: 478-504 MiB as one session, 797-849 as two streams and
    970-1006 with the solo model before the predictor trimmed the heap after long passes; 515 and 655 since).
    ``sessions=1`` where memory counts more."""
    from kiln.choices import Scheduling
    from kiln.engines import STREAMING_ENGINES
    from kiln.system.cpu import cpu_info
    from kiln.tasks import task_spec

    cores = cpu_info().usable_cores
    if device != "cpu" or engine not in STREAMING_ENGINES or cores < 2 \
            or task_spec(task).scheduling is not Scheduling.BATCH:
        return None
    return cores


def copy_variant(root: Path, manifest: Manifest, name: str | None, dest: Path) -> Path:
    """A self-contained artifact of one variant of ``root`` (its files, the tokenizer, a sealed manifest).

    ``name=None`` copies the tokenizer and task settings alone (no variant): enough to tokenize and
    post-process, as the tokenizer and post-processing steps of a Triton ensemble do.
    """
    from kiln.artifact.manifest import seal

    record = manifest.variants[name] if name is not None else None
    reference = manifest.build.reference_variant if record else None  # live agreement needs it beside the variant
    copy_files(root, variant_files(root, manifest, record), dest)
    calibration = manifest.build.output_calibration
    default = manifest.build.serving_default
    build = BuildRecord(best=name, serving_default=default if name is not None and default is not None
                        and default.variant == name else None, reference_variant=reference,
                        tolerance=manifest.build.tolerance, output_calibration=calibration,
                        stored_vectors=manifest.build.stored_vectors,
                        retrieval_tolerance=manifest.build.retrieval_tolerance,
                        # what re-validates the copy on another CPU class (kiln.artifact.cpu_pick)
                        cpu=manifest.build.cpu if record else {},
                        agreement_inputs=manifest.build.agreement_inputs if record else None,
                        unchecked_classes=manifest.build.unchecked_classes,
                        emulated_classes=manifest.build.emulated_classes, device=manifest.build.device)
    seal(dest, Manifest(source=manifest.source, task=manifest.task, tokenizer=manifest.tokenizer,
                        variants={name: record} if record else {}, build=build))
    return dest


def variant_files(root: Path, manifest: Manifest, record: VariantRecord | None) -> list[str]:
    """What a variant needs beside it (paths relative to ``root``): its files, the kept fp32 reference (live
    agreement), the tokenizer, the output calibration (output precision's ranges) and the stored agreement inputs
    (re-validation on another CPU class); the tokenizer alone for None."""
    tokenizer_dir = Path(manifest.tokenizer.path).parent
    tokenizer_files = [p.relative_to(root).as_posix() for p in (root / tokenizer_dir).rglob("*") if p.is_file()]
    reference = manifest.build.reference_variant if record else None
    extras = [f for f in (manifest.build.output_calibration, manifest.build.agreement_inputs if record else None) if f]
    return list(dict.fromkeys([*(record.files if record else ()), *(reference.files if reference else ()),
                               *tokenizer_files, *extras]))


def copy_files(root: Path, files: Sequence[str], dest: Path) -> None:
    """Copy ``files`` (relative paths) from ``root`` to the same places under ``dest``."""
    import shutil

    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)


def extract_variant(artifact: Artifact, variant: str | None, dest: Path, *, model: bool = True) -> Path:
    """``copy_variant`` of an opened artifact: ``variant`` alone, servable by itself, at ``dest``; with
    ``model=False`` only its tokenizer and task settings."""
    return copy_variant(artifact.path, artifact.manifest, artifact.variant_name(variant) if model else None, dest)


def load(path: str | Path, variant: str | None = None, *, threads: int | None = None,
         device: str = "cpu", batch_size: int | None = None, sessions: int | None = None,
         pad_multiple: int | None = None, spin_wait: bool | None = None) -> Predictor:
    """Open and verify an artifact and return a ready predictor for one of its variants.

    ``threads``, ``sessions``, ``batch_size`` and ``pad_multiple`` default to the serving default ``kiln bench``
    measured and wrote into the artifact (serving.json), else to all usable cores, 1, 32 and the engine's own
    (an OpenVINO variant of a one-pass task: the cores split into streams, batches of ``SPLIT_CORES_BATCH``).
    ``spin_wait=False``: ONNX Runtime's threads sleep between runs instead of spinning (load a speculative
    decoding's model and draft so: they take turns on the same cores); None: spin unless KILN_SPIN_WAIT=0.
    """
    artifact = Artifact.open(path)
    return artifact.predictor(variant, artifact.serving_plan(
        variant, threads=threads, sessions=sessions, batch_size=batch_size, pad_multiple=pad_multiple,
        device=device, spin_wait=spin_wait, split_cores=True))
