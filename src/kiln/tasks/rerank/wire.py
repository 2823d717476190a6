"""rerank on the wire: POST /rerank (kiln's body), TEI's /rerank, Cohere's /v1/rerank and /v2/rerank; Triton's QUERY
and TEXT pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field

import kiln.tasks.wire.cohere as cohere
import kiln.tasks.wire.tei as tei
from kiln.runtime.features import Prepared
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.rerank.task import (
    Rerank,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import Count, NonBlank, RequestBody, ResponseModel, Route


class RankingRequest(RequestBody):
    """A query and the texts to rank for it (a late-interaction model's /rerank: MaxSim scores have no 0-1 form)."""

    query: NonBlank
    texts: Annotated[list[NonBlank], Field(min_length=1)] = Field(description="The texts to rank for the query.")
    top_n: Count | None = Field(None, description="Return the best `top_n` texts; null for all of them.")
    return_documents: bool = Field(False, description="Include each text in its result.")

    def items(self) -> list[Any]:
        return [RerankQuery(self.query, tuple(self.texts))]

    def input_count(self) -> int:
        return len(self.texts)

    def options(self) -> dict[str, Any]:
        return {"top_n": self.top_n, "return_documents": self.return_documents}


class RerankRequest(RankingRequest):
    raw_scores: bool = Field(False, description="The model's logit instead of a 0-1 relevance score.")

    def options(self) -> dict[str, Any]:
        return super().options() | {"raw_scores": self.raw_scores}


class RankedModel(ResponseModel):
    index: int = Field(description="The text's position in the request's texts.")
    score: float
    text: str | None = None


class RerankResponse(ResponseModel):
    model: str
    results: list[RankedModel] = Field(description="Best first.")
    truncated: bool = Field(description="Whether any (query, text) pair was cut to the model's maximum length.")


def _render(body: RerankRequest, model: str, prepared: Prepared, results: list[Any]) -> dict[str, Any]:
    return {"model": model, "results": results[0], "truncated": any(prepared.truncated)}


class RerankWire(TaskWire):
    task = Rerank
    routes = (Route("/rerank", "Rank texts by relevance to a query", RerankRequest, RerankResponse, _render,
                    inputs_field="texts"), tei.route("/rerank"), *cohere.routes())
    triton_inputs = ("QUERY", "TEXT")  # one (query, text) pair per row
    triton_outputs = (("SCORE", "TYPE_FP32", (1,)),)
    @classmethod
    def triton_items(cls, columns: Mapping[str, list[str]]) -> list[Any]:
        return [RerankQuery(q, (t,)) for q, t in zip(columns["QUERY"], columns["TEXT"])]

    @classmethod
    def triton_arrays(cls, results: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"SCORE": np.array([[r[0].score] for r in results], dtype=np.float32)}


WIRE = RerankWire
