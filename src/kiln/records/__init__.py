"""The one place typed records become JSON and come back: schema-versioned, written atomically, checked on read.

Records are frozen dataclasses (with Enums, tuples, mappings and other records inside). ``to_jsonable``
turns one into plain JSON values (properties such as ``ms_per_sequence`` are included for readers of the
file); ``from_jsonable`` rebuilds the record from its field types, ignoring the extra derived keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kiln.errors import ArtifactError

T = TypeVar("T")


def to_jsonable(value: Any) -> Any:
    """Plain JSON values for a record (recursively); numpy values become Python numbers and lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name, attr in vars(type(value)).items():  # derived figures, written for readers of the file
            if isinstance(attr, property):
                out[name] = to_jsonable(getattr(value, name))
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def from_jsonable(kind: Any, data: Any) -> Any:
    """Rebuild a value of type ``kind`` (a record class or a typing form) from :func:`to_jsonable` output."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if data is None:
            return None
        return from_jsonable(options[0], data) if len(options) == 1 else data
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind) if f.init}
        return kind(**{k: from_jsonable(hints[k], v) for k, v in data.items() if k in names})
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(data)
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], v) for v in data)
        return tuple(from_jsonable(a, v) for a, v in zip(args, data))
    if origin in (dict, Mapping, typing.Mapping) or kind in (dict, Mapping):
        args = typing.get_args(kind)
        if not args:
            return dict(data)
        key = args[0] if isinstance(args[0], type) and issubclass(args[0], Enum) else None  # JSON keys are strings
        return {(key(k) if key else k): from_jsonable(args[1], v) for k, v in data.items()}
    if origin is list:
        return [from_jsonable(typing.get_args(kind)[0], v) for v in data]
    return data


def write_json(path: Path, schema: str, record: Any) -> None:
    """``{"schema": schema, **record}`` to ``path``, atomically (a reader never sees half a file)."""
    body = {"schema": schema, **to_jsonable(record)}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, schema: str | tuple[str, ...]) -> dict[str, Any]:
    """The JSON document at ``path``, refused unless it declares ``schema`` (or one of several)."""
    schemas = (schema,) if isinstance(schema, str) else schema
    try:
        body = json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise ArtifactError(f"{path} does not exist") from err
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(body, dict) or body.get("schema") not in schemas:
        got = body.get("schema") if isinstance(body, dict) else None
        raise ArtifactError(f"{path} has schema {got!r}; this kiln reads {' or '.join(map(repr, schemas))}")
    return body


def read_record(path: Path, schema: str | tuple[str, ...], kind: type[T]) -> T:
    """A typed record read back from a file written by :func:`write_json`."""
    try:
        return from_jsonable(kind, read_json(path, schema))
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{path} is missing or has malformed fields ({err})") from err
