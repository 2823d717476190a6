"""The artifact manifest: what was built, from what, how, and the checksum of every file."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kiln.errors import ArtifactError
from kiln.records import from_jsonable, to_jsonable
from kiln.records.artifact import BuildRecord, SourceRecord, TokenizerRecord, VariantRecord
from kiln.records.task import TaskConfig
from kiln.system.hashing import list_files, sha256_file
from kiln.system.versions import library_versions

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 2  # 2: typed records (kiln.records.artifact), ``extra`` became ``build``


@dataclass(frozen=True)
class FileRecord:
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """Serialised as manifest.json at the root of every artifact directory (by kiln.records)."""

    source: SourceRecord
    task: TaskConfig
    variants: Mapping[str, VariantRecord]
    tokenizer: TokenizerRecord
    build: BuildRecord = BuildRecord()
    versions: Mapping[str, str] = field(default_factory=library_versions)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION
    files: Mapping[str, FileRecord] = field(default_factory=dict)

    def to_json(self) -> str:
        body = {f.name: to_jsonable(getattr(self, f.name)) for f in fields(self)}
        body["task"] = self.task.to_dict()
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: Path) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArtifactError(f"{where} is not valid JSON ({err}); the artifact is corrupted") from err
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version not in READABLE_VERSIONS:
            raise ArtifactError(f"{where} has schema_version {version!r}; this kiln reads schema_version "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
        try:
            raw = READABLE_VERSIONS[version](raw)
            hints = typing.get_type_hints(cls)
            parts = {f.name: from_jsonable(hints[f.name], raw[f.name]) for f in fields(cls)
                     if f.name in raw and f.name != "task"}
            return cls(task=TaskConfig.from_dict(raw["task"]), **parts)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ArtifactError(f"{where} is missing or has malformed fields ({err})") from err

    def with_build(self, **changes: Any) -> Manifest:
        """The same manifest with ``build`` fields changed."""
        return replace(self, build=replace(self.build, **changes))


def _from_version_1(raw: dict[str, Any]) -> dict[str, Any]:
    """schema_version 1 (kiln before typed records): the run's notes were ``extra``; reference_timing carried
    derived figures beside its fields (ignored on read, as every derived figure is)."""
    raw = {**raw, "schema_version": SCHEMA_VERSION}
    raw["build"] = raw.pop("extra", {}) or {}
    return raw


# schema_version -> how a manifest of that version becomes the current one's fields.
READABLE_VERSIONS = {1: _from_version_1, SCHEMA_VERSION: lambda raw: raw}


def seal(directory: Path, manifest: Manifest) -> Manifest:
    """Record the checksum of every file in ``directory`` and write manifest.json last, atomically; returns the
    manifest as written (with its file records)."""
    manifest = replace(manifest, files={
        rel.as_posix(): FileRecord(sha256=sha256_file(directory / rel), bytes=(directory / rel).stat().st_size)
        for rel in list_files(directory)
        if rel.as_posix() != MANIFEST_NAME
    })
    target = directory / MANIFEST_NAME
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(manifest.to_json())
    os.replace(tmp, target)
    return manifest


def read_manifest(directory: Path) -> Manifest:
    """Read manifest.json without checking file contents (see :func:`verify` for that)."""
    if not directory.exists():
        raise ArtifactError(f"artifact directory {directory} does not exist")
    if not directory.is_dir():
        raise ArtifactError(f"{directory} is a file, not a kiln artifact directory")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"{directory} has no {MANIFEST_NAME}: it is not a kiln artifact, or its write did not finish"
        )
    return Manifest.from_json(path.read_text(), path)


def verify(directory: Path) -> Manifest:
    """Read the manifest and check every listed file's size and sha256; raise on the first problems."""
    manifest = read_manifest(directory)
    problems: list[str] = []
    for rel, record in sorted(manifest.files.items()):
        path = directory / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif (size := path.stat().st_size) != record.bytes:
            problems.append(f"{rel} is {size} bytes, the manifest says {record.bytes} (truncated or replaced)")
        elif sha256_file(path) != record.sha256:
            problems.append(f"{rel} does not match its sha256 in the manifest (altered)")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ArtifactError(f"artifact {directory} failed verification: {shown}")
    return manifest
