"""Where an OpenVINO variant's time goes, by operation (issue 27, point 1): the CPU plugin's own per-node counters
(PERF_COUNT) over calls of one [batch, length] shape on one single-thread stream, summed by node and kernel type.

    python benchmarks/experiments/openvino_profile/run.py kiln-out/openvino-int8-static [--batch 8 --length 128]

The counters slow each call a little (they time every node); the shares are what this is for, not the total.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", help="a variant directory holding model.xml")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    import openvino as ov

    compiled = ov.Core().compile_model(str(Path(args.variant) / "model.xml"), "CPU", {
        "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True})
    request = compiled.create_infer_request()
    feed = {i.get_any_name(): np.ones((args.batch, args.length), np.int64) for i in compiled.inputs}
    for _ in range(3):
        request.infer(feed)  # warm-up: kernels built for the shape
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    begin = time.perf_counter()
    for _ in range(args.calls):
        request.infer(feed)
        for node in request.profiling_info:
            if node.status == node.Status.EXECUTED:
                totals[(node.node_type, node.exec_type)] += node.real_time.total_seconds()
    wall = (time.perf_counter() - begin) / args.calls
    counted = sum(totals.values())
    print(f"{args.batch} x {args.length} tokens, one thread: {1000 * wall:.1f} ms a call (counters on), "
          f"{1000 * counted / args.calls:.1f} ms of it in nodes")
    for (kind, kernel), seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        if seconds / counted >= 0.002:
            print(f"  {100 * seconds / counted:5.1f}%  {1000 * seconds / args.calls:7.2f} ms  {kind} ({kernel})")


if __name__ == "__main__":
    main()
