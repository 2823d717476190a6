"""Memory and time of one teacher-forced call (kiln.decoder.teacher) on a decoder's KV-cache graph, by how often the
heap is trimmed between steps.

The call is what validation runs for a decoder: a batch of rows of different lengths, a prefill, then one cached step
per position, each position's logits kept. It runs on a variant of a kiln optimize output (an ONNX graph or an
OpenVINO IR), with random token ids, in a fresh process per setting; a sampler thread reads the resident memory.

    python benchmarks/teacher_memory.py /tmp/gpt2keep/opt/openvino-fp32/model.xml [--rows 32] [--every 0,1,2,4,8]
        [--in-memory]

``--every 0`` never trims between steps (the call's own end still trims). Trimming is validation's setting, which
also writes the rows to a temporary file as they come; ``--in-memory`` keeps them in memory instead. Each line:
seconds, the logits kept, the peak resident memory above the engine's, and what stays after the call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def _rss(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


def _one(path: Path, rows: int, every: int, heads: int, layers: int, head_size: int, in_memory: bool) -> dict:
    import numpy as np

    import kiln.decoder.teacher as teacher
    from kiln.decoder.graph import CacheShape
    from kiln.engines import create_engine
    from kiln.engines.base import EngineOptions

    teacher.TRIM_EVERY = every
    engine = create_engine("onnxruntime" if path.suffix == ".onnx" else "openvino", path,
                           EngineOptions(intra_op_threads=2))
    forced = teacher.TeacherForced(engine, CacheShape(layers, heads, head_size), trim=every > 0)
    if in_memory:  # the rows in memory even where validation writes them to disk as they come (trim)
        forced.to_disk = False
    lengths = np.linspace(16, 128, rows).astype(int)
    ids = np.random.default_rng(0).integers(0, 50000, (rows, 128))
    mask = (np.arange(128)[None] < lengths[:, None]).astype(np.int64)
    base, peak = _rss(), [_rss()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _rss())

    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    kept = forced.run_rows({"input_ids": ids, "attention_mask": mask})
    seconds = time.perf_counter() - start
    stop.set()
    return {"every": every, "rows": rows, "seconds": round(seconds, 2),
            "logits_mib": sum(r.nbytes for r in kept) // 2**20, "engine_mib": base,
            "rows_on_disk": forced.to_disk,
            # The process's own peak (VmHWM) too: the sampler cannot run while a call holds the GIL.
            "peak_above_engine_mib": max(peak[0], _rss(), _rss("VmHWM")) - base, "after_call_mib": _rss() - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", type=Path)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--every", default="0,1,2,4,8", help="steps between heap trims; 0: never")
    parser.add_argument("--shape", default="12,12,64", help="layers,heads,head size of the graph's cache")
    parser.add_argument("--in-memory", action="store_true",
                        help="keep the rows in memory where validation writes them to disk (every > 0)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers, heads, head_size = (int(x) for x in args.shape.split(","))
    if args.worker is not None:
        print(json.dumps(_one(args.graph, args.rows, args.worker, heads, layers, head_size, args.in_memory)))
        return
    for every in (int(x) for x in args.every.split(",")):
        out = subprocess.run([sys.executable, __file__, str(args.graph), "--rows", str(args.rows), "--shape",
                              args.shape, "--worker", str(every), *(["--in-memory"] if args.in_memory else [])],
                             capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
