"""Packed sequences against padded batches through OpenVINO, the bundled MiniLM (issue 27): tokens run, speed, and
agreement of the mean-pooled vectors.

Padded: length-sorted batches of 8 padded to a multiple of 16 (kiln.load's split-plan batches). Packed: the same
sorted texts laid end to end into rows of at most ROW tokens (first fit), each text with its own position ids and a
block-diagonal attention mask (a 4-D additive mask input), 2 rows per call. Both graphs come from the same PyTorch
model through openvino.convert_model, run at the fp32 precision hint on one request of 2 threads; 3 alternated
rounds over the peers' 1,024 held-out texts.

``--window N``: as a server sees them instead: the texts in a random order, taken N at a time, each window sorted
and cut on its own, padded by kiln serve's least-cost partition (``kiln.serve.batcher.partition``, default limits)
and packed into rows — the batcher's view of the requests waiting, without its arrival order.

    python benchmarks/experiments/packed_sequences/run.py [--row 256] [--window 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import openvino as ov
import torch
from transformers import AutoModel, AutoTokenizer

from kiln.data.workloads import held_out_mix
from kiln.model.source import bundled_model_dir

MASKED = -1e9  # additive mask value: a position a query must not attend to


def pad16(n: int) -> int:
    return -(-n // 16) * 16


class Padded(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Packed(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                         token_type_ids=torch.zeros_like(input_ids)).last_hidden_state


def windows(ids: list[list[int]], order: list[int], window: int | None) -> list[list[int]]:
    """The whole sorted order as one window, or a random order cut into sorted windows of ``window`` texts."""
    if window is None:
        return [order]
    shuffled = list(order)
    np.random.default_rng(0).shuffle(shuffled)
    return [sorted(shuffled[s:s + window], key=lambda i: len(ids[i])) for s in range(0, len(shuffled), window)]


def padded_batches(ids: list[list[int]], order: list[int], size: int = 8, served: bool = False) -> list[tuple]:
    """Batches of ``size`` in ``order``, or where ``served``, kiln serve's least-cost groups of it."""
    from kiln.serve.batcher import BatchLimits, partition

    cuts = partition([len(ids[i]) for i in order], BatchLimits()) if served else \
        [(s, min(s + size, len(order))) for s in range(0, len(order), size)]
    batches = []
    for start, end in cuts:
        group = order[start:end]
        width = pad16(max(len(ids[i]) for i in group))
        tokens, mask = np.zeros((len(group), width), np.int64), np.zeros((len(group), width), np.int64)
        for row, i in enumerate(group):
            tokens[row, :len(ids[i])], mask[row, :len(ids[i])] = ids[i], 1
        batches.append((group, tokens, mask))
    return batches


def packed_batches(ids: list[list[int]], order: list[int], row_tokens: int, rows_per_call: int = 2) -> list[tuple]:
    rows, current, used = [], [], 0
    for i in order:  # first fit in sorted order: texts of like length share a row
        if current and used + len(ids[i]) > row_tokens:
            rows.append(current)
            current, used = [], 0
        current.append(i)
        used += len(ids[i])
    rows.append(current)
    batches = []
    for start in range(0, len(rows), rows_per_call):
        group = rows[start:start + rows_per_call]
        width = pad16(max(sum(len(ids[i]) for i in row) for row in group))
        tokens = np.zeros((len(group), width), np.int64)
        positions = np.zeros_like(tokens)
        mask = np.full((len(group), 1, width, width), MASKED, np.float32)
        spans = []
        for r, row in enumerate(group):
            offset = 0
            for i in row:
                n = len(ids[i])
                tokens[r, offset:offset + n], positions[r, offset:offset + n] = ids[i], np.arange(n)
                mask[r, 0, offset:offset + n, offset:offset + n] = 0.0  # each text sees only itself
                spans.append((i, r, offset, n))
                offset += n
            mask[r, 0, offset:, :] = 0.0  # the row's padding queries see everything (no NaN); never read
        batches.append((spans, tokens, positions, mask))
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row", type=int, default=256, help="most tokens in one packed row")
    parser.add_argument("--window", type=int, default=None, help="texts per window, as a server batches them")
    args = parser.parse_args()
    path = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    bert = AutoModel.from_pretrained(path, attn_implementation="eager").eval().requires_grad_(False)
    texts = held_out_mix(1024, lambda t: len(tokenizer(t)["input_ids"]))
    ids = [tokenizer(t)["input_ids"] for t in texts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
    example = torch.ones(2, 16, dtype=torch.long)
    with torch.no_grad():
        padded = core.compile_model(ov.convert_model(Padded(bert), example_input=(example, example)), "CPU", config)
        packed = core.compile_model(ov.convert_model(Packed(bert), example_input=(
            example[:1], example[:1], torch.zeros(1, 1, 16, 16))), "CPU", config)
    parts = windows(ids, order, args.window)
    by_padding = [b for part in parts for b in padded_batches(ids, part, served=args.window is not None)]
    by_packing = [b for part in parts for b in packed_batches(ids, part, args.row)]
    print(f"tokens run: real {sum(len(x) for x in ids)}, padded {len(by_padding)} batches "
          f"{sum(t.size for _, t, _ in by_padding)}, packed rows of {args.row} "
          f"{sum(t.size for _, t, _, _ in by_packing)} ({sum(t.shape[0] for _, t, _, _ in by_packing)} rows)")
    padded_request, packed_request = padded.create_infer_request(), packed.create_infer_request()

    def run_padded() -> dict[int, np.ndarray]:
        vectors = {}
        for group, tokens, mask in by_padding:
            states = padded_request.infer([tokens, mask])[0]
            for row, i in enumerate(group):
                vectors[i] = states[row, :len(ids[i])].mean(0)
        return vectors

    def run_packed() -> dict[int, np.ndarray]:
        vectors = {}
        for spans, tokens, positions, mask in by_packing:
            states = packed_request.infer([tokens, positions, mask])[0]
            for i, row, offset, n in spans:
                vectors[i] = states[row, offset:offset + n].mean(0)
        return vectors

    a, b = run_padded(), run_packed()
    cosine = [float(a[i] @ b[i] / np.linalg.norm(a[i]) / np.linalg.norm(b[i])) for i in range(len(ids))]
    print(f"cosine of the mean-pooled vectors, packed against padded: min {min(cosine):.6f}")
    rates: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(3):
        for name, run in (("padded", run_padded), ("packed", run_packed)):
            start = time.perf_counter()
            run()
            rates[name].append(len(ids) / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name}: median {statistics.median(values):.1f} seq/s, rounds {', '.join(f'{v:.1f}' for v in values)}")


if __name__ == "__main__":
    main()
