"""Handing freed memory back to the operating system between the stages of a long build.

Python frees a model's tensors when its last reference goes, but glibc keeps freed heap pages for reuse: blocks
under its mmap threshold (which rises to 32 MB once large blocks are freed) stay resident, so a stage that freed
gigabytes still shows them in the process's resident memory, and the next stage's own allocations come on top.
``malloc_trim(0)`` returns what is free at the heap's top and every free page inside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import lru_cache
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


def trim_heap() -> bool:
    """Give free heap pages back, without a garbage collection (cheap enough to call between decoding steps);
    False where the C library cannot."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
