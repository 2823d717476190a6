"""sparse-embedding on the wire: POST /embed_sparse and TEI's /embed_sparse."""

from __future__ import annotations

from typing import Any

from pydantic import Field

import kiln.tasks.wire.tei as tei
from kiln.runtime.features import Prepared
from kiln.tasks.sparse_embedding.task import SparseEmbedding, SparseVector
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import Count, FormField, RequestBody, ResponseModel, Route, Texts, listify


class SparseRequest(RequestBody):
    inputs: Texts = Field(description="A text or a list of texts.")
    threshold: float = Field(0.0, ge=0.0, le=1e6, description="Return terms whose weight is above this.")
    top_k: Count | None = Field(None, description="Then only the `top_k` heaviest terms; null for all.")

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "top_k": self.top_k}


class TermModel(ResponseModel):
    index: int = Field(description="The term's id in the model's vocabulary.")
    value: float


class SparseResponse(ResponseModel):
    model: str
    embeddings: list[list[TermModel]] = Field(description="Per input: its terms, by vocabulary index.")
    truncated: list[bool]


def render_sparse(body: SparseRequest, model: str, prepared: Prepared,
                  results: list[SparseVector]) -> dict[str, Any]:
    return {"model": model, "truncated": list(prepared.truncated),
            "embeddings": [[{"index": i, "value": v} for i, v in zip(r.indices, r.values)] for r in results]}


class SparseEmbeddingWire(TaskWire):
    task = SparseEmbedding
    routes = (Route("/embed_sparse", "Sparse (SPLADE) embeddings", SparseRequest, SparseResponse, render_sparse,
                    form=(FormField("text", "Text", multiline=True),)), tei.route("/embed_sparse"))


WIRE = SparseEmbeddingWire
