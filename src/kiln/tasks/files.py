"""Reading what tasks read: a model directory's JSON files, and eval files' rows (JSONL or CSV) with errors that name
the line and the field."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kiln.errors import UsageError


def field(row: Mapping[str, Any], name: str, where: str, parse: Any = str, *, optional_empty: bool = False) -> Any:
    """``parse(row[name])``, or a UsageError naming the line, the field and what the row holds."""
    if name not in row or (row[name] in (None, "") and not optional_empty):
        raise UsageError(f"{where}: missing field {name!r} (the row has: {', '.join(sorted(row)) or 'nothing'})")
    try:
        return parse(row[name])
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: field {name!r} has a bad value {row[name]!r} ({err})") from err


def read_json(path: Path) -> Any:
    """A model directory's JSON file, or a ModelLoadError naming it."""
    from kiln.errors import ModelLoadError

    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ModelLoadError(f"{path} is missing") from err
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err


def rows_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line of a JSONL file; a UsageError names a bad line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path} line {number}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict):
            raise UsageError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def rows_csv(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row by header) per row of a CSV file; a UsageError names a row with more values than columns."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            if None in row:
                raise UsageError(f"{path} line {reader.line_num}: more values than columns {reader.fieldnames}")
            yield reader.line_num, row


def load_dense(directory: Path) -> Any:
    """One sentence-transformers Dense module as a torch Linear: identity activation only (what ColBERT checkpoints
    and EmbeddingGemma use), its weights from model.safetensors."""
    import torch
    from safetensors.torch import load_file

    from kiln.errors import ModelLoadError, UnsupportedModelError

    config = read_json(directory / "config.json")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
    if not activation.endswith("Identity"):
        raise UnsupportedModelError(f"{directory}: kiln reads Dense projections without an activation (got "
                                    f"{activation})")
    if config.get("use_residual"):
        raise UnsupportedModelError(f"{directory}: a residual Dense projection is not supported")
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"{directory} holds no model.safetensors (pickled Dense weights are refused)")
    state = {k.removeprefix("linear."): v for k, v in load_file(str(weights)).items()}
    linear = torch.nn.Linear(int(config["in_features"]), int(config["out_features"]), bias="bias" in state)
    linear.load_state_dict(state)
    return linear.eval()
