"""Looking at an artifact and at this machine, from Python: ``kiln.info`` and ``kiln.doctor``. The CLI's
``kiln info`` and ``kiln doctor`` print what these return.

Each function imports its job when called, so that `import kiln` stays free of torch, transformers and the server's
packages (a serving install has no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.artifact.cpu_pick import CpuPick
    from kiln.artifact.manifest import Manifest
    from kiln.system.doctor import Report


@dataclass(frozen=True)
class ArtifactInfo:
    """An artifact as ``kiln info`` shows it: its manifest (every file's sha256 verified when read) and, when it has
    variants, the one this CPU runs and why."""

    path: Path
    manifest: Manifest
    pick: CpuPick | None


def info(artifact: str | Path) -> ArtifactInfo:
    """``kiln info``: open ``artifact``, verify the sha256 of every file (ArtifactError on a mismatch) and pick the
    variant for this CPU (re-validating once on a CPU class the artifact was not validated on)."""
    from kiln.artifact.directory import Artifact

    opened = Artifact.open(Path(artifact))
    return ArtifactInfo(opened.path, opened.manifest, opened.cpu_pick() if opened.manifest.variants else None)


def doctor(threads: int | None = None) -> Report:
    """``kiln doctor``: this machine's CPU vector features and the int8 scheme they imply, usable cores against
    ``threads``, the execution providers that really work, and library versions, with findings to act on."""
    from kiln.source.architectures import REFUSED, SUPPORTED
    from kiln.system.doctor import diagnose

    report = diagnose(threads)
    report.sections["models"] = {
        "encoders": ", ".join(sorted(n for n, a in SUPPORTED.items() if not a.decoder)),
        "decoders": ", ".join(sorted(n for n, a in SUPPORTED.items() if a.decoder)),
        **{f"refused {name}": reason for name, reason in sorted(REFUSED.items())}}
    return report
