"""The versions of the libraries that decide what an artifact computes."""

from __future__ import annotations

import platform
from importlib import metadata

# Libraries whose versions decide what an artifact computes; recorded, never imported for it.
_TRACKED_PACKAGES = (
    "kiln", "torch", "transformers", "tokenizers", "onnx", "onnxruntime", "onnxruntime-gpu",
    "openvino", "nncf", "numpy",
)


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
