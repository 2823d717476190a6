"""feature-extraction on the wire: POST /embed, the OpenAI-compatible POST /v1/embeddings and TEI's /embed."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

import kiln.tasks.wire.tei as tei
from kiln.choices import WireProtocol
from kiln.runtime.features import Prepared
from kiln.tasks.feature_extraction.task import Chunked, FeatureExtraction
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import (
    ChunkingModel,
    Count,
    FormField,
    NonBlank,
    RequestBody,
    ResponseModel,
    Route,
    Texts,
    TextsOrIds,
    listify,
    texts_or_ids,
)

DIMENSIONS_HELP = ("Keep the first `dimensions` values of each embedding (Matryoshka), re-normalised when the "
                   "model normalises; at most the model's size (422 above it).")
PRECISION_HELP = ("The vectors' precision, as sentence-transformers' quantize_embeddings makes it (after "
                  "`dimensions`): int8/uint8 per-dimension buckets from the artifact's calibration (422 when it has "
                  "none), binary/ubinary one bit per dimension packed 8 to a byte (int8 minus 128 / uint8).")
PROMPT_NAME_HELP = ("One of the model's prompts (its config_sentence_transformers.json), put before each input as "
                    "sentence-transformers does; default: the model's default prompt, if it names one. A name the "
                    "model does not define is a 422 listing those it has.")
PrecisionName = Literal["float32", "int8", "uint8", "binary", "ubinary"]


class EmbedChunking(ChunkingModel):
    mode: Literal["mean", "windows"] = Field("mean", description="mean: one embedding per input, the mean of its "
                                             "windows' (re-normalised when the model normalises); windows: also "
                                             "every window's embedding with its character span (in `chunks`).")


class EmbedRequest(RequestBody):
    inputs: Texts = Field(description="A text or a list of texts.")
    dimensions: Count | None = Field(None, description=DIMENSIONS_HELP)
    precision: PrecisionName = Field("float32", description=PRECISION_HELP)
    chunking: EmbedChunking | None = Field(None, description="Embed inputs longer than a window as overlapping "
                                           "token windows instead of truncating them.")
    prompt_name: NonBlank | None = Field(None, description=PROMPT_NAME_HELP)
    prompt: str | None = Field(None, description="A text put before each input instead of a named prompt.")

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions, "chunking": self.chunking, "precision": self.precision,
                "prompt_name": self.prompt_name, "prompt": self.prompt}


class WindowModel(ResponseModel):
    start: int = Field(description="Character offset of the window's first token in the input.")
    end: int
    embedding: list[float]


class EmbedResponse(ResponseModel):
    model: str
    embeddings: list[list[float]]
    truncated: list[bool] = Field(description="Per input: whether it was cut to the model's maximum length.")
    chunks: list[list[WindowModel]] | None = Field(None, description="Per input, its windows (chunking mode "
                                                   "windows only).")


class OpenAIEmbeddingRequest(RequestBody):
    """The OpenAI embeddings API body."""

    input: TextsOrIds = Field(
        description="A text, a list of texts, a text as token ids of the model's vocabulary, or a list of those "
                    "(what LangChain's OpenAIEmbeddings sends by default; the ids are read as text-embeddings-"
                    "inference reads them: special tokens where the caller put them, none added).")
    model: str  # type: ignore[assignment]  # OpenAI clients always name one
    encoding_format: Literal["float", "base64"] = Field("float", description="float: lists of numbers; base64: "
                                                        "each vector's bytes (float32 little-endian, or the "
                                                        "precision's one byte per value) in base64, as OpenAI's.")
    dimensions: Count | None = Field(None, description=DIMENSIONS_HELP)
    precision: PrecisionName = Field("float32", description=f"kiln's extension. {PRECISION_HELP}")
    user: NonBlank | None = None
    truncate: bool = True

    def items(self) -> list[Any]:
        return texts_or_ids(self.input)

    def options(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions, "precision": self.precision}


class OpenAIEmbedding(ResponseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class OpenAIUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(ResponseModel):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


def _embed(body: EmbedRequest, model: str, prepared: Prepared, results: list[Any]) -> dict[str, Any]:
    if results and isinstance(results[0], Chunked):
        return {"model": model, "embeddings": np.stack([r.embedding for r in results]),
                "truncated": list(prepared.truncated), "chunks": [r.windows for r in results]}
    return {"model": model, "embeddings": np.stack(results), "truncated": list(prepared.truncated)}


def _little_endian(vector: np.ndarray) -> np.ndarray:
    """A vector's bytes as OpenAI's base64 carries them: float32 little-endian, or one byte per int8/uint8 value."""
    vector = np.asarray(vector)
    return vector if vector.dtype.itemsize == 1 else vector.astype("<f4")


def _openai(body: OpenAIEmbeddingRequest, model: str, prepared: Prepared, results: list[Any]) -> dict[str, Any]:
    tokens = sum(len(e.ids) for e in prepared.encodings)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(_little_endian(v).tobytes()).decode()
             if body.encoding_format == "base64" else np.asarray(v)} for i, v in enumerate(results)]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class FeatureExtractionWire(TaskWire):
    task = FeatureExtraction
    routes = (
        Route("/embed", "Sentence embeddings", EmbedRequest, EmbedResponse, _embed,
              form=(FormField("text", "Text", multiline=True),)),
        Route("/v1/embeddings", "OpenAI-compatible embeddings", OpenAIEmbeddingRequest, OpenAIEmbeddingResponse,
              _openai, any_model_name=True, inputs_field="input", protocol=WireProtocol.OPENAI),
        tei.route("/embed"),
        tei.route("/embed_all"),
    )
    triton_outputs = (("EMBEDDING", "TYPE_FP32", (-1,)),)

    @classmethod
    def triton_arrays(cls, results: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"EMBEDDING": np.stack(results).astype(np.float32)}


WIRE = FeatureExtractionWire
