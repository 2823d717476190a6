"""Building artifacts from Python: ``kiln.optimize``, ``kiln.export``, ``kiln.distill``, ``kiln.prune``.

The CLI's commands of the same names are made of these functions: every option a command has is a parameter here,
with the same name and default (``--force`` is ``overwrite``; a comma-separated list is a sequence), and errors name
the parameter (``batch_size must be at least 1``) where the CLI names the flag. Each returns a typed record.

Each function imports its job when called, so that `import kiln` stays free of torch, transformers and the server's
packages (a serving install has no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.choices import CalibrationMethod, ExportFormat, ExternalData, PruneScope, Target
from kiln.tasks import DEFAULT_TASK, task_spec

if TYPE_CHECKING:
    from kiln.artifact.directory import Artifact
    from kiln.compress.distill import DistillResult
    from kiln.compress.static import StaticResult
    from kiln.exporting.job import ExportResult
    from kiln.optimizing.outcome import RunSummary
    from kiln.optimizing.students import StudentRun

Progress = Callable[[str], None]
# Training progress: (kind, figures), e.g. ("step", {"loss": ...}); the CLI draws a bar from it.
TrainingProgress = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class OptimizeResult:
    """What ``kiln.optimize`` built: the artifact (every variant, results.json, summary.md, report.html, best/), the
    verdict per variant, and the students with their frontier page when students were asked for."""

    artifact: Artifact
    summary: RunSummary
    students: tuple[StudentRun, ...] = ()
    frontier: Path | None = None


def optimize(model: str | Path | None = None, *, task: str = DEFAULT_TASK, output: str | Path = "kiln-out",
             calibration: str | Path | None = None, tolerance: float | None = None,
             eval_file: str | Path | None = None, calibration_method: str = CalibrationMethod.MINMAX,
             target: str = Target.CPU, variants: Sequence[str] | None = None, threads: int | None = None,
             batch_size: int = 32, sensitivity: bool = True, reference: str | Path | None = None,
             distill_layers: Sequence[int] | str = (), prune: Sequence[str] = (), static_dims: Sequence[int] = (),
             student_texts: str | Path | None = None, student_epochs: int = 3, matryoshka_dims: Sequence[int] = (),
             precisions: Sequence[str] = (), retrieval_tolerance: float = 0.03, for_classes: Sequence[str] = (),
             allow_pickle: bool = False, adapter: str | None = None, overwrite: bool = False,
             progress: Progress = lambda _: None) -> OptimizeResult:
    """``kiln optimize``: build every variant of ``model`` (a model directory, a hub id where a network exists, or
    None for the bundled all-MiniLM-L6-v2), validate each against the original, and keep the fastest within
    ``tolerance`` in ``output/best``. ``calibration``: texts like your traffic, for static int8 ranges and timing;
    ``eval_file``: labelled data for the task metric; ``distill_layers`` (e.g. ``[3, 4]`` or ``"3,4"``) /
    ``prune`` (e.g. ``["ffn=0.5,heads=0.25"]``) / ``static_dims`` also make students and a frontier page;
    ``for_classes``: the CPU classes the artifact will run on (e.g. ``["avx2", "amx"]``). A static ``model`` (kiln
    distill --static) is judged against ``reference``. ``adapter``: which task LoRA adapter of a model that carries
    several (jina-embeddings-v3) to merge; None: none. Raises ``kiln.optimizing.job.NothingPassed`` when no variant
    is within tolerance."""
    _refuse_early(model, output, overwrite)
    from kiln.artifact.directory import Artifact
    from kiln.optimizing.job import OptimizeConfig
    from kiln.optimizing.run import StudentPlan, run_optimize
    from kiln.optimizing.students import parse_students

    config = OptimizeConfig(
        model=str(model) if model is not None else None, task=task_spec(task).name, output=Path(output),
        tolerance=tolerance, eval_file=Path(eval_file) if eval_file else None,
        calibration_file=Path(calibration) if calibration else None, calibration_method=calibration_method,
        target=target, variants=tuple(variants) if variants else None, threads=threads, batch_size=batch_size,
        allow_pickle=allow_pickle, adapter=adapter, overwrite=overwrite, sensitivity=sensitivity,
        reference=str(reference) if reference is not None else None, matryoshka_dims=tuple(matryoshka_dims),
        precisions=tuple(precisions), retrieval_tolerance=retrieval_tolerance, for_classes=tuple(for_classes))
    layers = distill_layers if isinstance(distill_layers, str) else ",".join(str(n) for n in distill_layers) or None
    # Parsed before the long run, so a typo in a student's recipe fails at once.
    plan = StudentPlan(parse_students(layers, tuple(prune), tuple(static_dims)),
                       Path(student_texts) if student_texts else None, student_epochs)
    run = run_optimize(config, plan, progress)
    return OptimizeResult(Artifact.open(Path(output).expanduser()), run.summary, run.students, run.frontier)


def export(model: str | Path | None = None, *, task: str = DEFAULT_TASK,
           format: ExportFormat | str = ExportFormat.ONNX, output: str | Path = "kiln-out", opset: int = 17,
           int32_inputs: bool = False, external_data: ExternalData | str = ExternalData.AUTO, atol: float = 1e-4,
           min_cosine: float = 0.99999, allow_pickle: bool = False, adapter: str | None = None,
           overwrite: bool = False, progress: Progress = lambda _: None) -> ExportResult:
    """``kiln export``: export ``model`` (a model directory, a hub id where a network exists, or None for the bundled
    all-MiniLM-L6-v2) to ONNX or TorchScript, check parity with PyTorch (ParityError beyond ``atol`` /
    ``min_cosine``) and write a verified artifact. The result holds its path, manifest and the parity per length
    bucket; ``.artifact`` opens it. ``adapter``: which task LoRA adapter of a model that carries several
    (jina-embeddings-v3) to merge; None: none."""
    _refuse_early(model, output, overwrite)
    from kiln.choices import parse_choice
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.records.parity import ParityTolerance

    config = ExportConfig(model=str(model) if model is not None else None, task=task_spec(task).name,
                          format=parse_choice(ExportFormat, format, "format"), output=Path(output), opset=opset,
                          int32_inputs=int32_inputs,
                          external_data=parse_choice(ExternalData, external_data, "external_data"),
                          allow_pickle=allow_pickle, adapter=adapter, overwrite=overwrite,
                          tolerance=ParityTolerance(max_abs_diff=atol, min_cosine=min_cosine))
    return run_export(config, progress)


def _refuse_early(model: str | Path | None, output: str | Path, overwrite: bool) -> None:
    """A missing model directory or an existing output, refused before the command imports torch and transformers
    (~4 s of CPU a process on the avx2 EPYC): the same errors the run raises later, only sooner."""
    from kiln.artifact.staging import check_target
    from kiln.source.loading import check_model_arg

    check_model_arg(str(model) if model is not None else None)
    check_target(Path(output), overwrite=overwrite)


def _recipe(epochs: int, batch_size: int, lr: float, max_length: int, seed: int, patience: int, alpha: float,
            temperature: float, hidden_weight: float) -> dict[str, Any]:
    """The training recipe (kiln.compress.recipe.Recipe's fields) distill and prune share."""
    from kiln.compress.recipe import LossWeights

    return {"epochs": epochs, "batch_size": batch_size, "lr": lr, "max_length": max_length, "seed": seed,
            "patience": patience, "weights": LossWeights(alpha, temperature, hidden_weight)}


def distill(teacher: str | Path | None = None, *, task: str = DEFAULT_TASK, output: str | Path = "kiln-student",
            layers: int | None = None, keep_layers: Sequence[int] | str | None = None, texts: str | Path | None = None,
            train: str | Path | None = None, epochs: int = 3, batch_size: int = 32, lr: float = 5e-4,
            max_length: int = 128, alpha: float = 0.5, temperature: float = 2.0, hidden_weight: float = 1.0,
            held_out: float = 0.05, continuations: int = 0, continuations_past_eos: bool = False, patience: int = 2,
            seed: int = 0, threads: int | None = None, resume: bool = False, static: bool = False, dims: int = 256,
            sif: float = 1e-4, allow_pickle: bool = False, overwrite: bool = False,
            progress: TrainingProgress = lambda kind, data: None) -> DistillResult | StaticResult:
    """``kiln distill``: train a student keeping ``layers`` evenly spaced layers of ``teacher`` (or exactly
    ``keep_layers``) to reproduce it on ``texts`` (default: Python's own docstrings), with ``train``'s labels
    beside the teacher's outputs when given. ``continuations`` (decoders) adds the teacher's greedy continuations of
    that many training texts, for a draft model (``continuations_past_eos`` decodes them through EOS). Writes a
    model directory (safetensors, tokenizer, sentence-transformers files, kiln-distill.json) and returns what it
    measured; then ``kiln.optimize(student, reference=teacher)``. With ``static``, a static-embedding model of
    ``dims`` principal components instead (no training data; returns a StaticResult)."""
    from kiln.errors import UsageError

    task = task_spec(task).name  # a TaskName or its string; a UsageError lists the tasks
    if static:
        from kiln.compress.static import StaticConfig, distill_static

        if task != DEFAULT_TASK:
            raise UsageError(f"static distils a sentence-embedding model (task {DEFAULT_TASK}); got task {task}")
        return distill_static(StaticConfig(str(teacher) if teacher is not None else None, Path(output), dims=dims,
                                           sif=sif, overwrite=overwrite, allow_pickle=allow_pickle),
                              lambda line: progress("message", {"text": line}))
    from kiln.compress.distill import DistillConfig, run_distill

    config = DistillConfig(str(teacher) if teacher is not None else None, task, Path(output), layers=layers,
                           keep_layers=keep_layers if isinstance(keep_layers, str) or not keep_layers
                           else ",".join(map(str, keep_layers)),
                           texts=Path(texts) if texts else None, train=Path(train) if train else None,
                           recipe=_recipe(epochs, batch_size, lr, max_length, seed, patience, alpha, temperature,
                                          hidden_weight),
                           held_out=held_out, continuations=continuations,
                           continuations_past_eos=continuations_past_eos, threads=threads, resume=resume,
                           overwrite=overwrite, allow_pickle=allow_pickle)
    return run_distill(config, progress)


def prune(model: str | Path | None = None, *, task: str = DEFAULT_TASK, output: str | Path = "kiln-pruned",
          heads: float = 0.0, ffn: float = 0.0, scope: PruneScope | str = PruneScope.GLOBAL,
          importance_samples: int = 512, texts: str | Path | None = None, train: str | Path | None = None,
          recover_epochs: int = 1, batch_size: int = 32, lr: float = 1e-4, max_length: int = 128, alpha: float = 0.5,
          temperature: float = 2.0, hidden_weight: float = 1.0, held_out: float = 0.05, patience: int = 2,
          seed: int = 0, threads: int | None = None, resume: bool = False, allow_pickle: bool = False,
          overwrite: bool = False, progress: TrainingProgress = lambda kind, data: None) -> DistillResult:
    """``kiln prune``: remove the ``heads`` and ``ffn`` shares of least importance (measured on
    ``importance_samples`` features; across layers, or the same share per layer with ``scope="layer"``), recover for
    ``recover_epochs`` with distillation from the unpruned model, write a model directory (kiln-prune.json holds its
    lineage) and return what it measured."""
    from kiln.compress.distill import DistillConfig
    from kiln.compress.prune import PruneSettings, run_prune

    config = DistillConfig(str(model) if model is not None else None, task_spec(task).name,
                           Path(output), texts=Path(texts) if texts else None, train=Path(train) if train else None,
                           recipe=_recipe(recover_epochs, batch_size, lr, max_length, seed, patience, alpha,
                                          temperature, hidden_weight),
                           held_out=held_out, threads=threads, resume=resume, overwrite=overwrite,
                           allow_pickle=allow_pickle)
    return run_prune(config, PruneSettings(heads=heads, ffn=ffn, scope=scope, samples=importance_samples), progress)
