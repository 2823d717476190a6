"""Each row of a batch run on its own, trimmed to its own length: batch-invariant answers from any engine.

Dynamic int8 computes its activation scale per tensor, i.e. over the whole batch, so an input's answer moves with
whatever shares its batch (kiln.validation.batching). Run alone, every input gets a scale of its own: the answer no
longer depends on the batch, and no padding is computed. On a 2-core AMD EPYC (AVX-512 VNNI) MiniLM's dynamic int8
ran faster this way (106 against 91.6 texts/s in sorted batches of 32, benchmarks/alone_cost.py); on CPUs where a
batch's GEMMs pay more, it may cost: kiln optimize times it like any variant.
"""

from __future__ import annotations

import numpy as np

from kiln.engines.base import Engine
from kiln.errors import UsageError


class RowByRow:
    """Wraps an engine whose ``sequence_outputs`` are known (their axis 1 is the token axis, padded back)."""

    def __init__(self, engine: Engine) -> None:
        if not hasattr(engine, "sequence_outputs"):
            raise UsageError(f"rows alone needs an engine that declares its per-token outputs; {engine.name} does "
                             "not")
        self.engine = engine
        self.name, self.providers = engine.name, engine.providers
        self.input_names, self.output_names = engine.input_names, engine.output_names
        self.is_padded, self.pad_multiple = True, 1
        self.sequence_outputs: frozenset[str] = engine.sequence_outputs  # type: ignore[attr-defined]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mask = inputs["attention_mask"]
        rows, width = mask.shape
        parts = []
        for i in range(rows):
            n = int(mask[i].sum())  # kiln pads on the right: the row's real tokens come first
            feed = {k: (v[i : i + 1, :n] if v.ndim >= 2 and v.shape[1] == width else v[i : i + 1])
                    for k, v in inputs.items()}
            parts.append(self.engine.run(feed))
        out = {}
        for name in parts[0]:
            if name in self.sequence_outputs:  # pad each row's per-token output back to the batch's width
                shaped = []
                for part in parts:
                    value = part[name]
                    pad = [(0, 0)] * value.ndim
                    pad[1] = (0, width - value.shape[1])
                    shaped.append(np.pad(value, pad))
                out[name] = np.concatenate(shaped)
            else:
                out[name] = np.concatenate([part[name] for part in parts])
        return out

    def warmup(self) -> None:
        self.engine.warmup()
