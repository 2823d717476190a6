"""The export job: PyTorch original -> ONNX or TorchScript artifact, verified by a parity check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kiln.artifact.directory import Artifact
from kiln.artifact.manifest import Manifest, seal
from kiln.choices import ExportFormat, ExternalData
from kiln.engines import EngineOptions, create_engine
from kiln.errors import ParityError, UsageError
from kiln.exporting.onnx import DEFAULT_OPSET, export_onnx
from kiln.exporting.torchscript import export_torchscript
from kiln.records.artifact import BuildRecord, TokenizerRecord, VariantRecord
from kiln.records.parity import ParityReport, ParityTolerance
from kiln.runtime.predictor import Predictor
from kiln.source.loading import SourceModel, load_source, pad_token_id
from kiln.source.reference import example_inputs, reference_predictor, task_module
from kiln.system.memory import release_freed
from kiln.tasks import FUSED_DECODER_TASKS, task_handler, task_spec
from kiln.validation.parity import compare_parity, expected_outputs

TOKENIZER_DIR = "tokenizer"
# Variant name, engine and file name for each export format.
FORMATS: dict[ExportFormat, tuple[str, str, str]] = {
    ExportFormat.ONNX: ("onnx-fp32", "onnxruntime", "model.onnx"),
    ExportFormat.TORCHSCRIPT: ("torchscript", "torchscript", "model.pt"),
    ExportFormat.ONNX_FUSED: ("onnx-fused", "onnxruntime", "model.onnx"),
}
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportConfig:
    model: str | None
    task: str
    format: ExportFormat
    output: Path
    opset: int = DEFAULT_OPSET
    int32_inputs: bool = False
    external_data: ExternalData = ExternalData.AUTO
    allow_pickle: bool = False
    adapter: str | None = None  # the task LoRA adapter to merge (kiln.source.adapters); None: none
    tolerance: ParityTolerance = ParityTolerance()
    overwrite: bool = False


@dataclass
class ExportResult:
    """The verified artifact an export wrote: where, its manifest, and its parity with PyTorch per length bucket."""

    path: Path
    manifest: Manifest
    parity: ParityReport

    @property
    def artifact(self) -> Artifact:
        """The artifact, opened (its checksums verified)."""
        return Artifact.open(self.path)


def write_tokenizer(source: SourceModel, directory: Path) -> TokenizerRecord:
    """Save the tokenizer files; return the manifest's ``tokenizer`` section."""
    source.tokenizer.save_pretrained(directory / TOKENIZER_DIR)
    return TokenizerRecord(f"{TOKENIZER_DIR}/tokenizer.json", pad_token_id(source), tuple(source.input_names))


def export_variant(source: SourceModel, config: ExportConfig, directory: Path) -> VariantRecord:
    """Write one format into ``directory/<variant>/``; return its manifest record (without parity)."""
    name, engine, filename = FORMATS[config.format]
    (directory / name).mkdir()
    path = directory / name / filename
    files, recipe = _EXPORTERS[config.format](source, config, path)
    return VariantRecord(name, engine, f"{name}/{filename}", tuple(f.relative_to(directory).as_posix() for f in files),
                         tuple(recipe))


def _onnx(source: SourceModel, config: ExportConfig, path: Path) -> tuple[list[Path], list[dict]]:
    """The traced export: the task's own graph (a decoder's KV-cache step) or the task module."""
    spec = task_spec(source.task_config.task)
    example = example_inputs(source, int32=config.int32_inputs)
    graph = spec.export.graph(source, example)
    if graph is not None and config.int32_inputs:
        raise UsageError(f"{spec.name} exports to ONNX with int64 inputs only (its KV-cache step graph)")
    module = graph.module if graph else task_module(source, cast_inputs=config.int32_inputs)
    fold = graph.fold_constants if graph else True
    files = export_onnx(module, graph.example if graph else example, path,
                        sequence_outputs=spec.export.sequence_outputs, opset=config.opset,
                        external_data=config.external_data, axes=graph.axes if graph else None, fold_constants=fold)
    return files, [{"pass": "export-onnx", "opset": config.opset, "int32_inputs": config.int32_inputs,
                    "external_data": len(files) > 1, "exporter": "torch.onnx (dynamo=False)",
                    "constant_folding": fold}]


def _torchscript(source: SourceModel, config: ExportConfig, path: Path) -> tuple[list[Path], list[dict]]:
    spec = task_spec(source.task_config.task)
    example = example_inputs(source, int32=config.int32_inputs)
    if spec.export.graph(source, example) is not None:
        raise UsageError(f"{spec.name} exports to ONNX only (its KV-cache step graph): --format onnx or "
                         f"{ExportFormat.ONNX_FUSED.value}")
    return (export_torchscript(task_module(source, cast_inputs=config.int32_inputs), example, path),
            [{"pass": "export-torchscript", "method": "trace+freeze"}])


def _fused(source: SourceModel, config: ExportConfig, path: Path) -> tuple[list[Path], list[dict]]:
    """kiln's own step graph for a decoder: fused attention, the cache updated in place
    (kiln.exporting.fused_decoder)."""
    from kiln.exporting.fused_decoder import build_fused_decoder, fused_recipe, why_not

    spec = task_spec(source.task_config.task)
    flag = f"--format {ExportFormat.ONNX_FUSED.value}"
    if spec.name not in FUSED_DECODER_TASKS:
        raise UsageError(f"{flag} writes a decoder's step graph ({', '.join(FUSED_DECODER_TASKS)}), not {spec.name}: "
                         "use --format onnx")
    reason = why_not(source.model.config)
    if reason:
        raise UsageError(f"{flag}: {reason}; use --format onnx")
    if config.int32_inputs or config.external_data is ExternalData.NEVER:
        raise UsageError(f"{flag} takes int64 inputs and writes its weights to {path.name}.data: drop "
                         "--int32-inputs and --external-data never")
    files = build_fused_decoder(source.model, path)
    return files, fused_recipe(files)


# ExportFormat -> (source, config, path) -> (files written, recipe).
_EXPORTERS: dict[ExportFormat, Callable[[SourceModel, ExportConfig, Path], tuple[list[Path], list[dict]]]] = {
    ExportFormat.ONNX: _onnx, ExportFormat.TORCHSCRIPT: _torchscript, ExportFormat.ONNX_FUSED: _fused}


def run_export(config: ExportConfig, progress: Progress = lambda _: None) -> ExportResult:
    from kiln.artifact.staging import staged_directory

    progress(f"loading {config.model or 'the bundled default model'} for {config.task}")
    source = load_source(config.model, config.task, allow_pickle=config.allow_pickle, adapter=config.adapter)
    described, task_config = source.describe(), source.task_config
    with staged_directory(config.output, overwrite=config.overwrite) as stage:
        tokenizer = write_tokenizer(source, stage)
        progress(f"exporting {source.model_type} to {config.format.value}")
        record = export_variant(source, config, stage)
        progress("checking parity against PyTorch")
        reference = reference_predictor(source)
        encoder = reference.encoder
        expected = expected_outputs(reference, task_spec(config.task).export.parity_inputs())
        # The PyTorch original is done with: free its weights before the candidate loads its own copy.
        del source, reference
        release_freed()
        engine = create_engine(record.engine, stage / record.path, EngineOptions())
        parity = compare_parity(expected, Predictor(task_handler(task_config), encoder, engine),
                                tolerance=config.tolerance)
        if not parity.passed:
            raise ParityError(f"{record.name} disagrees with PyTorch beyond tolerance: {parity.summary()}")
        record = replace(record, parity=parity)
        manifest = seal(stage, Manifest(source=described, task=task_config, tokenizer=tokenizer,
                                        variants={record.name: record}, build=BuildRecord(best=record.name)))
    return ExportResult(path=config.output.expanduser().resolve(), manifest=manifest, parity=parity)
