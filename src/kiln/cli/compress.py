"""`kiln distill` and `kiln prune`: the commands that make the model itself smaller (kiln/compress)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kiln.choices import PruneScope
from kiln.cli import console
from kiln.cli.options import DEFAULT_TASK_OPT, ForceOpt, ModelArg, PickleOpt, TaskOpt
from kiln.compress.continuations import BATCH_SIZE

# Options kiln distill and kiln prune share: data, the training recipe, the run.
TextsOpt = Annotated[Optional[Path], typer.Option(  # noqa: UP045
    "--texts", help="Unlabelled inputs, .txt one per line (or .jsonl/.csv as for --eval): the teacher labels them.",
    show_default=False)]
TrainOpt = Annotated[Optional[Path], typer.Option(  # noqa: UP045
    "--train", help="Labelled rows in the task's --eval format: cross-entropy on the labels (weight --alpha) beside "
    "the teacher's outputs.", show_default=False)]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Features per step, grouped by length.", min=1)]
LrOpt = Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, linear warm-up and decay).")]
MaxLengthOpt = Annotated[int, typer.Option("--max-length", help="Tokens per feature while training (cheaper "
                                           "steps); the student still serves the teacher's maximum.", min=8)]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="Weight of cross-entropy on labels against distillation "
                                         "(logit tasks with --train).")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Softmax temperature of the distillation KL.")]
HiddenOpt = Annotated[float, typer.Option("--hidden-weight", help="Weight of matching each student layer's hidden "
                                          "states to its teacher layer's (0 turns it off).")]
HeldOutOpt = Annotated[float, typer.Option("--held-out", help="Share of the data held out (at most 256 inputs) for "
                                           "the agreement with the teacher that picks the best epoch.")]
PatienceOpt = Annotated[int, typer.Option("--patience", help="Epochs without better agreement before stopping.",
                                          min=1)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the split, batch order and initialisation.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(  # noqa: UP045
    "--threads", help="Torch threads (default: the cores this process may use).", show_default=False, min=1)]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Go on from the last epoch checkpoint of an interrupted "
                                         "run with the same recipe and data.")]
LogEveryOpt = Annotated[int, typer.Option("--log-every", help="Without a terminal: a progress line every N steps.",
                                          min=1)]


def distill(
    teacher: ModelArg = None,
    task: TaskOpt = DEFAULT_TASK_OPT,
    output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write the student to "
                                         "(safetensors, config, tokenizer, sentence-transformers files, "
                                         "kiln-distill.json with its lineage).")] = Path("kiln-student"),
    layers: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Keep this many of the teacher's layers, evenly spaced (the first and last always among them).",
        show_default=False)] = None,
    keep_layers: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Keep exactly these teacher layers, e.g. 0,2,5 (instead of --layers).", show_default=False)] = None,
    texts: TextsOpt = None,
    train: TrainOpt = None,
    epochs: Annotated[int, typer.Option(help="Passes over the data (training stops early without progress).",
                                        min=1)] = 3,
    batch_size: BatchOpt = 32,
    lr: LrOpt = 5e-4,
    max_length: MaxLengthOpt = 128,
    alpha: AlphaOpt = 0.5,
    temperature: TemperatureOpt = 2.0,
    hidden_weight: HiddenOpt = 1.0,
    held_out: HeldOutOpt = 0.05,
    continuations: Annotated[int, typer.Option(
        help="Decoders (a task that generates text): continue this many training texts' openings greedily with the "
        "teacher and train on those too, for a draft model of speculative decoding (the draft learns what the "
        "teacher writes); kiln-distill.json gets the agreement on the teacher's own text.", min=0)] = 0,
    continuations_past_eos: Annotated[bool, typer.Option(
        help="--continuations: decode through the teacher's EOS (kept in the text) instead of ending there, for a "
        "draft whose target decodes past EOS.")] = False,
    patience: PatienceOpt = 2,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    resume: ResumeOpt = False,
    log_every: LogEveryOpt = 50,
    static: Annotated[bool, typer.Option(
        "--static", help="Instead of a smaller transformer, a static-embedding model: one vector per vocabulary "
        "token from the teacher, PCA to --dims, SIF weights; a text is the mean of its tokens' rows "
        "(sentence-transformers' StaticEmbedding format). No training data is needed.")] = False,
    dims: Annotated[int, typer.Option(help="--static: principal components kept.", min=1)] = 256,
    sif: Annotated[float, typer.Option(help="--static: SIF coefficient a in a / (a + p(token)).", min=1e-12)] = 1e-4,
    allow_pickle: PickleOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train a smaller student of a model (fewer layers) to reproduce it; write it as a model directory.

    Then `kiln optimize STUDENT --reference TEACHER` builds its fast variants, judged against the teacher.
    With --static, distil a static-embedding model instead (an embedding teacher; seconds to minutes, no data).
    """
    from kiln.api.build import distill as run_distill

    def run(reporter: _Reporter) -> Any:
        return run_distill(teacher, task=task.value, output=output, layers=layers,
                           keep_layers=keep_layers, texts=texts, train=train, epochs=epochs,
                           batch_size=batch_size, lr=lr, max_length=max_length, alpha=alpha, temperature=temperature,
                           hidden_weight=hidden_weight, held_out=held_out, continuations=continuations,
                           continuations_past_eos=continuations_past_eos, patience=patience, seed=seed,
                           threads=threads, resume=resume, static=static, dims=dims, sif=sif,
                           allow_pickle=allow_pickle, overwrite=force, progress=reporter)

    if static:
        result = run(_Reporter(log_every))
        console.out.print(f"static model: {result.distilled} of {result.vocabulary} tokens, {result.dims} "
                          f"dimensions ({result.explained_variance:.1%} of the variance), {result.seconds:.0f} s "
                          f"-> {result.output}")
        return
    _run(run, log_every)


def prune(
    model: ModelArg = None,
    task: TaskOpt = DEFAULT_TASK_OPT,
    output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write the pruned model to "
                                         "(kiln-prune.json holds its lineage).")] = Path("kiln-pruned"),
    heads: Annotated[float, typer.Option(help="Share of all attention heads to remove (each layer keeps one).")
                     ] = 0.0,
    ffn: Annotated[float, typer.Option(help="Share of all FFN neurons to remove (each layer keeps one).")] = 0.0,
    scope: Annotated[PruneScope, typer.Option(help="global: rank heads and neurons across layers (layers lose "
                                              "different shares); layer: the same share in every layer (with "
                                              "--heads 0 the result is a plain transformers model).")
                     ] = PruneScope.GLOBAL,
    importance_samples: Annotated[int, typer.Option(help="Training inputs the importance is measured on.",
                                                    min=1)] = 512,
    texts: TextsOpt = None,
    train: TrainOpt = None,
    recover_epochs: Annotated[int, typer.Option(help="Epochs of distillation from the unpruned model after "
                                                "pruning (0: write the pruned model as cut).", min=0)] = 1,
    batch_size: BatchOpt = 32,
    lr: LrOpt = 1e-4,  # kiln.compress.prune.RECOVERY_LR (a typer default must be a literal here)
    max_length: MaxLengthOpt = 128,
    alpha: AlphaOpt = 0.5,
    temperature: TemperatureOpt = 2.0,
    hidden_weight: HiddenOpt = 1.0,
    held_out: HeldOutOpt = 0.05,
    patience: PatienceOpt = 2,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    resume: ResumeOpt = False,
    log_every: LogEveryOpt = 50,
    allow_pickle: PickleOpt = False,
    force: ForceOpt = False,
) -> None:
    """Remove the least important attention heads and FFN neurons from the weight matrices, then recover.

    Importance is measured on --texts/--train through per-head and per-neuron gates; the pruned model is
    distilled from the unpruned one for --recover-epochs. Then `kiln optimize PRUNED --reference MODEL`.
    """
    from kiln.api.build import prune as run_prune

    _run(lambda reporter: run_prune(model, task=task.value, output=output, heads=heads, ffn=ffn, scope=scope,
                                    importance_samples=importance_samples, texts=texts, train=train,
                                    recover_epochs=recover_epochs, batch_size=batch_size, lr=lr,
                                    max_length=max_length, alpha=alpha, temperature=temperature,
                                    hidden_weight=hidden_weight, held_out=held_out, patience=patience, seed=seed,
                                    threads=threads, resume=resume, allow_pickle=allow_pickle, overwrite=force,
                                    progress=reporter), log_every)


def _run(run: Callable[[_Reporter], Any], log_every: int) -> None:
    reporter = _Reporter(log_every)
    try:
        result = run(reporter)
    finally:
        reporter.close()
    layers = "" if "pruning" in reporter.student else f"{len(result.keep)} layers {list(result.keep)} of the teacher, "
    console.out.print(f"student: {layers}{result.parameters / 1e6:.1f}M parameters "
                      f"({result.parameters / result.teacher_parameters:.0%} of the teacher), agreement with the "
                      f"teacher {result.agreement:.4f} ({', '.join(f'{k} {v:.4f}' for k, v in result.figures.items())}"
                      f"), {result.seconds / 60:.1f} min -> {result.path}")


class _Reporter:
    """Training progress: a bar with loss and agreement on a terminal, a line every N steps elsewhere."""

    def __init__(self, every: int) -> None:
        self.every, self.bar, self.agreement = every, None, "-"
        self.student: dict[str, Any] = {}

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "start":
            self.student = data["student"]
            what = ("pruned model" if "pruning" in self.student
                    else f"student keeps layers {list(data['keep'])}")
            console.progress(f"{what}; {data['train']} inputs ({data['features']} features) to train on, "
                             f"{data['held_out']} held out; agreement with the teacher before training "
                             f"{data['agreement_before']:.4f}")
        elif kind == "importance":
            if data["done"] == data["total"] or data["done"] % self.every == 0:
                console.progress(f"importance of heads and neurons: batch {data['done']}/{data['total']}")
        elif kind == "pruned":
            shape = data["shape"]
            console.progress(f"pruned: heads per layer {[len(h) for h in shape.heads]}, FFN width per layer "
                             f"{list(shape.ffn)}; {data['parameters'] / 1e6:.1f}M parameters "
                             f"({data['parameters'] / data['teacher_parameters']:.0%} of the unpruned model)")
        elif kind == "continuations":
            # A message every `every` batches of the teacher's generation, and at the end.
            if data["done"] == data["total"] or data["done"] % (self.every * BATCH_SIZE) < BATCH_SIZE:
                console.progress(f"the teacher's continuations: {data['done']}/{data['total']} texts")
        elif kind == "message":  # a static distillation's progress lines
            console.progress(data["text"])
        elif kind == "resumed":
            console.progress(f"resumed after epoch {data['epoch']} from {data['path']}")
        elif kind == "step":
            label = f"epoch {data['epoch']}"
            if data["step"] == 1:
                if self.bar is None:
                    self.bar = console.progress_bar(data["steps"], label)
                else:
                    self.bar.reset(label, data["steps"])
            status = f"loss {data['loss']:.4f} agreement {self.agreement}"
            if self.bar is not None:
                self.bar.advance(status)
            elif data["step"] % self.every == 0:
                console.progress(f"{label} step {data['step']}/{data['steps']} {status}")
        elif kind == "epoch":
            self.agreement = f"{data['agreement']:.4f}"
            console.progress(f"epoch {data['epoch']}: loss {data['loss']:.4f}, agreement with the teacher "
                             f"{data['agreement']:.4f} on the held-out inputs, {data['seconds']:.0f} s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
