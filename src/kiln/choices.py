"""Every named choice kiln offers, defined once and used everywhere (CLI, manifest, registries)."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound=Enum)


class Choice(str, Enum):
    """A named choice: compares equal to its value, and prints as it (``f"{Target.CPU}"`` is ``cpu``)."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__  # the value, as a plain string would format

    @classmethod
    def parse_list(cls, value: str, flag: str) -> tuple[Choice, ...]:
        """``"a,b"`` as (A, B), or a UsageError naming ``flag`` and the allowed values."""
        from kiln.errors import UsageError

        parts = [v.strip() for v in value.split(",") if v.strip()]
        wrong = [v for v in parts if v not in {str(m.value) for m in cls}]
        if wrong or not parts:
            raise UsageError(f"{flag} takes comma-separated values of {names(cls)} (got {value!r})")
        return tuple(dict.fromkeys(cls(v) for v in parts))


def names(enum: type[Enum]) -> str:
    """``a, b, c``: the values of ``enum``, for help texts and error messages."""
    return ", ".join(str(m.value) for m in enum)


class ExportFormat(Choice):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"
    ONNX_FUSED = "onnx-fused"  # a decoder's step graph written by kiln (kiln.exporting.fused_decoder)


class ExternalData(Choice):
    """Whether ONNX weights go to a side file. Protobuf cannot hold a model over 2 GB."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class Pooling(Choice):
    MEAN = "mean"
    CLS = "cls"
    MAX = "max"
    LASTTOKEN = "lasttoken"  # the last real token's state (decoder-style embedders: Qwen3-Embedding, gte-Qwen2)


class Similarity(Choice):
    """sentence-transformers' similarity functions (``similarity_fn_name``); kiln.runtime.similarity computes them."""

    COSINE = "cosine"
    DOT = "dot"
    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"


class Aggregation(Choice):
    """Token-classification aggregation, as in the transformers pipeline."""

    NONE = "none"
    SIMPLE = "simple"
    FIRST = "first"
    AVERAGE = "average"
    MAX = "max"


class Precision(Choice):
    """Numeric precision of the torch engine; bf16/fp16 run under autocast with fp32 outputs."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Device(Choice):
    """Where an engine (or a Triton model step) runs. One vocabulary for kiln optimize's timing, kiln.load,
    kiln bench and kiln triton."""

    CPU = "cpu"
    CUDA = "cuda"  # a CUDA GPU: ONNX Runtime's CUDA provider with IOBinding, torch on cuda, Triton KIND_GPU
    TENSORRT = "tensorrt"  # a CUDA GPU through TensorRT (ONNX Runtime's provider; Triton's fp16 accelerator)


class Target(Choice):
    """What kiln optimize builds for: the CPU variants (int8, OpenVINO, bf16) or the GPU ones (fp16)."""

    CPU = "cpu"
    CUDA = "cuda"


class CalibrationMethod(Choice):
    """How static int8 activation ranges are calibrated (ONNX Runtime's calibrators)."""

    MINMAX = "minmax"  # fast, outlier-sensitive
    ENTROPY = "entropy"  # clips outliers; slower to calibrate
    PERCENTILE = "percentile"


class TruncationSide(Choice):
    """Which end of an over-long input is cut (TEI's truncation_direction)."""

    RIGHT = "right"  # the end: the default everywhere, transformers' and sentence-transformers' too
    LEFT = "left"  # the start: the text's last tokens are kept (a conversation's latest turns)


class PruneScope(Choice):
    GLOBAL = "global"  # rank heads and neurons across layers
    LAYER = "layer"  # remove the same share in every layer


class VariantName(Choice):
    """Every variant kiln optimize can build; kiln.optimizing.variants.VARIANTS has a builder for each."""

    ONNX_FP32 = "onnx-fp32"
    ONNX_FUSED = "onnx-fused"
    ONNX_FUSED_GELU_APPROX = "onnx-fused-gelu-approx"
    ONNX_INT8_DYNAMIC = "onnx-int8-dynamic"
    ONNX_INT8_DYNAMIC_ROWS = "onnx-int8-dynamic-rows"  # each input run alone: batch-invariant dynamic int8
    ONNX_INT8_STATIC = "onnx-int8-static"
    ONNX_INT4_WEIGHTS = "onnx-int4-weights"  # a decoder's fused graph with 4-bit weights (MatMulNBits)
    OPENVINO_FP32 = "openvino-fp32"
    OPENVINO_BF16 = "openvino-bf16"
    OPENVINO_INT8_STATIC = "openvino-int8-static"
    OPENVINO_INT8_WEIGHTS = "openvino-int8-weights"
    OPENVINO_INT4_WEIGHTS = "openvino-int4-weights"  # a decoder's IR with NNCF's 4-bit weights
    ONNX_FP16 = "onnx-fp16"
    TORCHSCRIPT = "torchscript"
    TORCH_BF16 = "torch-bf16"
    TORCH_FP16 = "torch-fp16"
    TORCH_INT8_DYNAMIC = "torch-int8-dynamic"


class Scheduling(Choice):
    """How a task's requests are run, and so which scheduler serves them and how kiln bench times them."""

    BATCH = "batch"  # one forward pass per input; requests grouped into length-sorted dynamic batches
    DECODE = "decode"  # token by token on a KV cache; sequences join and leave a running batch (continuous)


class ShadowPolicy(Choice):
    """What kiln serve does when live agreement (--shadow-rate) falls below the artifact's gate."""

    LOG = "log"  # log it, and log when it recovers
    UNREADY = "unready"  # also answer /ready with 503 until it recovers


class WireProtocol(Choice):
    """An inference API: what kiln serve speaks (--protocols) and how kiln audit asks a deployment for embeddings
    (and, for rerankers, scores)."""

    # POST /v1/embeddings {"input": [...], "model": M} -> {"data": [{"embedding": [...]}]}; rerank: Cohere's
    # POST /rerank {"query", "documents"} -> {"results": [{"index", "relevance_score"}]} (Infinity, vLLM)
    OPENAI = "openai"
    # POST /embed {"inputs": [...]} -> [[...], ...]; POST /rerank {"query", "texts"} -> [{"index", "score"}]
    # (Hugging Face text-embeddings-inference)
    TEI = "tei"
    # POST /kiln/embed -> {"embeddings": [[...], ...]}; POST /kiln/rerank -> {"results": [{"index", "score"}]}
    KILN = "kiln"

    # POST /v2/models/{M}/infer with BYTES tensors TEXT (and QUERY) -> EMBEDDING / SCORE (KServe, Triton)
    V2 = "v2"
    # POST /v1/rerank, /v2/rerank {"query", "documents"} -> {"id", "results": [{"index", "relevance_score"}], "meta"}
    # (Cohere's rerank API, as its SDK's Client and ClientV2 call it)
    COHERE = "cohere"


# Where kiln serve mounts its own routes (kiln's bodies: the model, truncation, chunks, precisions): always under this
# prefix, and at their bare path too where no other served API defines that path (TEI's /embed, /rerank,
# /embed_sparse, /info answer TEI's bodies, so a TEI client works by a change of URL).
KILN_PREFIX = "/kiln"


class LogFormatName(Choice):
    """How kiln serve writes its log (kiln.log)."""

    TEXT = "text"
    JSON = "json"


def parse_choice(enum: type[E], value: str | E, flag: str) -> E:
    """Return ``enum(value)`` or raise a UsageError naming the flag and the allowed values."""
    from kiln.errors import UsageError

    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise UsageError(f"{flag} must be one of: {allowed} (got {value!r})") from None


class Batching(Choice):
    """How a served variant's inputs may be grouped."""

    # length-sorted batches of up to the batch size (kiln.runtime.batch_plan), padded to the engine's multiple
    # (offline path)
    SORTED = "sorted"
    MIXED = "mixed"  # arrival order: mixed lengths in one batch, padded to the longest (a busy server)
    ALONE = "alone"  # batch of one, no padding (an idle server)
    # Sorted batches spread over two engine sessions of one thread each, run side by side: the plan kiln bench
    # picks when sessions x threads beats one wide session (OpenVINO streams, ORT sessions). Fewer threads may
    # change a kernel's reduction order, so a text's answer could depend on which plan serves it.
    SESSIONS = "sessions"
