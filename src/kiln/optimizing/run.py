"""The whole of `kiln optimize` as one call: the model's own run, then any students (kiln distill / kiln prune
made from it, each optimized and judged against it) and the frontier page comparing all of them. The CLI and
:func:`optimize` (``kiln.optimizing``) both call :func:`run_optimize`, so the command and the Python API cannot
drift apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import UsageError
from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.optimizing.outcome import RunSummary
from kiln.optimizing.static_student import judge_static, static_artifact
from kiln.optimizing.students import StudentRequest, StudentRun, build_students, write_students_frontier

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
    own space (kiln.optimizing.static_student)."""
    static = static_artifact(config.model)
    return judge_static(config, static, progress) if static else OptimizeJob(config, progress).run()
