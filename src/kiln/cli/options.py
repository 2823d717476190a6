"""Argument and option types shared by several kiln commands."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kiln.tasks import DEFAULT_TASK, TaskName

ModelArg = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional to mark the argument optional
    typer.Argument(
        help="Model directory (config.json, *.safetensors, tokenizer files) or a Hugging Face hub id "
        "(needs a network). Omit it to use the bundled all-MiniLM-L6-v2.",
        show_default=False,
    ),
]
TaskOpt = Annotated[
    TaskName,
    typer.Option("--task", "-t", help="What the model is used for; decides the head, pre- and post-processing."),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace the output directory if it exists.")]
PickleOpt = Annotated[
    bool,
    typer.Option("--allow-pickle", help="Allow pytorch_model.bin weights. Unpickling can run arbitrary code: "
                 "only for models you trust; prefer safetensors."),
]
AdapterOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="Merge this task LoRA adapter of a model that carries several (jina-embeddings-v3: "
                 "retrieval.query, retrieval.passage, separation, classification, text-matching); one artifact per "
                 "adapter. Omitted: none, as the model's own code does without a task.", show_default=False),
]


DEFAULT_TASK_OPT = TaskName(DEFAULT_TASK)


def name_list(value: str | None) -> tuple[str, ...]:
    """``"a, b,"`` as ("a", "b"): the names of a comma-separated option, blanks dropped; () for None."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def int_list(value: str | None, flag: str) -> tuple[int, ...] | None:
    """``"1,8,32"`` as (1, 8, 32); a UsageError naming ``flag`` for anything else."""
    from kiln.errors import UsageError

    if value is None:
        return None
    try:
        numbers = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated positive integers (got {value!r})") from None
    if not numbers or min(numbers) < 1:
        raise UsageError(f"{flag} must be comma-separated positive integers (got {value!r})")
    return numbers
