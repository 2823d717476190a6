"""CPU facts that decide kernels: vector features, int8 signedness, usable cores."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

# /proc/cpuinfo flag -> kiln's name for it.
_X86_FLAGS = {
    "avx2": "avx2", "avx512f": "avx512", "avx512_vnni": "avx512-vnni", "avx_vnni": "avx-vnni",
    "avx512_bf16": "avx512-bf16", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8", "f16c": "f16c",
}
_ARM_FLAGS = {"asimddp": "dotprod", "i8mm": "i8mm", "bf16": "bf16", "sve": "sve"}


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    features: tuple[str, ...]
    logical_cores: int
    usable_cores: int  # affinity and cgroup quota applied: what kiln's threads can really use

    @property
    def has_vnni(self) -> bool:
        return bool({"avx512-vnni", "avx-vnni", "amx-int8"} & set(self.features))

    @property
    def has_bf16(self) -> bool:
        return bool({"avx512-bf16", "amx-bf16"} & set(self.features)) or (
            self.arch == "aarch64" and "bf16" in self.features)

    def to_dict(self) -> dict:
        return {**asdict(self), "vnni": self.has_vnni, "bf16": self.has_bf16}


@dataclass(frozen=True)
class Int8Scheme:
    """Weight/activation signedness for ONNX Runtime's int8 kernels on this CPU, and why."""

    weights_signed: bool
    activations_signed: bool
    reduce_range: bool
    reason: str


def int8_scheme(cpu: CpuInfo) -> Int8Scheme:
    """Pick signedness as ONNX Runtime's quantization guide advises for the instruction set."""
    if cpu.arch in ("aarch64", "arm64"):
        return Int8Scheme(True, True, False, "ARM64: signed int8 (S8S8) maps to the SDOT instructions")
    if cpu.has_vnni:
        return Int8Scheme(True, False, False, "VNNI: U8S8 runs on VPDPBUSD without saturation")
    if "avx2" in cpu.features:
        return Int8Scheme(True, False, True, "AVX2 without VNNI: U8S8 with 7-bit weights avoids VPMADDUBSW "
                          "saturation")
    return Int8Scheme(False, False, False, "no AVX2/VNNI: U8U8, the portable kernel")


def _cgroup_cores() -> float | None:
    quota = Path("/sys/fs/cgroup/cpu.max")
    try:
        limit, period = quota.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    arch = platform.machine().lower()
    model, flags = platform.processor() or arch, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "cpu model") and model in ("", arch):
                model = value.strip()
            elif key in ("flags", "features"):
                flags.update(value.split())
    except OSError:
        pass
    names = _ARM_FLAGS if arch in ("aarch64", "arm64") else _X86_FLAGS
    features = tuple(sorted({kiln_name for flag, kiln_name in names.items() if flag in flags}))
    logical = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    quota = _cgroup_cores()
    usable = max(1, min(affinity, int(quota) if quota else affinity))
    return CpuInfo(model=model, arch=arch, features=features, logical_cores=logical, usable_cores=usable)


# CPU classes, most capable first: the int8/bf16 kernels a runtime picks differ between them (AVX2's u8s8 with
# 7-bit weights, VNNI's VPDPBUSD, AMX tiles), so a variant validated on one class is not validated on another.
CPU_CLASSES = {"amx": {"amx-int8"}, "avx512-vnni": {"avx512-vnni"}, "avx-vnni": {"avx-vnni"},
               "avx512": {"avx512"}, "avx2": {"avx2"}}
BASELINE_CLASS = "baseline"  # none of the above: the architecture's portable kernels
CPU_CLASS_NAMES = (*CPU_CLASSES, BASELINE_CLASS)
# oneDNN's ONEDNN_MAX_CPU_ISA value for each class: the most instructions its kernels may use. OpenVINO's CPU plugin
# honours it (on the AMX Xeon, MiniLM's int8 IR ran its MatMuls as brgemm_avx512_amx_I8, capped to AVX2 as jit_gemm_I8
# with outputs moved by up to 1.36, capped to AVX512_CORE_VNNI as brgemm_avx512_I8); ONNX Runtime's MLAS has no cap.
ONEDNN_ISA = {"amx": "AVX512_CORE_AMX", "avx512-vnni": "AVX512_CORE_VNNI", "avx-vnni": "AVX2_VNNI",
              "avx512": "AVX512_CORE", "avx2": "AVX2", BASELINE_CLASS: "SSE41"}


def emulable_classes(cpu: CpuInfo) -> tuple[str, ...]:
    """The classes other than ``cpu``'s whose instructions it has all of (x86 only): oneDNN capped to one of them
    runs that class's kernels here."""
    if cpu.arch not in ("x86_64", "amd64", "AMD64"):
        return ()
    here, have = cpu_class(cpu.features), set(cpu.features)
    return tuple(c for c in CPU_CLASS_NAMES if c != here and CPU_CLASSES.get(c, set()) <= have)


def cpu_class(features: Sequence[str]) -> str:
    """The class of a CPU with ``features`` (CpuInfo.features): the first of CPU_CLASSES it has, else
    BASELINE_CLASS."""
    have = set(features)
    return next((name for name, needs in CPU_CLASSES.items() if needs <= have), BASELINE_CLASS)
