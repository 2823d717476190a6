"""kiln.system.memory: freed heap memory goes back to the operating system between build stages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kiln.system.memory import _libc

SCRIPT = """
import json
from kiln.system.memory import release_freed

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

blocks = [bytes(100_000) for _ in range(5000)]  # 100 KB each: under glibc's mmap threshold, so on the heap
allocated = rss_mib()
del blocks[:-1]  # the newest stays: the heap's top is in use, so only trimming inside the heap can give pages back
released = release_freed()
print(json.dumps({"allocated": allocated, "after": rss_mib(), "released": released}))
"""


@pytest.mark.skipif(_libc() is None, reason="needs glibc's malloc_trim")
def test_release_freed_gives_freed_heap_pages_back():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60)
    figures = json.loads(done.stdout)
    assert figures["released"] is True
    # ~480 MB were freed; without the trim glibc keeps them resident (measured: 381 MiB before and after the free).
    assert figures["after"] < figures["allocated"] - 250, figures
