"""multi-vector on the wire: POST /embed_multi (token vectors) and POST /rerank by MaxSim."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from kiln.runtime.features import Prepared
from kiln.tasks.feature_extraction.wire import PrecisionName
from kiln.tasks.multi_vector.task import (
    MultiVector,
)
from kiln.tasks.rerank.wire import RankingRequest, RerankResponse
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import NonBlank, RequestBody, ResponseModel, Route

# /embed's fields that /embed_multi refuses, and why (the schema does not list them: they are not accepted).
REFUSED_FIELDS = {
    "dimensions": "a ColBERT model's token vectors keep the size of its trained projection; they cannot be cut "
                  "(it is not Matryoshka-trained)",
}


class EmbedMultiRequest(RequestBody):
    inputs: Annotated[list[NonBlank], Field(min_length=1)] | NonBlank = Field(
        description="One text or a list of texts.")
    is_query: bool = Field(description="Queries (marker [Q], expanded with [MASK] to the query length) or "
                           "documents (marker [D], punctuation left out): ColBERT encodes them differently.")
    precision: PrecisionName = Field("float32", description="Of every token vector, as sentence-transformers' "
                                     "quantize_embeddings makes it: int8/uint8 per-dimension buckets from the "
                                     "artifact's calibration (422 when it has none), binary/ubinary one bit per "
                                     "dimension packed 8 to a byte (int8 minus 128 / uint8).")

    @model_validator(mode="before")
    @classmethod
    def _refused_with_reason(cls, body: Any) -> Any:
        """Fields a single-vector /embed takes that token vectors cannot honour: said why, not just "extra"."""
        for name, reason in REFUSED_FIELDS.items():
            if isinstance(body, dict) and name in body:
                raise ValueError(f"{name}: {reason}")
        return body

    def items(self) -> list[Any]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"is_query": self.is_query, "precision": self.precision}


class EmbedMultiResponse(ResponseModel):
    model: str
    embeddings: list[list[list[float]]] = Field(description="Per input, one L2-normalised vector per kept token "
                                                "(at ``precision``: integers for int8/uint8/binary/ubinary).")
    truncated: bool = Field(description="Whether any input was cut to the query or document length.")


def render_multi(body: RequestBody, model: str, prepared: Prepared, results: list[Any]) -> dict[str, Any]:
    return {"model": model, "embeddings": [r.tolist() for r in results], "truncated": any(prepared.truncated)}


def _rerank(body: RankingRequest, model: str, prepared: Prepared, results: list[Any]) -> dict[str, Any]:
    return {"model": model, "results": results[0], "truncated": any(prepared.truncated)}


class MultiVectorWire(TaskWire):
    task = MultiVector
    routes = (Route("/embed_multi", "Token vectors of queries or documents (late interaction)", EmbedMultiRequest,
                    EmbedMultiResponse, render_multi),
              Route("/rerank", "Rank texts for a query by MaxSim", RankingRequest, RerankResponse, _rerank,
                    inputs_field="texts"))
    @classmethod
    def triton_refusal(cls) -> str | None:
        return "kiln triton does not write a multi-vector ensemble yet (ragged token vectors per input)"


WIRE = MultiVectorWire
