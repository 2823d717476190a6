"""The whole of `kiln optimize` as one call: the model's own run, then any students (kiln distill / kiln prune
made from it, each optimized and judged against it) and the frontier page comparing all of them. The CLI and
:func:`optimize` (``kiln.optimize``) both call :func:`run_optimize`, so the command and the Python API cannot
drift apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.choices import CalibrationMethod, Target
from kiln.errors import UsageError
from kiln.optimize.job import OptimizeConfig, OptimizeJob
from kiln.optimize.outcome import RunSummary
from kiln.optimize.static_student import judge_static, static_artifact
from kiln.optimize.students import StudentRequest, StudentRun, build_students, parse_students, write_students_frontier
from kiln.tasks import DEFAULT_TASK

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StudentPlan:
    """Students to make beside the model's own run, and what they learn from."""

    requests: tuple[StudentRequest, ...] = ()
    texts: Path | None = None  # default: the sentences of Python's own docstrings
    epochs: int = 3


@dataclass(frozen=True)
class OptimizeRun:
    summary: RunSummary  # the model's own variants
    students: tuple[StudentRun, ...] = ()
    frontier: Path | None = None  # frontier.html when students were made


def run_optimize(config: OptimizeConfig, students: StudentPlan = StudentPlan(),
                 progress: Progress = lambda _: None) -> OptimizeRun:
    """Build, validate and pick the model's variants (or judge a static model, which has one), then make and
    judge each student."""
    if students.requests and static_artifact(config.model):
        raise UsageError(f"kiln optimize {config.model}: a static model has no students; make them from its teacher")
    summary = optimize_model(config, progress)
    if not students.requests:
        return OptimizeRun(summary)
    runs = build_students(config, students.requests, texts=students.texts, epochs=students.epochs,
                          progress=progress, optimize=optimize_model)
    return OptimizeRun(summary, tuple(runs), write_students_frontier(summary, runs, config.output))


def optimize_model(config: OptimizeConfig, progress: Progress = lambda _: None) -> RunSummary:
    """One model's run: its variants built and judged (OptimizeJob), or a static model's one table judged in its
    own space (kiln.optimize.static_student)."""
    static = static_artifact(config.model)
    return judge_static(config, static, progress) if static else OptimizeJob(config, progress).run()


def optimize(model: str | Path | None = None, *, task: str = DEFAULT_TASK, output: str | Path = "kiln-out",
             tolerance: float | None = None, eval_file: str | Path | None = None,
             calibration: str | Path | None = None, calibration_method: str = CalibrationMethod.MINMAX,
             target: str = Target.CPU, variants: Sequence[str] | None = None, threads: int | None = None,
             batch_size: int = 32, sensitivity: bool = True, reference: str | Path | None = None,
             matryoshka_dims: Sequence[int] = (), distill_layers: Sequence[int] = (), prune: Sequence[str] = (),
             static_dims: Sequence[int] = (), student_texts: str | Path | None = None, student_epochs: int = 3,
             allow_pickle: bool = False,
             precisions: Sequence[str] = (), retrieval_tolerance: float = 0.03,
             overwrite: bool = False, progress: Progress = lambda _: None) -> Any:
    """``kiln optimize`` from Python: build every variant of ``model`` (a model directory, a hub id where a network
    exists, or None for the bundled all-MiniLM-L6-v2), validate each against the original, keep the fastest within
    ``tolerance`` in ``output/best``, and return the artifact (:class:`kiln.Artifact`; results.json, summary.md and
    report.html are beside it). ``distill_layers`` / ``prune`` (e.g. ``["ffn=0.5,heads=0.25"]``) / ``static_dims``
    also make students and a frontier page; a static ``model`` (kiln distill --static) is judged against
    ``reference``. Raises :class:`kiln.KilnError` subclasses with the same messages as the CLI
    (``NothingPassed`` when no variant is within tolerance)."""
    from kiln.artifact.directory import Artifact

    config = OptimizeConfig(
        model=str(model) if model is not None else None, task=str(task), output=Path(output),
        tolerance=tolerance, eval_file=Path(eval_file) if eval_file else None,
        calibration_file=Path(calibration) if calibration else None, calibration_method=calibration_method,
        target=target, variants=tuple(variants) if variants else None, threads=threads, batch_size=batch_size,
        allow_pickle=allow_pickle, overwrite=overwrite, sensitivity=sensitivity,
        reference=str(reference) if reference is not None else None, matryoshka_dims=tuple(matryoshka_dims),
        precisions=tuple(precisions), retrieval_tolerance=retrieval_tolerance)
    layers = ",".join(str(n) for n in distill_layers) or None
    plan = StudentPlan(parse_students(layers, tuple(prune), tuple(static_dims)),
                       Path(student_texts) if student_texts else None, student_epochs)
    run_optimize(config, plan, progress)
    return Artifact.open(Path(output).expanduser())
