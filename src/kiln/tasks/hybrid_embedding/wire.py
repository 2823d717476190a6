"""hybrid-embedding on the wire: an embedder's routes for the dense vector (/embed, /v1/embeddings, TEI's /embed),
/embed_sparse for the lexical weights (kiln's and TEI's bodies), /embed_multi for the ColBERT vectors and
/embed_hybrid for all three of each text from one forward."""

from __future__ import annotations

from typing import Any

from pydantic import Field

import kiln.tasks.wire.tei as tei
from kiln.runtime.features import Prepared
from kiln.tasks.feature_extraction.wire import FeatureExtractionWire
from kiln.tasks.hybrid_embedding.task import HybridEmbedding, HybridVectors
from kiln.tasks.multi_vector.wire import EmbedMultiResponse, render_multi
from kiln.tasks.sparse_embedding.wire import SparseRequest, SparseResponse, TermModel, render_sparse
from kiln.tasks.wire.http import Count, FormField, RequestBody, ResponseModel, Route, Texts, listify

THRESHOLD_HELP = "Return terms whose weight is above this."
TOP_K_HELP = "Then only the `top_k` heaviest terms; null for all."


class HybridSparseRequest(SparseRequest):
    def options(self) -> dict[str, Any]:
        return {**super().options(), "output": "sparse"}


class HybridTEISparseRequest(tei.TEISparseRequest):
    def options(self) -> dict[str, Any]:
        return {**super().options(), "output": "sparse"}


class HybridMultiRequest(RequestBody):
    inputs: Texts = Field(description="A text or a list of texts (queries and documents are encoded alike).")

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"output": "multi"}


class HybridRequest(RequestBody):
    inputs: Texts = Field(description="A text or a list of texts.")
    threshold: float = Field(0.0, ge=0.0, le=1e6, description=f"Lexical weights: {THRESHOLD_HELP}")
    top_k: Count | None = Field(None, description=f"Lexical weights: {TOP_K_HELP}")

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"output": "all", "threshold": self.threshold, "top_k": self.top_k}


class HybridItem(ResponseModel):
    dense: list[float] = Field(description="The dense vector (unit length where the model normalizes).")
    sparse: list[TermModel] = Field(description="The lexical weights, by vocabulary index.")
    multi: list[list[float]] = Field(description="One L2-normalised ColBERT vector per token after the first.")


class HybridResponse(ResponseModel):
    model: str
    embeddings: list[HybridItem]
    truncated: list[bool] = Field(description="Per input: whether it was cut to the model's maximum length.")


def _hybrid(body: HybridRequest, model: str, prepared: Prepared, results: list[HybridVectors]) -> dict[str, Any]:
    return {"model": model, "truncated": list(prepared.truncated), "embeddings": [
        {"dense": r.dense, "sparse": [{"index": i, "value": v} for i, v in zip(r.sparse.indices, r.sparse.values)],
         "multi": r.multi} for r in results]}


class HybridEmbeddingWire(FeatureExtractionWire):
    task = HybridEmbedding
    routes = (
        # TEI's /embed_all left out: a hybrid model's per-token vectors are its ColBERT vectors (/embed_multi)
        *(r for r in FeatureExtractionWire.routes if r.path != "/embed_all"),
        Route("/embed_sparse", "Lexical weights (BGE-M3's sparse output)", HybridSparseRequest, SparseResponse,
              render_sparse, form=(FormField("text", "Text", multiline=True),)),
        tei.route("/embed_sparse", HybridTEISparseRequest),
        Route("/embed_multi", "ColBERT vectors (BGE-M3's multi-vector output)", HybridMultiRequest,
              EmbedMultiResponse, render_multi),
        Route("/embed_hybrid", "Dense vector, lexical weights and ColBERT vectors from one forward",
              HybridRequest, HybridResponse, _hybrid),
    )


WIRE = HybridEmbeddingWire
