"""kiln optimize STATIC --reference TEACHER: a static-embedding student (kiln distill --static), judged like any
student against the model it was distilled from.

A static model has one variant, its token table, and nothing to build or quantize. The run judges it as every
variant is judged (under every batching, with the task metric, through the gate, timed against the teacher's
PyTorch fp32 in the same run) with one difference: it lives in a space of its own (its table is PCA-rotated and
usually smaller, and it encodes without special tokens), so it encodes the agreement texts itself and only the
figures that need no shared space compare it with the teacher: the Spearman of every pair's similarity (gated,
``>= 1 - tolerance``) and how many of each text's ten nearest neighbours it keeps. The written artifact is the
student's, with the verdict, timings, output-precision calibration and (with --precisions) the stored-vector
table recorded; ``best/`` only when it passed.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from kiln.artifact.directory import Artifact, copy_files, variant_files
from kiln.artifact.manifest import Manifest, read_manifest, seal
from kiln.artifact.staging import staged_directory
from kiln.engines import EngineOptions, create_engine
from kiln.errors import UsageError
from kiln.optimizing.job import (
    OUTPUT_CALIBRATION_TEXTS,
    NothingPassed,
    OptimizeConfig,
    Progress,
    gate_verdict,
    measure_stored_vectors,
    time_original,
    write_best,
    write_output_calibration,
)
from kiln.optimizing.outcome import Outcome, RunSummary, write_stored_vectors, write_summaries
from kiln.records.artifact import BuildRecord, ReferenceTiming, Status
from kiln.records.bench import BenchResults, OptimizeSection
from kiln.report.html import write_report
from kiln.runtime.predictor import Predictor
from kiln.runtime.timing import time_predictor
from kiln.source.loading import SourceModel, load_source
from kiln.source.reference import reference_predictor
from kiln.system.cpu import cpu_info
from kiln.system.invocation import invocation
from kiln.system.versions import library_versions
from kiln.tasks import task_handler, task_spec
from kiln.validation import datasets
from kiln.validation.agreement import agreement_inputs
from kiln.validation.batching import measure_batchings
from kiln.validation.gate import tolerance_for

STATIC_ENGINE = "static"


def static_artifact(model: str | None) -> Path | None:
    """The kiln artifact of a static model at ``model`` (the directory kiln distill --static wrote, or its
    artifact/ itself); None for any other model."""
    from kiln.compress.static import ARTIFACT_DIR

    if model is None:
        return None
    path = Path(model).expanduser()
    for candidate in (path / ARTIFACT_DIR, path):
        if (candidate / "manifest.json").is_file() and \
                any(v.engine == STATIC_ENGINE for v in read_manifest(candidate).variants.values()):
            return candidate
    return None


def judge_static(config: OptimizeConfig, directory: Path, progress: Progress = lambda _: None) -> RunSummary:
    """Judge the static model whose artifact is ``directory`` against ``config.reference``; write the judged
    artifact at ``config.output``. Raises NothingPassed (with the summary) when it is outside the tolerance."""
    _check_request(config)
    spec, tolerance, cpu = task_spec(config.task), tolerance_for(config.task, config.tolerance), cpu_info()
    threads = config.threads or cpu.usable_cores
    student = Artifact.open(directory)
    progress(f"loading the teacher {config.reference}: the static model is judged and timed against it")
    teacher = load_source(config.reference, config.task, allow_pickle=config.allow_pickle)
    _check_teacher(student, teacher)
    reference = reference_predictor(teacher, batch_size=config.batch_size, threads=threads)
    progress("running the teacher (PyTorch fp32) on the agreement set")
    texts = spec.validation.agreement_inputs(reference.encoder)
    data = dataclasses.replace(agreement_inputs(reference, texts), own_space=True)
    eval_set = datasets.eval_set(config.task, config.eval_file)
    reference_metric = spec.validation.evaluate(reference, eval_set) if eval_set else None
    timing_texts = spec.validation.timing_inputs(reference.encoder)

    with staged_directory(config.output, overwrite=config.overwrite) as stage:
        record = student.variant()
        copy_files(student.path, variant_files(student.path, student.manifest, record), stage)
        candidate, sessions = (_predictor(student, stage / record.path, config.batch_size, n) for n in (1, 2))
        progress("judging the static table under every batching, in its own space")
        start = time.perf_counter()
        batched = measure_batchings(data, candidate, sessions)
        metric = spec.validation.evaluate(candidate, eval_set) if eval_set else None
        verdict = gate_verdict(config.task, batched, metric, reference_metric, tolerance)
        status = Status.ACCEPTED if verdict.accepted else Status.REJECTED
        progress(f"static: {status.value} ({verdict.reason})")
        progress(f"timing the teacher's PyTorch fp32 and the static table on {len(timing_texts)} sequences")
        reference_timing, attention = time_original(teacher, tuple(reference.prepare(timing_texts).encodings),
                                                    config.batch_size, threads)
        timing = time_predictor(candidate, candidate.prepare(timing_texts).encodings)
        outcome = Outcome(record.name, status, verdict.reason, record=record,
                          agreement=batched.agreements[batched.worst], metric=metric, timing=timing,
                          size_bytes=sum((stage / f).stat().st_size for f in record.files), batched=batched,
                          build_seconds=time.perf_counter() - start)
        summary = RunSummary(
            model=student.manifest.source.model, task=spec.name, tolerance=tolerance,
            primary_metric=spec.validation.metric if eval_set else None, reference_metric=reference_metric,
            reference_timing=reference_timing, outcomes=(outcome,), best=record.name if verdict.accepted else None,
            command=invocation(), baseline_attention=attention, calibration="none: a static table is not quantized",
            reference=teacher.name,
            environment={"cpu": cpu.to_dict(), "threads": threads, "versions": library_versions()})
        write_summaries(stage, summary)
        if not verdict.accepted:  # nothing is written; the summary goes to the frontier of kiln optimize's students
            raise NothingPassed(f"the static model is outside the tolerance against {teacher.name}: "
                                f"{verdict.reason}. Raise --tolerance (a static table trades fidelity for speed) "
                                "or distil with more --dims", summary)
        texts = datasets.read_inputs(config.calibration_file, config.task) if config.calibration_file else \
            spec.validation.calibration_inputs(reference.encoder, OUTPUT_CALIBRATION_TEXTS)
        calibration = write_output_calibration(stage, candidate, texts)
        stored = measure_stored_vectors(config, candidate, np.load(stage / calibration), progress, eval_set) \
            if config.precisions else ()
        if stored:
            write_stored_vectors(stage, stored, config.retrieval_tolerance)
        manifest = Manifest(
            source=student.manifest.source, task=student.task_config, tokenizer=student.manifest.tokenizer,
            variants={record.name: outcome.recorded()},
            build=BuildRecord(
                best=summary.best, tolerance=tolerance, cpu=cpu.to_dict(), calibration=summary.calibration,
                reference_timing=ReferenceTiming(reference_timing.sequences, reference_timing.seconds,
                                                 reference_timing.batch_size, attention),
                eval=eval_set.source if eval_set else None, reference=teacher.describe(),
                reference_metric=reference_metric, output_calibration=calibration, stored_vectors=stored,
                retrieval_tolerance=config.retrieval_tolerance if stored else None))
        write_best(stage, manifest, record.name)
        write_report(stage, BenchResults(summary.model, summary.task, summary.command, summary.environment,
                                         created=manifest.created, optimize=OptimizeSection.of(manifest)))
        seal(stage, manifest)
    return summary


def _check_request(config: OptimizeConfig) -> None:
    """What a static model cannot be asked for, said before anything loads."""
    if config.reference is None:
        raise UsageError(f"kiln optimize {config.model}: a static model is judged against the model it was "
                         "distilled from; pass --reference TEACHER (its kiln-static.json names the teacher)")
    if not task_spec(config.task).embeds:
        raise UsageError(f"kiln optimize {config.model}: a static model embeds text; this run is --task "
                         f"{config.task}")
    if config.variants:
        raise UsageError(f"variants: a static model has one variant, its table (got {', '.join(config.variants)})")
    if config.matryoshka_dims:
        raise UsageError("matryoshka_dims: a static table's size is chosen when it is distilled "
                         "(kiln distill --static --dims)")


def _check_teacher(student: Artifact, teacher: SourceModel) -> None:
    """The student's tokenizer must be the teacher's (kiln distill --static keeps it, without special tokens)."""
    from tokenizers import Tokenizer

    mine = Tokenizer.from_file(str(student.path / student.manifest.tokenizer.path)).get_vocab()
    if mine != teacher.tokenizer.backend_tokenizer.get_vocab():
        raise UsageError(f"reference {teacher.name}: its vocabulary differs from the static model's, so it is "
                         "not the teacher it was distilled from")


def _predictor(student: Artifact, table: Path, batch_size: int, sessions: int) -> Predictor:
    """The table as validation runs it: one session, or ``sessions`` side by side (the sessions batching)."""
    engines = [create_engine(STATIC_ENGINE, table, EngineOptions()) for _ in range(sessions)]
    return Predictor(task_handler(student.task_config), student.encoder(), engines[0], batch_size=batch_size,
                     sessions=engines[1:])
