"""The environment fingerprint stored with every result: CPU, memory, GPU, libraries, providers."""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any

from kiln.system.cpu import cpu_info, int8_scheme
from kiln.system.versions import library_versions


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def fingerprint() -> dict[str, Any]:
    import psutil

    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except ImportError:
        providers = []
    cpu = cpu_info()
    return {"cpu": cpu.to_dict(), "int8_kernels": int8_scheme(cpu).reason,
            "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
            "gpus": _gpus(), "platform": platform.platform(), "versions": library_versions(),
            "execution_providers": providers}
