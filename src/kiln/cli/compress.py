"""`kiln distill`: the command that makes the model itself smaller (kiln/compress)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kiln.cli import console
from kiln.cli.options import DEFAULT_TASK_OPT, ForceOpt, ModelArg, PickleOpt, TaskOpt


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
    texts: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Unlabelled inputs, .txt one per line (or .jsonl/.csv as for --eval): the teacher labels them.",
        show_default=False)] = None,
    train: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Labelled rows in the task's --eval format: cross-entropy on the labels (weight --alpha) beside the "
        "teacher's outputs.", show_default=False)] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the data (training stops early without progress).",
                                        min=1)] = 3,
    batch_size: Annotated[int, typer.Option(help="Features per step, grouped by length.", min=1)] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, linear warm-up and decay).")] = 5e-4,
    max_length: Annotated[int, typer.Option(help="Tokens per feature while training (cheaper steps); the "
                                            "student still serves the teacher's maximum.", min=8)] = 128,
    alpha: Annotated[float, typer.Option(help="Weight of cross-entropy on labels against distillation (logit "
                                         "tasks with --train).")] = 0.5,
    temperature: Annotated[float, typer.Option(help="Softmax temperature of the distillation KL.")] = 2.0,
    hidden_weight: Annotated[float, typer.Option(help="Weight of matching each student layer's hidden states "
                                                 "to its teacher layer's (0 turns it off).")] = 1.0,
    held_out: Annotated[float, typer.Option(help="Share of the data held out (at most 256 inputs) for the "
                                            "agreement with the teacher that picks the best epoch.")] = 0.05,
    patience: Annotated[int, typer.Option(help="Epochs without better agreement before stopping.", min=1)] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the split, batch order and initialisation.")] = 0,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Torch threads (default: the cores this process may use).", show_default=False, min=1)] = None,
    resume: Annotated[bool, typer.Option(help="Go on from the last epoch checkpoint of an interrupted run with "
                                         "the same recipe and data.")] = False,
    log_every: Annotated[int, typer.Option(help="Without a terminal: a progress line every N steps.",
                                           min=1)] = 50,
    allow_pickle: PickleOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train a smaller student of a model (fewer layers) to reproduce it; write it as a model directory.

    Then `kiln optimize STUDENT --reference TEACHER` builds its fast variants, judged against the teacher.
    """
    from kiln.compress.distill import DistillConfig, run_distill
    from kiln.compress.losses import LossWeights

    recipe = {"epochs": epochs, "batch_size": batch_size, "lr": lr, "max_length": max_length, "seed": seed,
              "patience": patience, "weights": LossWeights(alpha, temperature, hidden_weight)}
    config = DistillConfig(teacher, task.value, output, layers=layers, keep_layers=keep_layers, texts=texts,
                           train=train, recipe=recipe, held_out=held_out, threads=threads, resume=resume,
                           overwrite=force, allow_pickle=allow_pickle)
    reporter = _Reporter(log_every)
    try:
        result = run_distill(config, reporter)
    finally:
        reporter.close()
    console.out.print(f"student: {len(result.keep)} layers {list(result.keep)} of the teacher, "
                      f"{result.parameters / 1e6:.1f}M parameters ({result.parameters / result.teacher_parameters:.0%}"
                      f" of the teacher), agreement with the teacher {result.agreement:.4f} "
                      f"({', '.join(f'{k} {v:.4f}' for k, v in result.figures.items())}), "
                      f"{result.seconds / 60:.1f} min -> {result.path}")


class _Reporter:
    """Training progress: a bar with loss and agreement on a terminal, a line every N steps elsewhere."""

    def __init__(self, every: int) -> None:
        self.every, self.bar, self.agreement = every, None, "-"

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "start":
            console.progress(f"student keeps layers {list(data['keep'])}; {data['train']} inputs "
                             f"({data['features']} features) to train on, {data['held_out']} held out; agreement "
                             f"with the teacher before training {data['agreement_before']:.4f}")
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
