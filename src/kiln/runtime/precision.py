"""Output precision of embeddings: the vectors users store, quantized as sentence-transformers' ``quantize_embeddings``
does it, with ranges every server and job shares.

int8/uint8 cut each dimension's [min, max] into 256 buckets; kiln takes those ranges from the artifact's output
calibration (the fp32 reference's vectors of the calibration texts, stored by kiln optimize), never from the
vectors being quantized, so a text gets the same bytes alone, in a batch, in kiln serve or in kiln embed. With
Matryoshka ``dimensions`` the calibration vectors are cut and re-normalised the same way first (truncate, then
re-normalise, then quantize). binary/ubinary need no ranges: one bit per dimension (> 0), packed 8 to a byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.choices import Choice, parse_choice
from kiln.errors import UsageError

CALIBRATION_FILE = "output_calibration.npy"  # in the artifact, beside manifest.json


class Precision(Choice):
    FLOAT32 = "float32"
    INT8 = "int8"
    UINT8 = "uint8"
    BINARY = "binary"  # packed bits, as int8 (each byte minus 128), sentence-transformers' "binary"
    UBINARY = "ubinary"  # packed bits as uint8

    @property
    def calibrated(self) -> bool:
        """Whether it needs per-dimension ranges."""
        return self in (Precision.INT8, Precision.UINT8)

    @property
    def bits(self) -> Precision:
        """The precision whose bits these are: uint8 stores int8's buckets shifted, ubinary binary's bits unshifted,
        so one measurement judges both."""
        return {Precision.UINT8: Precision.INT8, Precision.UBINARY: Precision.BINARY}.get(self, self)

    def bytes_per_vector(self, dimensions: int) -> int:
        return {Precision.FLOAT32: 4 * dimensions, Precision.INT8: dimensions, Precision.UINT8: dimensions}.get(
            self, (dimensions + 7) // 8)


def parse_precision(value: str | Precision, flag: str = "precision") -> Precision:
    """``value`` as a Precision, or the UsageError naming ``flag`` and the allowed values (kiln.choices)."""
    return parse_choice(Precision, value, flag)


def ranges_of(calibration: np.ndarray, dimensions: int | None = None, normalize: bool = False) -> np.ndarray:
    """(2, d) per-dimension min and max of the calibration vectors, made as the vectors being quantized were:
    cut to ``dimensions``, then re-normalised when ``normalize``."""
    vectors = calibration.astype(np.float32)
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    return np.vstack((vectors.min(axis=0), vectors.max(axis=0)))


def ranges_for(precision: Precision, calibration: np.ndarray | None, flag: str = "precision",
               dimensions: int | None = None, normalize: bool = False) -> np.ndarray | None:
    """int8/uint8 ranges from the artifact's calibration vectors (see :func:`ranges_of`); None for the precisions
    that need none. A UsageError naming ``flag`` when the artifact has no calibration (kiln export stores none)."""
    if not precision.calibrated:
        return None
    if calibration is None:
        raise UsageError(f"{flag} {precision.value} takes its ranges from the artifact's output calibration, which "
                         "this artifact has none of (kiln optimize stores it; kiln export does not); float32, binary "
                         "and ubinary need none")
    return ranges_of(calibration, dimensions, normalize)


def dequantize(stored: np.ndarray, precision: Precision, ranges: np.ndarray | None = None,
               dimensions: int | None = None) -> np.ndarray:
    """Float vectors ([n, d]) back from stored ones, for searching them: int8/uint8 each bucket's middle (what a
    scalar-quantizer index such as faiss's SQ8 decodes), binary/ubinary -1/+1 per bit (the first ``dimensions``:
    packing pads to whole bytes); then L2-normalised."""
    if precision is Precision.FLOAT32:
        decoded = stored.astype(np.float32)
    elif precision.calibrated:
        buckets = stored.astype(np.float32) + (128 if precision is Precision.INT8 else 0)
        decoded = (buckets + 0.5) * ((ranges[1] - ranges[0]) / 255) + ranges[0]
    else:
        raw = stored.astype(np.int16) + 128 if precision is Precision.BINARY else stored
        decoded = np.unpackbits(raw.astype(np.uint8), axis=-1, count=dimensions).astype(np.float32) * 2 - 1
    return decoded / np.clip(np.linalg.norm(decoded, axis=-1, keepdims=True), 1e-12, None)


def quantize(vectors: np.ndarray, precision: Precision, ranges: np.ndarray | None = None) -> np.ndarray:
    """``vectors`` ([n, d] or [d] float) at ``precision``: bit for bit what sentence-transformers'
    ``quantize_embeddings(vectors, precision, ranges=ranges)`` returns."""
    if precision is Precision.FLOAT32:
        return vectors.astype(np.float32)
    if precision.calibrated:
        if ranges is None:
            raise UsageError(f"precision {precision.value} needs the artifact's output calibration (kiln optimize "
                             "stores it); binary and ubinary need none")
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision is Precision.UINT8 else (buckets - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)
    return packed if precision is Precision.UBINARY else (packed - 128).astype(np.int8)


def refuse_rejected(stored_vectors: Sequence[Any], dimensions: int | None, precision: Precision) -> None:
    """A (size, precision) that kiln optimize measured for retrieval and rejected (``BuildRecord.stored_vectors``)
    is a UsageError quoting its figure; unmeasured ones pass (nothing to hold them to)."""
    rows = [r for r in stored_vectors if r.dimensions == dimensions and Precision(r.precision).bits is precision.bits]
    if rows and not any(r.accepted for r in rows):
        best = max(rows, key=lambda r: r.recall_at_10)
        accepted = ", ".join(dict.fromkeys(f"{r.dimensions}/{r.precision}" for r in stored_vectors if r.accepted))
        raise UsageError(f"dimensions {dimensions} at precision {precision.value} lost too much retrieval quality "
                         f"when kiln optimize measured it (recall@10 {best.recall_at_10:.3f} with {best.search}, "
                         f"below its tolerance); accepted: {accepted}")
