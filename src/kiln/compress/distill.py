"""kiln distill: a smaller student of a model, trained to reproduce it, written as an ordinary model directory.

The student keeps K of the teacher's layers (weights copied), is trained on the user's texts (the teacher
labels them) and/or labelled rows, stops early on agreement with the teacher over a held-out split, and is
written where transformers, sentence-transformers and kiln all load it, with a lineage file naming the teacher,
the recipe and the data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.compress.continuations import NEW_TOKENS, check_count, teacher_continuations
from kiln.compress.recipe import CHECKPOINT, Epoch, Recipe
from kiln.compress.student import build_student, depth, evenly_spaced, parse_keep_layers
from kiln.errors import UsageError
from kiln.records import write_json
from kiln.system.hashing import sha256_file

if TYPE_CHECKING:
    from kiln.compress.trainer import Features

LINEAGE_FILE = "kiln-distill.json"  # kiln prune writes kiln-prune.json
LINEAGE_SCHEMA = "kiln.compress/1"
OWN_TEXT_FIGURE = "agreement_on_teacher_text"  # --continuations: on the teacher's continuations of held-out texts
# sentence-transformers' own files: a student with them loads in SentenceTransformer with the same pooling.
ST_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")


@dataclass(frozen=True)
class DistillConfig:
    teacher: str | None  # model directory or hub id; None: the bundled MiniLM
    task: str
    output: Path
    layers: int | None = None  # keep this many evenly spaced layers...
    keep_layers: str | None = None  # ...or exactly these ("0,2,5")
    texts: Path | None = None  # unlabelled inputs: the teacher labels them
    train: Path | None = None  # labelled rows in the task's eval-file format
    recipe: dict[str, Any] = field(default_factory=dict)  # Recipe fields besides ``keep``
    held_out: float = 0.05  # share of the data kept aside for the agreement that stops training
    max_held_out: int = 256
    continuations: int = 0  # decoders: this many training texts' greedy continuations by the teacher are added
    continuations_past_eos: bool = False  # ...decoded through EOS, for a target that will decode past it
    threads: int | None = None
    resume: bool = False
    overwrite: bool = False
    allow_pickle: bool = False


@dataclass(frozen=True)
class DistillResult:
    path: Path
    keep: tuple[int, ...]
    history: tuple[Epoch, ...]
    agreement: float
    figures: dict[str, float]
    seconds: float
    parameters: int
    teacher_parameters: int


def checkpoint_dir(output: Path) -> Path:
    """Where a run keeps its per-epoch checkpoint: beside the output, removed once the student is written."""
    output = output.expanduser().resolve()
    return output.parent / f".{output.name}.distill-checkpoint"


def _data(config: DistillConfig) -> tuple[list[Any], list[Any] | None, dict[str, Any]]:
    """(inputs, labels or None per input, description with hashes)."""
    from kiln.tasks import task_spec
    from kiln.validation.datasets import read_inputs
    from kiln.validation.evalsets import load_eval_set

    if config.texts is None and config.train is None:
        raise UsageError("kiln distill needs data: --texts FILE (unlabelled, one text per line or .jsonl/.csv) "
                         "and/or --train FILE (labelled, the --eval formats)")
    inputs: list[Any] = []
    labels: list[Any] = []
    described: dict[str, Any] = {}
    if config.texts is not None:
        texts = read_inputs(config.texts, config.task, "texts")
        inputs += texts
        labels += [None] * len(texts)
        described["texts"] = {"path": str(config.texts), "sha256": sha256_file(config.texts.expanduser()),
                              "count": len(texts)}
    if config.train is not None:
        rows, row_labels = task_spec(config.task).validation.training_rows(load_eval_set(config.train, config.task))
        inputs += rows
        labels += row_labels
        described["train"] = {"path": str(config.train), "sha256": sha256_file(config.train.expanduser()),
                              "count": len(rows)}
    if len(inputs) < 2:
        raise UsageError(f"kiln distill needs at least 2 inputs to train and hold some out (got {len(inputs)})")
    return inputs, labels if any(label is not None for label in labels) else None, described


def split(count: int, share: float, cap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices): a seeded share of the data, at least 1 and at most ``cap``, held out."""
    if not 0 < share < 1:
        raise UsageError(f"held_out must be between 0 and 1 (got {share})")
    order = np.random.default_rng(seed).permutation(count)
    held = max(1, min(cap, int(round(count * share))))
    return np.sort(order[held:]), np.sort(order[:held])


@dataclass(frozen=True)
class Student:
    """A student before training: the model, the teacher layer each of its layers starts from (their hidden
    states are matched), and what to record about how it was made."""

    model: Any
    keep: tuple[int, ...]
    lineage: dict[str, Any]


@dataclass(frozen=True)
class StudentMaker:
    """How a compression method makes its student: ``describe`` goes into the resume fingerprint, ``make`` gets
    the teacher, the training features, the encoder that made them and a progress callback."""

    method: str  # "distill" or "prune": the lineage file is kiln-<method>.json
    describe: dict[str, Any]
    make: Callable[[Any, Features, Any, Callable[[str, dict[str, Any]], None]], Student]
    decoders: bool = False  # whether it can make a decoder's student (keeping layers can; slicing heads cannot)
    # the method's own arguments against the loaded teacher, before its texts are run (--layers past its depth)
    fits: Callable[[Any], None] = lambda source: None

    def check(self, source: Any) -> None:
        from kiln.errors import UnsupportedModelError
        from kiln.source.architectures import arch_spec

        arch = arch_spec(source.model_type)
        if arch.compress_refused:
            raise UnsupportedModelError(f"kiln {self.method} is not verified for {source.model_type!r}: "
                                        f"{arch.compress_refused}")
        if arch.decoder and not self.decoders:
            raise UnsupportedModelError(f"kiln {self.method} changes encoder layers; {source.model_type!r} is a "
                                        "decoder (kiln distill --layers K makes its student)")
        from kiln.model.projected import CARRIES_PROJECTIONS, is_projected

        if is_projected(source.model):
            raise UnsupportedModelError(f"kiln {self.method} writes its student as one transformers model; "
                                        f"{source.name} {CARRIES_PROJECTIONS}")
        self.fits(source)


def layer_student(config: DistillConfig) -> StudentMaker:
    """kiln distill's student: K of the teacher's layers (--layers / --keep-layers), which must be given (checked
    here, before anything slow)."""
    if (config.layers is None) == (config.keep_layers is None):
        raise UsageError("give the student's layers: --layers K (evenly spaced) or --keep-layers 0,2,5")

    def make(source, features: Features, encoder, progress) -> Student:
        keep = _keep_layers(config, depth(source.model))
        return Student(build_student(source.model, keep), keep, {"layers": len(keep), "keep_layers": list(keep)})

    def fits(source) -> None:
        _keep_layers(config, depth(source.model))  # a UsageError naming the teacher's depth

    return StudentMaker("distill", {"layers": config.layers, "keep_layers": config.keep_layers}, make, decoders=True,
                        fits=fits)


def run_distill(config: DistillConfig, progress: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
                ) -> DistillResult:
    return run_compression(config, layer_student(config), progress)


def run_compression(config: DistillConfig, maker: StudentMaker,
                    progress: Callable[[str, dict[str, Any]], None] = lambda kind, data: None) -> DistillResult:
    """Data, teacher and held-out split; the maker's student; training against the teacher; the directory."""
    begin = time.perf_counter()
    output = config.output.expanduser().resolve()
    if output.exists() and not config.overwrite and not config.resume:
        raise UsageError(f"{output} already exists; pass --force to replace it")
    recipe = Recipe(keep=(), **config.recipe)  # checked before anything slow; the student's layers come below
    _check_continuations(config)
    if config.resume and not (checkpoint_dir(output) / CHECKPOINT).is_file():  # before the teacher loads (the
        # tiny BERT's imports alone are 9 s; a real model's weights, minutes)
        raise UsageError(f"resume: no checkpoint at {checkpoint_dir(output) / CHECKPOINT} (a run writes one after "
                         "each epoch)")
    inputs, labels, described = _data(config)
    # torch and transformers only now, the arguments and data checked: a bad one is refused in a second.
    from kiln.engines.base import EngineOptions
    from kiln.engines.torch_eager import configure_torch_threads
    from kiln.source.loading import load_source, parameter_count
    from kiln.source.reference import reference_predictor
    from kiln.tasks import task_spec
    from kiln.validation.agreement import agreement_inputs

    source = load_source(config.teacher, config.task, allow_pickle=config.allow_pickle)
    maker.check(source)
    configure_torch_threads(EngineOptions(intra_op_threads=config.threads))
    spec = task_spec(config.task)
    train_idx, held_idx = split(len(inputs), config.held_out, config.max_held_out, recipe.seed)
    train_inputs = [inputs[i] for i in train_idx]
    train_labels = None if labels is None else [labels[i] for i in train_idx]
    continued = _continued(config, source, train_inputs, [inputs[i] for i in held_idx], progress)
    if continued:
        described["continuations"] = {"count": len(continued.train), "new_tokens": NEW_TOKENS,
                                      "past_eos": config.continuations_past_eos}
        train_inputs += continued.train
        train_labels = None if train_labels is None else train_labels + [None] * len(continued.train)
    reference = reference_predictor(source, threads=config.threads)
    data, train_encoder = _training_features(source, spec, recipe.max_length, reference.encoder, train_inputs,
                                             train_labels)
    held_out = agreement_inputs(reference, [inputs[i] for i in held_idx])
    evaluate = _evaluator(source, spec, reference.encoder, held_out, config.threads)
    # The draft's figure: agreement on the teacher's own continuations of the held-out texts.
    on_own = None if not continued else _evaluator(source, spec, reference.encoder,
                                                   agreement_inputs(reference, continued.held_out), config.threads)
    made = maker.make(source, data, train_encoder, progress)
    recipe = dataclasses.replace(recipe, keep=made.keep)
    fingerprint = hashlib.sha256(json.dumps({"recipe": asdict(recipe), "data": described, "teacher":
                                             source.content_sha256, "task": config.task, "method": maker.method,
                                             "student": maker.describe,
                                             "held_out": [config.held_out, config.max_held_out]},
                                            sort_keys=True, default=str).encode()).hexdigest()
    student = made.model
    before, _ = evaluate(student)
    progress("start", {"keep": made.keep, "train": len(train_inputs), "features": len(data), "held_out": len(held_idx),
                       "agreement_before": before, "student": made.lineage})
    checkpoints = checkpoint_dir(output)
    from kiln.compress.trainer import Distiller  # torch: see the imports above

    distiller = Distiller(source.model, student, spec, source.task_config, train_encoder, source.input_names,
                          recipe, checkpoints, evaluate, progress)
    history = distiller.fit(data, fingerprint=fingerprint, resume=config.resume) if recipe.epochs else []
    final, figures = evaluate(student)
    if on_own is not None:
        figures = {**figures, OWN_TEXT_FIGURE: on_own(student)[0]}
    result = DistillResult(output, made.keep, tuple(history), final, figures, time.perf_counter() - begin,
                           parameter_count(student), parameter_count(source.model))
    lineage = {
        "method": maker.method, "teacher": source.describe(), "task": config.task,
        "student": {**made.lineage, "parameters": result.parameters},
        "recipe": asdict(recipe), "data": {**described, "held_out": int(len(held_idx)),
                                           "train": len(train_inputs), "features": len(data)},
        **({"continuations_seconds": continued.seconds} if continued else {}),
        "agreement": {"before": before, "final": final, "figures": figures,
                      "measured_on": f"{len(held_idx)} held-out inputs, against the teacher"},
        "history": [asdict(h) for h in history], "seconds": result.seconds,
    }
    _write_student(output, source, student, f"kiln-{maker.method}.json", lineage,
                   overwrite=config.overwrite or config.resume)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return result


@dataclass(frozen=True)
class _Continued:
    """--continuations: the teacher's continuations of the chosen training texts (trained on) and of the held-out
    texts (the draft's own agreement figure), and how long making them took."""

    train: list[str]
    held_out: list[str]
    seconds: float


def _check_continuations(config: DistillConfig) -> None:
    """--continuations checked before anything slow: a count, and a task whose model generates text."""
    from kiln.choices import Scheduling
    from kiln.tasks import TASKS, task_spec

    check_count(config.continuations)
    if config.continuations and task_spec(config.task).scheduling is not Scheduling.DECODE:
        generating = ", ".join(t for t in TASKS if task_spec(t).scheduling is Scheduling.DECODE)
        raise UsageError(f"continuations adds a decoder's own continuations of its training texts; --task "
                         f"{config.task} generates none (use it with --task {generating})")


def _continued(config: DistillConfig, source, train: list[Any], held: list[Any],
               progress: Callable[[str, dict[str, Any]], None]) -> _Continued | None:
    """The teacher's continuations of the first ``config.continuations`` training texts and of the held-out texts;
    None without --continuations."""
    if not config.continuations:
        return None
    begin = time.perf_counter()
    chosen = train[: config.continuations]
    total = len(chosen) + len(held)
    past_eos = config.continuations_past_eos
    made = teacher_continuations(source.model, source.tokenizer, chosen, past_eos=past_eos,
                                 progress=lambda done, _: progress("continuations", {"done": done, "total": total}))
    own = teacher_continuations(source.model, source.tokenizer, held, past_eos=past_eos, progress=lambda done, _:
                                progress("continuations", {"done": len(chosen) + done, "total": total}))
    return _Continued(made, own, round(time.perf_counter() - begin, 1))


def _keep_layers(config: DistillConfig, teacher_depth: int) -> tuple[int, ...]:
    if config.keep_layers is not None:
        return parse_keep_layers(config.keep_layers, teacher_depth)
    return evenly_spaced(teacher_depth, config.layers)  # type: ignore[arg-type]


def _training_features(source, spec, max_length: int, encoder, inputs: list[Any], labels: list[Any] | None):
    """(features cut at the recipe's max_length with their targets, the encoder that cut them); agreement is
    measured with ``encoder`` at the teacher's full length, as the student will serve."""
    from kiln.compress.trainer import Features  # torch: see run_compression
    from kiln.runtime.tokenization import TextEncoder

    train_encoder = TextEncoder(encoder.tokenizer, max_length=min(max_length, encoder.max_length),
                                pad_id=encoder.pad_id, input_names=encoder.input_names)
    prepared = spec(source.task_config).features(inputs, train_encoder)
    targets = {} if labels is None else \
        spec.validation.training_labels(prepared, labels, source.task_config, train_encoder)
    return Features(prepared, targets), train_encoder


def _evaluator(source, spec, encoder, held_out, threads: int | None
               ) -> Callable[[Any], tuple[float, dict[str, float]]]:
    """The student's agreement with the teacher on the held-out inputs: the task's gated figure and the rest."""
    from kiln.engines.base import EngineOptions
    from kiln.engines.torch_eager import TorchEngine
    from kiln.model.module import TaskModule
    from kiln.runtime.predictor import Predictor
    from kiln.tasks import task_handler
    from kiln.validation.agreement import measure_agreement

    def evaluate(student) -> tuple[float, dict[str, float]]:
        module = TaskModule(student, source.input_names, spec.export.output_names, head=spec.export.graph_head)
        engine = TorchEngine(module, EngineOptions(intra_op_threads=threads))
        agreement = measure_agreement(held_out, Predictor(task_handler(source.task_config), encoder, engine))
        student.eval()  # TorchEngine keeps the module in eval mode; training does too (no dropout)
        return agreement.value, dict(agreement.figures)

    return evaluate


def _write_student(output: Path, source, student, lineage_file: str, lineage: dict[str, Any], *,
                   overwrite: bool) -> None:
    """The student as an ordinary model directory, written atomically, with its lineage."""
    import torch

    from kiln.artifact.staging import staged_directory
    from kiln.model.layout import save_model

    with staged_directory(output, overwrite=overwrite) as stage:
        save_model(student, stage)
        source.tokenizer.save_pretrained(stage)
        _copy_sentence_transformers_files(source.path, stage)
        write_json(stage / lineage_file, LINEAGE_SCHEMA, {**lineage, "torch": torch.__version__})


def _copy_sentence_transformers_files(teacher_dir: Path, stage: Path) -> None:
    """modules.json and its module folders (pooling, normalize), so sentence-transformers loads the student
    with the teacher's pipeline; the Transformer module (path "") is the student itself."""
    modules = teacher_dir / "modules.json"
    if not modules.is_file():
        return
    for name in ST_FILES:
        if (teacher_dir / name).is_file():
            shutil.copy2(teacher_dir / name, stage / name)
    for module in json.loads(modules.read_text()):
        path = module.get("path") or ""
        if path and (teacher_dir / path).is_dir():
            shutil.copytree(teacher_dir / path, stage / path)
