"""Every named choice kiln offers, defined once and used everywhere (CLI, manifest, registries)."""

from __future__ import annotations

from enum import Enum


class ExportFormat(str, Enum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"


class ExternalData(str, Enum):
    """Whether ONNX weights go to a side file. Protobuf cannot hold a model over 2 GB."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class Pooling(str, Enum):
    MEAN = "mean"
    CLS = "cls"
    MAX = "max"


class Aggregation(str, Enum):
    """Token-classification aggregation, as in the transformers pipeline."""

    NONE = "none"
    SIMPLE = "simple"
    FIRST = "first"
    AVERAGE = "average"
    MAX = "max"


class Precision(str, Enum):
    """Numeric precision of the torch engine; bf16/fp16 run under autocast with fp32 outputs."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class LogFormatName(str, Enum):
    """How kiln serve writes its log (kiln.log)."""

    TEXT = "text"
    JSON = "json"


def parse_choice(enum: type[Enum], value: str, flag: str):
    """Return ``enum(value)`` or raise a UsageError naming the flag and the allowed values."""
    from kiln.errors import UsageError

    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise UsageError(f"{flag} must be one of: {allowed} (got {value!r})") from None
