"""kiln.system.memory: freed heap memory goes back to the operating system between build stages, and a weights file
an engine has copied stops counting in its resident memory."""

from __future__ import annotations

import json
import mmap
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kiln.system.memory import _libc, mapped_resident, page_out

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


def _pageable(path: Path) -> bool:
    """MADV_PAGEOUT needs Linux 5.4+, and a file on a disk: a tmpfs page has nowhere to go without swap."""
    release = tuple(int(x) for x in platform.release().split(".")[:2] if x.isdigit())
    table = Path("/proc/mounts")
    mounts = [line.split() for line in table.read_text().splitlines()] if table.exists() else []
    best = max((m for m in mounts if str(path).startswith(m[1].rstrip("/") + "/")), key=lambda m: len(m[1]),
               default=None)
    return sys.platform == "linux" and release >= (5, 4) and best is not None and best[2] not in ("tmpfs", "ramfs")


def test_page_out_drops_a_read_only_mapping_and_keeps_its_bytes(tmp_path):
    data = os.urandom(8 * 2**20)
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    if _libc() is None or not _pageable(path):
        pytest.skip("needs glibc, Linux 5.4+ and a disk-backed temporary directory")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert mapped[:] == data  # every page read: resident
        resident = mapped_resident(path)
        assert resident >= 7 * 2**20
        released = page_out(path)
        assert released >= 6 * 2**20 and mapped_resident(path) <= resident - released
        assert mapped[:] == data  # read back from the page cache or the disk, unchanged
    assert page_out(tmp_path / "not-mapped.bin") == 0


def test_openvino_engine_hands_back_its_mapped_weights_after_the_first_call(tiny_artifact, tmp_path):
    from kiln.engines.openvino import OpenVinoEngine
    from kiln.optimizing.openvino_passes import convert

    ir = tmp_path / "ir" / "model.xml"
    convert(tiny_artifact / "onnx-fp32" / "model.onnx", ir)
    if _libc() is None or not _pageable(ir):
        pytest.skip("needs glibc, Linux 5.4+ and a disk-backed temporary directory")
    engine = OpenVinoEngine(ir)
    # ids within the tiny model's vocabulary (500): the engine refuses others
    feed = {"input_ids": np.array([[101, 223, 203, 102]]), "attention_mask": np.ones((1, 4), dtype=np.int64),
            "token_type_ids": np.zeros((1, 4), dtype=np.int64)}
    feed = {n: feed[n] for n in engine.input_names}
    before = mapped_resident(ir.with_suffix(".bin"))
    assert before > 0  # read while compiling
    first = engine.run(feed)
    # The CPU plugin copied the weights; the mapping is handed back. A fresh-clone CI run once found 8 pages (32 KiB)
    # still resident, so a few pages may stay or come back; the rest must go.
    after = mapped_resident(ir.with_suffix(".bin"))
    assert after < before and after <= 64 * 1024, (before, after)
    again = engine.run(feed)  # the same answer from the plugin's own copy
    assert all(np.array_equal(first[n], again[n]) for n in first)
    fresh = OpenVinoEngine(ir).run(feed)
    assert all(np.array_equal(first[n], fresh[n]) for n in first)
