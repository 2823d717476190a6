"""kiln optimize --distill-layers / --prune / --static-dims: students of the model, each optimized and judged
against it.

After the model's own artifact is written, every requested student is made (kiln distill / kiln prune, on
``--student-texts`` or the sentences of Python's own docstrings; kiln distill --static from the model alone), then
optimized with the same variants and tolerance (a static table has one variant, judged in its own space:
kiln.optimizing.static_student), judged and timed against the model itself (``--reference``), never against the
student. Every
variant of every one becomes a point of the speed-fidelity frontier (kiln/report/frontier.py):

    OUTPUT/                       the model's artifact, as without students
    OUTPUT/students/<name>/model      the student (a model directory)
    OUTPUT/students/<name>/artifact   its optimized variants (an artifact of its own, sealed on its own)
    OUTPUT/frontier.html, .md, .json  every variant of every model: speed-up vs agreement, the gate line
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import KilnError, UsageError

# kiln.optimizing.run.optimize_model: (OptimizeConfig, progress) -> RunSummary
Optimize = Callable[[Any, Callable[[str], None]], Any]

STUDENTS_DIR = "students"
PRUNE_KEYS = ("ffn", "heads", "scope")
SHARED_FIGURE = "pairwise_spearman"  # the agreement figure every embedding variant has, a static student's included


@dataclass(frozen=True)
class StudentRequest:
    name: str  # as shown: "3 layers", "pruned ffn=0.5,heads=0.25"
    slug: str  # its directory under students/
    layers: int | None = None  # kiln distill --layers
    prune: Any = None  # kiln.compress.prune.PruneSettings
    static_dims: int | None = None  # kiln distill --static --dims


def parse_students(distill_layers: str | None, prune: Sequence[str],
                   static_dims: Sequence[int] = ()) -> tuple[StudentRequest, ...]:
    """``--distill-layers 3,4``, ``--prune ffn=0.5,heads=0.25`` (repeatable) and ``--static-dims 256`` as student
    requests."""
    from kiln.compress.prune import PruneSettings

    requests: list[StudentRequest] = []
    for dims in static_dims:
        if dims < 1:
            raise UsageError(f"static_dims: a static table needs at least 1 dimension (got {dims})")
        requests.append(StudentRequest(f"static {dims}d", f"static-{dims}", static_dims=dims))
    for part in (distill_layers or "").split(","):
        if not part.strip():
            continue
        try:
            layers = int(part)
        except ValueError as err:
            raise UsageError(f"distill_layers takes comma-separated layer counts, e.g. 3,4 (got "
                             f"{distill_layers!r})") from err
        if layers < 1:
            raise UsageError(f"distill_layers: a student needs at least 1 layer (got {layers})")
        name = f"{layers} layer{'s' if layers > 1 else ''}"
        requests.append(StudentRequest(name, name.replace(" ", "-"), layers=layers))
    for text in prune:
        settings: dict[str, Any] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in PRUNE_KEYS:
                raise UsageError(f"prune takes key=value pairs with keys {', '.join(PRUNE_KEYS)}, e.g. "
                                 f"ffn=0.5,heads=0.25 (got {text!r})")
            try:
                settings[key] = value.strip() if key == "scope" else float(value)
            except ValueError as err:
                raise UsageError(f"prune {key} must be a number (got {value!r})") from err
        slug = "pruned-" + "-".join(f"{k}{v}" for k, v in settings.items())
        requests.append(StudentRequest(f"pruned {text.strip()}", slug, prune=PruneSettings(**settings)))
    if len({r.slug for r in requests}) != len(requests):
        raise UsageError("distill_layers / --prune: the same student is asked for twice")
    return tuple(requests)


@dataclass(frozen=True)
class StudentRun:
    request: StudentRequest
    model_dir: Path
    artifact: Path
    summary: Any  # RunSummary of its optimize run (also when no variant passed), None when making it failed
    error: str = ""  # why it has no summary
    parameters: int = 0
    teacher_parameters: int = 0
    agreement_before_optimize: float | None = None  # of the PyTorch student against the model, held out
    minutes: float = 0.0  # making the student (training included)


def build_students(config: Any, requests: Sequence[StudentRequest], *, texts: Path | None, epochs: int,
                   progress: Callable[[str], None], optimize: Optimize) -> list[StudentRun]:
    """Make, optimize and judge each student of ``config.model`` (the OptimizeConfig of the model's own run).
    ``optimize(config, progress)`` runs one model's optimize (kiln.optimizing.run.optimize_model, which calls this
    module: passed in rather than imported, so the two modules do not import each other)."""
    from kiln.compress.distill import DistillConfig, run_distill
    from kiln.compress.prune import RECOVERY_LR, run_prune
    from kiln.source.loading import bundled_model_dir

    teacher = config.reference or config.model or str(bundled_model_dir())
    root = config.output.expanduser().resolve() / STUDENTS_DIR
    runs = []
    with tempfile.TemporaryDirectory(prefix="kiln-students-") as scratch:
        data = texts or _default_texts(Path(scratch))
        for request in requests:
            model_dir, artifact = root / request.slug / "model", root / request.slug / "artifact"
            if request.static_dims is not None:
                runs.append(_static_student(config, request, teacher, model_dir, artifact, progress, optimize))
                continue
            progress(f"student {request.name}: making it from {teacher} on {data}")
            recipe = {"epochs": epochs} if request.layers is not None else {"epochs": epochs, "lr": RECOVERY_LR}
            distill = DistillConfig(config.model, config.task, model_dir, layers=request.layers, texts=data,
                                    recipe=recipe, threads=config.threads, overwrite=True,
                                    allow_pickle=config.allow_pickle)
            report = _training_progress(request, progress)
            try:
                made = run_distill(distill, report) if request.layers is not None else \
                    run_prune(distill, request.prune, report)
            except UsageError:
                raise  # the request itself is wrong (e.g. more layers than the model has)
            except KilnError as err:
                progress(f"student {request.name}: FAILED ({err})")
                runs.append(StudentRun(request, model_dir, artifact, None, f"{type(err).__name__}: {err}"))
                continue
            progress(f"student {request.name}: {made.parameters / 1e6:.1f}M parameters, agreement with "
                     f"{teacher} {made.agreement:.4f} (PyTorch, held out); optimizing it, judged against {teacher}")
            summary, error = _optimize(config, model_dir, artifact, teacher, request, progress, optimize)
            runs.append(StudentRun(request, model_dir, artifact, summary, error, made.parameters,
                                   made.teacher_parameters, made.agreement, made.seconds / 60))
    return runs


def _static_student(config: Any, request: StudentRequest, teacher: str, model_dir: Path, artifact: Path,
                    progress: Callable[[str], None], optimize: Optimize) -> StudentRun:
    """kiln distill --static from the model, then judged against it in its own space
    (kiln.optimizing.static_student)."""
    from kiln.compress.static import StaticConfig, distill_static

    progress(f"student {request.name}: distilling a static table from {teacher} (no training data)")
    made = distill_static(StaticConfig(config.model, model_dir, dims=request.static_dims, overwrite=True,
                                       allow_pickle=config.allow_pickle),
                          lambda line: progress(f"student {request.name}: {line}"))
    # Its one variant is the table, and its size was chosen at distillation: the model's --variants and
    # --matryoshka-dims do not apply to it.
    judged = dataclasses.replace(config, variants=None, matryoshka_dims=())
    summary, error = _optimize(judged, model_dir, artifact, teacher, request, progress, optimize)
    return StudentRun(request, model_dir, artifact, summary, error, made.vocabulary * made.dims,
                      made.teacher_parameters, None, made.seconds / 60)


def _optimize(config: Any, model_dir: Path, artifact: Path, teacher: str, request: StudentRequest,
              progress: Callable[[str], None], optimize: Optimize) -> tuple[Any, str]:
    from kiln.optimizing.job import NothingPassed

    student_config = dataclasses.replace(config, model=str(model_dir), reference=teacher, output=artifact,
                                         overwrite=True, time_rejected=True)
    try:
        return optimize(student_config, lambda line: progress(f"student {request.name}: {line}")), ""
    except NothingPassed as err:  # the frontier still shows how far each variant fell short
        return err.summary, str(err)


def _default_texts(scratch: Path) -> Path:
    """The sentences of the standard library's docstrings (kiln.data.docstrings): real English, no download."""
    from kiln.data.docstrings import docstring_sentences

    path = scratch / "docstring-sentences.txt"
    path.write_text("\n".join(docstring_sentences()) + "\n")
    return path


def _training_progress(request: StudentRequest, progress: Callable[[str], None]
                       ) -> Callable[[str, dict[str, Any]], None]:
    """A line per epoch (and the pruned shape); per-step progress is left to kiln distill / kiln prune."""
    def report(kind: str, data: dict[str, Any]) -> None:
        if kind == "pruned":
            progress(f"student {request.name}: heads per layer {[len(h) for h in data['shape'].heads]}, FFN width "
                     f"per layer {list(data['shape'].ffn)}")
        elif kind == "epoch":
            progress(f"student {request.name}: epoch {data['epoch']}: loss {data['loss']:.4f}, agreement "
                     f"{data['agreement']:.4f} on held-out inputs, {data['seconds']:.0f} s")

    return report


def write_students_frontier(summary: Any, runs: Sequence[StudentRun], output: Path) -> Path:
    """frontier.html/.md/.json in ``output``: the model's variants and every student's; returns the page."""
    from kiln.report.frontier import points, write_frontier

    teacher_parameters = next((r.teacher_parameters for r in runs if r.teacher_parameters), None)
    # A static student has no cosine to the model (its own space): then every point is placed by the figure all
    # share, the pairwise similarity Spearman; each keeps its own gate's verdict.
    figure = SHARED_FIGURE if any(r.request.static_dims for r in runs if r.summary is not None) else None
    all_points = points("model", summary, teacher_parameters, figure)
    notes = []
    for run in runs:
        if run.summary is None:
            notes.append(f"{run.request.name}: not made ({run.error})")
            continue
        all_points += points(run.request.name, run.summary, run.parameters, figure)
        before = f"its PyTorch model agrees {run.agreement_before_optimize:.4f} with the model on held-out " \
            "training inputs" if run.agreement_before_optimize is not None else \
            "a static table in its own space: its agreement is the pairwise similarity Spearman, not a cosine"
        notes.append(f"{run.request.name}: {run.parameters / 1e6:.3g}M parameters "
                     f"({run.parameters / run.teacher_parameters:.0%} of the model), made in {run.minutes:.1f} min; "
                     f"{before}; model {run.model_dir}, "
                     + (f"artifact {run.artifact}" if run.summary.best else
                        "no artifact: no variant passed the gate"))
    if figure:
        notes.insert(0, f"Every point is placed by {figure} (what a static student in its own space shares with "
                     "the others); accepted or rejected by its own gate (min and mean cosine for the model and "
                     "transformer students).")
    primary = figure or next((o.agreement.primary for o in summary.outcomes if o.agreement), "agreement")
    output = output.expanduser().resolve()
    write_frontier(output, all_points, model=summary.model, tolerance=summary.tolerance, primary=primary,
                   command=summary.command, notes=notes)
    return output / "frontier.html"
