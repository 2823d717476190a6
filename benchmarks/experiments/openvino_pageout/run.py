"""Resident memory of an OpenVINO artifact served offline, with and without kiln handing back its mapped weights.

    python benchmarks/experiments/openvino_pageout/run.py ARTIFACT {on,off}

Loads ARTIFACT's best variant with `kiln.load` (off: kiln.system.memory.page_out replaced by a no-op), predicts 256
of the peers' held-out texts once to warm up and three times timed, and prints texts/s and the resident memory.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kiln
import kiln.engines.openvino
from kiln.data.workloads import held_out_mix


def main() -> None:
    artifact, mode = sys.argv[1], sys.argv[2]
    if mode == "off":
        kiln.engines.openvino.page_out = lambda path: 0
    predictor = kiln.load(artifact)
    texts = held_out_mix(256, predictor.encoder.token_count)
    predictor.predict(texts)
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        predictor.predict(texts)
        rates.append(round(len(texts) / (time.perf_counter() - start), 1))
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    mib = {k: int(fields[k].split()[0]) // 1024 for k in ("VmRSS", "RssAnon", "RssFile")}
    print(f"page_out {mode}: texts/s {rates}; resident {mib['VmRSS']} MiB (anonymous {mib['RssAnon']}, "
          f"file-backed {mib['RssFile']})")


if __name__ == "__main__":
    main()
