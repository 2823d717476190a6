"""OUTPUT of kiln embed: numbered Parquet parts (id, vector) and the job record that makes --resume safe.

A part is written to a hidden temporary file and renamed into place, so a killed job leaves whole parts or
none; ``kiln-embed.json`` records what the parts were cut from (input, columns, artifact, part size), and a
resumed job refuses to append parts of a different job.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bulk.corpus import pyarrow_module
from kiln.errors import UsageError

JOB_FILE = "kiln-embed.json"
SCHEMA = "kiln.embed/1"
_PART = re.compile(r"^part-(\d{5})\.parquet$")


@dataclass(frozen=True)
class JobRecord:
    """What the parts in OUTPUT were made from; a resume must match it field for field."""

    input: str
    input_bytes: int
    text_field: str
    id_field: str | None
    artifact: str
    artifact_sha256: str
    variant: str
    rows: int
    rows_per_part: int
    dimension: int | None = None  # known once the first part is written
    precision: str = "float32"  # the vectors' (kiln.runtime.precision); binary ones are dimension / 8 bytes

    @property
    def parts(self) -> int:
        return -(-self.rows // self.rows_per_part)


def part_path(output: Path, index: int) -> Path:
    return output / f"part-{index:05d}.parquet"


def finished_parts(output: Path) -> set[int]:
    """Indices of the parts already in OUTPUT (whole by construction: they were renamed into place)."""
    return {int(m.group(1)) for p in output.iterdir() if (m := _PART.match(p.name))} if output.is_dir() else set()


def prepare_output(output: Path, record: JobRecord, *, resume: bool, overwrite: bool) -> set[int]:
    """Make OUTPUT ready for ``record``'s job; the parts already done (only with ``resume``)."""
    job_file = output / JOB_FILE
    if output.exists() and any(output.iterdir()):
        if resume and job_file.is_file():
            found = json.loads(job_file.read_text())
            mine = {"schema": SCHEMA, **asdict(record)}
            changed = [k for k in mine if k != "dimension" and found.get(k) != mine[k]]
            if changed:
                raise UsageError(f"resume: {output} holds parts of another job ({', '.join(changed)} differ: "
                                 f"{', '.join(f'{k}={found.get(k)!r}' for k in changed)}); use a new OUTPUT")
            for stale in output.glob(".part-*.tmp"):  # a part the killed job did not finish
                stale.unlink()
            return finished_parts(output)
        if not overwrite:
            hint = "pass --resume to continue it, or --force to start again" if job_file.is_file() else \
                "pass --force to replace it"
            raise UsageError(f"OUTPUT {output} exists and is not empty; {hint}")
        for child in output.iterdir():
            if child.is_file() and (_PART.match(child.name) or child.name == JOB_FILE
                                    or child.name.startswith(".part-")):
                child.unlink()
            else:
                raise UsageError(f"overwrite: {output} holds {child.name}, which kiln embed did not write; "
                                 "choose another OUTPUT")
    output.mkdir(parents=True, exist_ok=True)
    write_record(output, record)
    return set()


def write_record(output: Path, record: JobRecord) -> None:
    tmp = output / f".{JOB_FILE}.tmp"
    tmp.write_text(json.dumps({"schema": SCHEMA, **asdict(record)}, indent=2))
    os.replace(tmp, output / JOB_FILE)


def write_part(output: Path, index: int, ids: Any, vectors: np.ndarray | list[np.ndarray]) -> Path:
    """One part, atomically: (id, vector) rows, the vector a fixed-size list of float32 (or of int8 / uint8 at
    another precision); for a late-interaction artifact, (id, vectors) rows: a list of such fixed-size lists, one
    per kept token."""
    pa = pyarrow_module()
    import pyarrow.parquet as pq

    def fixed_size(rows: np.ndarray) -> Any:
        rows = np.ascontiguousarray(rows, dtype=rows.dtype if rows.dtype.itemsize == 1 else np.float32)
        return pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])

    if isinstance(vectors, list):
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in vectors])]).astype(np.int32)
        tokens = fixed_size(np.concatenate(vectors))
        table = pa.table({"id": ids, "vectors": pa.ListArray.from_arrays(pa.array(offsets), tokens)})
    else:
        table = pa.table({"id": ids, "vector": fixed_size(vectors)})
    final = part_path(output, index)
    tmp = output / f".{final.name}.tmp"
    pq.write_table(table, tmp)
    with open(tmp, "rb") as fh:  # on disk before the rename makes it count as done
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def read_output(output: Path) -> Any:
    """Every part of OUTPUT in order, as one Arrow table (id, vector)."""
    pa = pyarrow_module()
    import pyarrow.parquet as pq

    parts = sorted(finished_parts(output))
    return pa.concat_tables([pq.read_table(part_path(output, i)) for i in parts])
