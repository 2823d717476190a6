"""The `kiln` command: one list of commands, help generated from their typed signatures."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kiln.choices import (
    CalibrationMethod,
    Device,
    ExportFormat,
    ExternalData,
    Target,
    VariantName,
    names,
)
from kiln.cli import console
from kiln.cli.audit import audit
from kiln.cli.bench import bench
from kiln.cli.compress import distill, prune
from kiln.cli.embed import embed
from kiln.cli.flags import flags_of, for_command_line, running_command
from kiln.cli.options import (
    DEFAULT_TASK_OPT,
    AdapterOpt,
    ForceOpt,
    ModelArg,
    PickleOpt,
    TaskOpt,
    int_list,
    name_list,
)
from kiln.cli.serve import serve
from kiln.errors import KilnError
from kiln.system.cpu import CPU_CLASS_NAMES
from kiln.tasks import FUSED_DECODER_TASKS, TASKS

app = typer.Typer(
    name="kiln",
    help="Turn a Hugging Face encoder model into a fast, small, verified inference artifact.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Help text generated from the task specs, so a new task documents itself.
_JUDGED = {name: spec.validation for name, spec in TASKS.items()}
_TOLERANCES = "; ".join(f"{name} {judge.tolerance_help} (default t={judge.default_tolerance:g})"
                        for name, judge in _JUDGED.items())
_EVAL_FORMATS = "; ".join(f"{name}: {', '.join(judge.eval_formats)} with {', '.join(judge.eval_fields)} "
                          f"(metric: {judge.metric})" for name, judge in _JUDGED.items())
_BUILTIN_EVAL = ", ".join(f"{name} is scored on kiln's built-in data" for name, spec in TASKS.items()
                          if spec.validation.has_builtin_eval) or "no task metric"


@app.command()
def export(
    model: ModelArg = None,
    task: TaskOpt = DEFAULT_TASK_OPT,
    format: Annotated[
        ExportFormat, typer.Option("--format", "-f", help="onnx: runs in ONNX Runtime (fastest on CPU, no torch "
                                   "needed to serve). torchscript: traced and frozen, runs in libtorch. onnx-fused: a "
                                   "decoder's step graph written by kiln (fused attention, its KV cache updated in "
                                   f"place; {', '.join(FUSED_DECODER_TASKS)} with GPT-2 or GPT-Neo).")
    ] = ExportFormat.ONNX,
    output: Annotated[Path, typer.Option("--output", "-o", help="Artifact directory to write.")] = Path("kiln-out"),
    opset: Annotated[int, typer.Option(help="ONNX opset. 17 or later keeps LayerNormalization as one op.",
                                       min=14, max=21)] = 17,
    int32_inputs: Annotated[bool, typer.Option("--int32-inputs", help="ONNX inputs as int32 (half the bytes per "
                                               "token; some runtimes such as TensorRT prefer them).")] = False,
    external_data: Annotated[
        ExternalData, typer.Option(help="Store ONNX weights in a side file: auto does so above protobuf's 2 GB "
                                   "limit, always forces it (larger load time, no size limit).")
    ] = ExternalData.AUTO,
    atol: Annotated[float, typer.Option(help="Largest absolute difference to PyTorch allowed on the task output "
                                        "(pooled embedding, logits).")] = 1e-4,
    min_cosine: Annotated[float, typer.Option(help="Smallest cosine similarity to PyTorch allowed per input.")]
    = 0.99999,
    allow_pickle: PickleOpt = False,
    adapter: AdapterOpt = None,
    force: ForceOpt = False,
) -> None:
    """Export a model, check parity with PyTorch on real sentences, and write a verified artifact.

    Parity is measured at batch size 1 and in padded batches of 8 on sentences of 1 to ~600 words;
    the command exits with status 3 and the measured difference when it is over tolerance.
    """
    from kiln.api.build import export as export_model

    result = export_model(model, task=task.value, format=format, output=output, opset=opset,
                          int32_inputs=int32_inputs, external_data=external_data, atol=atol, min_cosine=min_cosine,
                          allow_pickle=allow_pickle, adapter=adapter, overwrite=force, progress=console.progress)
    variant = next(iter(result.manifest.variants))
    console.out.print(f"exported {variant} to {result.path}")
    console.out.print(f"parity vs PyTorch: {result.parity.summary()}")
    for bucket in result.parity.buckets:
        console.out.print(f"  tokens {bucket.tokens:>8}: n={bucket.count:<3} max |diff| {bucket.max_abs_diff:.2e}"
                          f"  cosine min {bucket.min_cosine:.7f}")


@app.command()
def optimize(
    model: ModelArg = None,
    task: TaskOpt = DEFAULT_TASK_OPT,
    output: Annotated[Path, typer.Option("--output", "-o", help="Artifact directory: every variant, manifest.json, "
                                         "results.json, summary.md and best/ (the chosen variant alone).")]
    = Path("kiln-out"),
    calibration: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Texts like your traffic (.txt one per line, or .jsonl/.csv as for --eval): static int8 ranges are "
        "calibrated on them and variants timed on them. Default: 128 texts from the documentation that ships "
        "with Python (agreement is measured on a disjoint half). The most effective flag for int8 fidelity on "
        "your data.", show_default=False)] = None,
    tolerance: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help=f"Largest drop allowed below the original. Agreement: {_TOLERANCES}. With --eval the task metric may "
        "also drop by at most t. Tighter keeps more fp32 layers (slower); looser admits faster, less faithful "
        "variants.", show_default=False)] = None,
    eval_file: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--eval", help=f"Labelled data for the task metric: {_EVAL_FORMATS}. Without it: {_BUILTIN_EVAL}.",
        show_default=False)] = None,
    calibration_method: Annotated[CalibrationMethod, typer.Option(
        help="Static int8 activation ranges for onnx-int8-static: minmax (fast, outlier-sensitive), "
        "entropy or percentile (clip outliers; slower to calibrate).")] = CalibrationMethod.MINMAX,
    target: Annotated[Target, typer.Option(help="Where the artifact will run: cpu builds int8/OpenVINO/bf16 "
                                           "variants; cuda builds fp16 ones.")] = Target.CPU,
    variants: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help=f"Comma-separated variants to build instead of the target's defaults: {names(VariantName)}.",
        show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Intra-op threads for validation and timing (default: the cores this process may use).",
        show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size for validation and timing.", min=1)] = 32,
    sensitivity: Annotated[bool, typer.Option(help="When an int8 variant fails the gate, keep its most "
                                              "sensitive layers in fp32 until it passes (a few rebuilds).")] = True,
    reference: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="The original to judge and time every variant against, when MODEL was made from it (a student of "
        "kiln distill: pass its teacher), so the student's own loss counts against the tolerance.",
        show_default=False)] = None,
    distill_layers: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Also make students with this many layers (comma-separated, e.g. 3,4; kiln distill), optimize each "
        "judged against MODEL, and plot every variant of every model in frontier.html.", show_default=False)] = None,
    prune: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        help="Also make a pruned student (kiln prune), e.g. ffn=0.5,heads=0.25[,scope=layer]; repeatable.",
        show_default=False)] = None,
    static_dims: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Also distil static-embedding students of these sizes (comma-separated, e.g. 256; kiln distill "
        "--static), each judged against MODEL by its similarity structure and placed on frontier.html.",
        show_default=False)] = None,
    student_texts: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Unlabelled texts the students learn from (default: the ~12,700 sentences of Python's own "
        "docstrings).", show_default=False)] = None,
    student_epochs: Annotated[int, typer.Option(help="Training epochs per student (recovery epochs for pruned "
                                                "ones).", min=1)] = 3,
    matryoshka_dims: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Embedding sizes the model was trained to be cut to (Matryoshka), e.g. 256,128: validation reports "
        "and gates agreement at each, and the artifact records them.", show_default=False)] = None,
    precisions: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Output precisions to measure for stored vectors, e.g. int8,binary (of float32, int8, uint8, binary, "
        "ubinary): recall@10 of the full-size float32 neighbours at each with every --matryoshka-dims size, "
        "NDCG@10 when --eval has query, text, relevance rows, memory and search speed, gated by "
        "--retrieval-tolerance; kiln serve refuses the rejected ones.",
        show_default=False)] = None,
    retrieval_tolerance: Annotated[float, typer.Option(
        help="Largest recall@10 loss (and NDCG@10 loss against float32's, when measured) a stored size and "
        "precision may have.", min=0.0, max=1.0)] = 0.03,
    for_classes: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--for", help="CPU classes the artifact will run on, e.g. avx2,avx512-vnni,amx (of "
        f"{', '.join(CPU_CLASS_NAMES)}). This CPU's class is validated here. A class with fewer instructions has "
        "its OpenVINO variants judged here too, with oneDNN capped to its instructions (ONEDNN_MAX_CPU_ISA; "
        "kiln info shows the verdicts and the kernels run). ONNX Runtime cannot be capped, nor can a CPU run "
        "instructions it lacks: every variant is re-validated on the stored agreement inputs the first time the "
        "artifact loads on a CPU of another class.",
        show_default=False)] = None,
    allow_pickle: PickleOpt = False,
    adapter: AdapterOpt = None,
    force: ForceOpt = False,
) -> None:
    """Build every variant, validate each against the original, keep the fastest that stays within tolerance.

    Give --calibration texts like your traffic: int8 variants are calibrated on them.

    MODEL may be a static model (kiln distill --static): its one variant, the table, is judged against
    --reference TEACHER by its similarity structure and timed against the teacher.

    Exits 4 when no variant passes the gate; rejected variants carry their measured reason.
    """
    from kiln.api.build import optimize as optimize_model
    from kiln.optimizing.students import STUDENTS_DIR

    run = optimize_model(
        model, task=task.value, output=output, calibration=calibration, tolerance=tolerance, eval_file=eval_file,
        calibration_method=calibration_method, target=target, variants=name_list(variants) or None, threads=threads,
        batch_size=batch_size, sensitivity=sensitivity, reference=reference, distill_layers=distill_layers or (),
        prune=prune or (), static_dims=int_list(static_dims, "--static-dims") or (), student_texts=student_texts,
        student_epochs=student_epochs, matryoshka_dims=int_list(matryoshka_dims, "--matryoshka-dims") or (),
        precisions=name_list(precisions), retrieval_tolerance=retrieval_tolerance,
        for_classes=name_list(for_classes), allow_pickle=allow_pickle, adapter=adapter, overwrite=force,
        progress=console.progress)
    console.print_table(run.summary)
    console.out.print(f"best variant: {run.summary.best} -> {output.expanduser().resolve() / 'best'}")
    console.out.print(f"summary: {output.expanduser().resolve() / 'summary.md'}")
    for student in run.students:
        if student.summary is not None:
            console.print_table(student.summary)
    if run.frontier is not None:
        console.out.print(f"students: {output.expanduser().resolve() / STUDENTS_DIR}; frontier: {run.frontier}")


app.command()(distill)
app.command()(prune)
app.command()(embed)
app.command()(bench)
app.command()(serve)
app.command()(audit)


@app.command()
def triton(
    artifact: Annotated[Path, typer.Argument(help="Artifact directory (e.g. kiln-out/best).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Model repository directory to write.")]
    = Path("kiln-triton"),
    device: Annotated[Device, typer.Option(help="cuda: ONNX Runtime backend on KIND_GPU; tensorrt: the same with "
                                           "TensorRT's fp16 execution accelerator; cpu: KIND_CPU with the "
                                           "thread count from kiln bench's serving.json.")] = Device.CPU,
    python_model: Annotated[bool, typer.Option("--python-model", help="Run the model step in the Python backend "
                                               "with kiln's engine (always so for OpenVINO variants); needs only "
                                               "the Python backend, e.g. PyPI's nvidia-pytriton binary.")] = False,
    buckets: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Comma-separated padded lengths the tokenizer step pads to. Triton batches only same-shape requests: "
        "fewer buckets batch more, more buckets pad less. Default: quartiles and p90 of kiln's timing mix, and the "
        "model's maximum.", show_default=False)] = None,
    max_batch_size: Annotated[int, typer.Option(help="Largest batch Triton forms (> 0: 0 disables batching).",
                                                min=1)] = 32,
    max_queue_delay_us: Annotated[int, typer.Option(help="How long the model step waits to fill a batch.",
                                                    min=0)] = 2000,
    instances: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Model-step instances (default: sessions from serving.json, else 1).", show_default=False, min=1)] = None,
    force: ForceOpt = False,
) -> None:
    """Write a Triton model repository (ensemble: tokenizer -> model -> post-processing) and check its wiring."""
    from kiln.api.deploy import triton as write_repository

    path = write_repository(artifact, output=output, device=device, python_model=python_model,
                            buckets=int_list(buckets, "--buckets"), max_batch_size=max_batch_size,
                            max_queue_delay_us=max_queue_delay_us, instances=instances, overwrite=force)
    console.out.print(f"Triton repository: {path} (checked: every config parses and the ensemble is wired)")
    console.out.print(f"start it: tritonserver --model-repository={path}  (see {path / 'README.md'})")


@app.command()
def info(
    artifact: Annotated[Path, typer.Argument(help="Artifact directory written by kiln.", show_default=False)],
) -> None:
    """Print an artifact's manifest summary and verify the sha256 of every file (exit 1 on a mismatch)."""
    from kiln.api.inspection import info as artifact_info
    from kiln.artifact.emulation import describe

    found = artifact_info(artifact)
    m = found.manifest
    console.out.print(f"artifact   {found.path.resolve()}")
    console.out.print(f"created    {m.created} by kiln {m.versions.get('kiln', '?')}")
    console.out.print(f"source     {m.source.model} ({m.source.model_type}, {m.source.parameters:,} parameters)")
    console.out.print(f"source sha {m.source.content_sha256}")
    if m.source.adapter:
        console.out.print(f"adapter    {m.source.adapter} (merged into the weights)")
    console.out.print(f"task       {m.task.task} (max {m.task.max_length} tokens)")
    for name, record in m.variants.items():
        mark = " (best)" if m.build.best == name else ""
        console.out.print(f"variant    {name}{mark}: {record.engine} {record.path}; {record.summary()}",
                          highlight=False, markup=False)
    if found.pick is not None:  # kiln.info may have re-validated once on a CPU class not validated on before
        pick = found.pick
        console.out.print(f"runs here  {pick.variant}: {pick.reason}")
        for name, check in pick.checked.items():
            speed = f", {check['ms_per_input']:.2f} ms per input" if check["ms_per_input"] is not None else ""
            console.out.print(f"  on {pick.cpu_class}: {name}: {check['reason']}{speed}")
    for name, run in m.build.emulated_classes.items():
        console.out.print(f"emulated   {name} (oneDNN capped to {run['isa']}): {describe(run)}")
    for name, why in m.build.unchecked_classes.items():
        console.out.print(f"unchecked  {name}: {why}")
    console.out.print(f"checksums  {len(m.files)} files verified")


@app.command()
def doctor(
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Threads you plan to give kiln; checked against the cores this process may use.",
        show_default=False)] = None,
) -> None:
    """Check this machine: CPU vector features (AVX2, AVX-512, VNNI, BF16, AMX) and the int8 scheme they
    imply, usable cores versus the thread count, execution providers that really work, library versions."""
    from kiln.api.inspection import doctor as diagnose

    report = diagnose(threads)
    for section, values in report.sections.items():
        console.out.print(f"[bold]{section}[/bold]")
        for key, value in values.items():
            shown = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            console.out.print(f"  {key:<18} {shown}", markup=False)
    for finding in report.findings:
        console.out.print(f"[yellow]warning[/yellow] {finding.message}")
    if not report.findings:
        console.out.print("no problems found")


def main() -> None:
    """Console-script entry point: user errors print one line and exit non-zero, without a traceback."""
    # A terminated build unwinds like an interrupted one, so its staging directory is removed: a killed 2.7B
    # export left an 11 GB ``.partial`` behind. (kiln serve installs its own drain handler when it starts.)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        app()
    except KilnError as error:
        command = running_command(typer.main.get_command(app), sys.argv[1:])
        message = for_command_line(error.message, flags_of(command)) if command is not None else error.message
        console.err.print(f"error: {message}", markup=False)
        sys.exit(error.exit_code)
    except ModuleNotFoundError as missing:  # a serving install asked to build: name the extra, not a traceback
        from kiln.errors import build_dependency

        error = build_dependency(missing)
        if error is None:
            raise
        console.err.print(f"error: {error.message}", markup=False)
        sys.exit(error.exit_code)
    except OSError as failed:  # a full disk or a file-size limit: one line; any other I/O error keeps its traceback
        from kiln.errors import disk_full

        full = disk_full(failed)
        if full is None:
            raise
        console.err.print(f"error: {full.message}", markup=False)
        sys.exit(full.exit_code)
    except KeyboardInterrupt:
        console.err.print("interrupted")
        sys.exit(130)
    except Terminated:
        console.err.print("terminated")
        sys.exit(143)


class Terminated(BaseException):
    """SIGTERM, raised where the process is so ``finally`` and cleanup handlers run (BaseException: no
    ``except Exception`` on the way swallows it)."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated()
