"""Handing memory back to the operating system: freed heap pages between the stages of a long build, and the
resident pages of a weights file an engine has copied.

Python frees a model's tensors when its last reference goes, but glibc keeps freed heap pages for reuse: blocks
under its mmap threshold (which rises to 32 MB once large blocks are freed) stay resident, so a stage that freed
gigabytes still shows them in the process's resident memory, and the next stage's own allocations come on top.
``malloc_trim(0)`` returns what is free at the heap's top and every free page inside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=1)
def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only (not musl, macOS)


def release_freed() -> bool:
    """Collect unreachable objects, then give free heap pages back; False where the C library cannot."""
    gc.collect()
    return trim_heap()


@contextmanager
def live_objects_set_aside() -> Iterator[None]:
    """For the block's duration, the objects alive when it starts are out of the cyclic collector's sight, so each
    ``release_freed`` inside it scans only what the block made.

    A full collection visits every tracked object: after importing torch, transformers, ONNX Runtime, OpenVINO and
    NNCF that is ~270,000 (modules, classes, functions; none of them garbage), 0.2 s a collection on the 2-core
    Xeon, and kiln optimize collects between each of its stages (44 times for a tiny BERT's default variants: 11 s
    of its 53 s, cProfile). ``gc.freeze`` moves them to the permanent generation, where reference counting still
    frees them but no collection scans them; ``gc.unfreeze`` at the end gives them back to the collector, so a
    caller's own cyclic garbage is collected as before. A caller that froze objects itself keeps its choice: the
    block then changes nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()  # what is garbage now is collected, not frozen
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def trim_heap() -> bool:
    """Give free heap pages back, without a garbage collection (cheap enough to call between decoding steps);
    False where the C library cannot."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


# madvise(2) advice: reclaim these pages now (Linux 5.4+). Unlike MADV_DONTNEED it never changes what the mapping
# reads: a clean file page comes back from the page cache (or the disk) on its next read.
_MADV_PAGEOUT = 21


def _read_only_mappings(path: Path) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each read-only mapping of ``path`` in this process; none without /proc."""
    target, found, current = str(path.resolve()), [], None
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(maxsplit=5)  # a path may hold spaces
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header: addresses perms ...
            start, end = (int(x, 16) for x in fields[0].split("-"))
            readable_only = fields[1].startswith("r") and "w" not in fields[1]
            current = [start, end, 0] if readable_only and len(fields) > 5 and fields[5] == target else None
            if current is not None:
                found.append(current)
        elif current is not None and fields[0] == "Rss:":
            current[2] = int(fields[1]) * 1024
    return [tuple(m) for m in found]


def mapped_resident(path: Path) -> int:
    """Bytes of ``path`` resident in this process through its read-only mappings of it."""
    return sum(rss for _, _, rss in _read_only_mappings(path))


def page_out(path: Path) -> int:
    """Ask the kernel to drop this process's resident pages of a file it maps read-only; the bytes released.

    OpenVINO maps an IR's weights file and its CPU plugin copies the weights into its own layout at the first
    inference, after which the mapping is not read again, yet its pages stay in the process's resident memory
    (GPT-2 small in fp32: 474 MiB twice). Only a hint: 0 where the kernel or the C library cannot."""
    libc = _libc()
    mappings = _read_only_mappings(path)
    if libc is None or not mappings:
        return 0
    madvise = libc.madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    before = sum(rss for _, _, rss in mappings)
    for start, end, _ in mappings:
        madvise(start, end - start, _MADV_PAGEOUT)  # EINVAL on a kernel before 5.4: the pages simply stay
    return max(0, before - mapped_resident(path))


_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def resident_bytes() -> int:
    """This process's resident memory now (Linux's /proc/self/statm; 0 where there is none): what the kernel's OOM
    killer weighs. Read in microseconds, so a server may ask per request."""
    try:
        resident = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident * _page_size()


@lru_cache(maxsize=1)
def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


def cgroup_memory_limit() -> int | None:
    """The container's memory limit (cgroup v2's memory.max, v1's limit_in_bytes); None where none is set."""
    for path in _CGROUP_LIMITS:
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:  # v1 writes a huge number for "no limit", v2 writes "max"
            return int(raw)
    return None


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def parse_bytes(value: str, name: str) -> int:
    """``"8GiB"``, ``"512MB"``, ``"2.5G"`` or a number of bytes, as bytes; a UsageError naming ``name`` otherwise."""
    import re

    from kiln.errors import UsageError

    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
    if not found or found.group(2).lower() not in _UNITS or float(found.group(1)) <= 0:
        raise UsageError(f"{name} must be a size such as 8GiB, 512MB or a number of bytes (got {value!r})")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])
