"""Issue 31: a prefill and 15 single-token steps on kiln's two decoder step graphs, in one process, alternated.

    python benchmarks/experiments/fused_decoder_steps/run.py ARTIFACT   # built with --variants onnx-fp32,onnx-fused

Prompts of random token ids: 4 x 128, 4 rows of 100/128/60/20 (left-padded), 1 x 128 and 4 x 512. The prefill asks for
the last position's logits only (``last=True``: the fused graph runs its head there alone; the export computes all).
Medians of 3 rounds, milliseconds.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np


def main(artifact: str) -> None:
    import kiln
    from kiln.decoder.graph import positions
    from kiln.decoder.steps import empty_past

    graphs = {name: kiln.load(artifact, variant=name, threads=2).engine.steps for name in ("onnx-fp32", "onnx-fused")}
    rng = np.random.default_rng(0)

    def prefill_then_steps(steps, lengths: list[int], new: int = 15) -> tuple[float, float]:
        width, batch = max(lengths), len(lengths)
        ids = rng.integers(0, 50257, (batch, width))
        mask = np.zeros((batch, width), np.int64)
        for row, length in enumerate(lengths):
            mask[row, width - length:] = 1
        begin = time.perf_counter()
        logits, past = steps.step(ids, mask, positions(mask, width), empty_past(steps.shape, batch), last=True)
        prefilled = time.perf_counter()
        for _ in range(new):
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
            logits, past = steps.step(logits[:, -1].argmax(-1)[:, None], mask, positions(mask, 1), past)
        return prefilled - begin, time.perf_counter() - prefilled

    for lengths in ([128] * 4, [100, 128, 60, 20], [128], [512] * 4):
        runs: dict[str, list[tuple[float, float]]] = {}
        for _ in range(3):
            for name, steps in graphs.items():
                runs.setdefault(name, []).append(prefill_then_steps(steps, lengths))
        cells = {name: f"prefill {1000 * statistics.median(a for a, _ in r):.1f} ms, 15 steps "
                       f"{1000 * statistics.median(b for _, b in r):.1f} ms" for name, r in runs.items()}
        print(lengths, cells, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
