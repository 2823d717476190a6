"""The input of kiln embed: a JSONL, CSV or Parquet file with a text column (and optionally an id column).

The file is read into one Arrow table (ids and texts only): parts are then slices of it, which is what makes a
resumed job cut its parts exactly where the first one did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import UsageError
from kiln.tasks.files import rows_csv, rows_jsonl

FORMATS = (".jsonl", ".csv", ".parquet")


def pyarrow_module() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the submodule kiln embed writes with
    except ImportError as err:
        raise UsageError(f"kiln embed writes Parquet with pyarrow, which is not installed ({err}): "
                         "pip install 'kiln[embed]'") from err
    return pyarrow


@dataclass(frozen=True)
class Corpus:
    """Row ids (the id column, else the row number) and texts, in file order."""

    ids: Any  # a pyarrow Array
    texts: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def read_corpus(path: Path, text_field: str = "text", id_field: str | None = None) -> Corpus:
    pa = pyarrow_module()
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"INPUT {path}: unsupported format {suffix or '(none)'} (use {', '.join(FORMATS)})")
    if not path.is_file():
        raise UsageError(f"INPUT {path} does not exist")
    table = _read(path, suffix, pa)
    missing = [f for f in (text_field, id_field) if f is not None and f not in table.column_names]
    if missing:
        flag = "text_field" if missing[0] == text_field else "id_field"
        raise UsageError(f"INPUT {path} has no column {missing[0]!r} ({flag}); it has: "
                         f"{', '.join(table.column_names) or 'nothing'}")
    texts = table.column(text_field).to_pylist()
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()), None)
    if bad is not None:
        raise UsageError(f"INPUT {path} row {bad + 1}: {text_field!r} must be a non-blank string "
                         f"(got {texts[bad]!r})")
    ids = table.column(id_field).combine_chunks() if id_field else pa.array(range(len(texts)), pa.int64())
    if id_field and ids.null_count:
        raise UsageError(f"INPUT {path}: {ids.null_count} rows have no {id_field!r} (--id-field)")
    return Corpus(ids, texts)


def _read(path: Path, suffix: str, pa: Any) -> Any:
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        rows = [row for _, row in (rows_jsonl(path) if suffix == ".jsonl" else rows_csv(path))]
    except UnicodeDecodeError as err:
        raise UsageError(f"INPUT {path} is not UTF-8 text ({err})") from err
    except pa.ArrowInvalid as err:
        raise UsageError(f"INPUT {path} is not a readable Parquet file ({err})") from err
    if not rows:
        raise UsageError(f"INPUT {path} holds no rows")
    try:
        return pa.Table.from_pylist(rows)
    except pa.ArrowException as err:  # e.g. an id column that mixes numbers and strings
        raise UsageError(f"INPUT {path}: rows do not form one table ({err})") from err
