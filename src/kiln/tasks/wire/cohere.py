"""Cohere's rerank API, v1 and v2 (``POST /v1/rerank``, ``POST /v2/rerank``): what the cohere SDK's ``Client`` and
``ClientV2`` send, answered in Cohere's shape, scored exactly as kiln's /rerank scores (the relevance the model's
own formula gives: a cross-encoder's sigmoid or softmax, a causal reranker's yes/no).

Documents are strings or ``{"text": ...}`` objects (v1's); ``top_n`` and ``return_documents`` (v1's, default false) as
Cohere defines them; ``max_tokens_per_doc`` cuts each document to its first tokens of the model's tokenizer before
the pair is made (then cut to the model's maximum as ever). What kiln does not do is refused by the schema, not
ignored: ``rank_fields`` (structured documents), ``max_chunks_per_doc`` (kiln cuts each pair to the model's maximum
instead), v2's ``relevant_spans`` and ``priority``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from pydantic import Field

from kiln.choices import WireProtocol
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.wire.http import Count, NonBlank, RequestBody, ResponseModel, Route

NOT_DONE = "not supported by kiln (it cuts each pair to the model's maximum length): leave it out"


class CohereDocument(RequestBody):
    model_config = RequestBody.model_config | {"title": "CohereDocument"}
    text: NonBlank
    # RequestBody's fields mean nothing inside a document: fixed to their defaults, so the schema refuses them
    model: None = Field(None, description="not a document field")  # type: ignore[assignment]
    truncate: None = Field(None, description="not a document field")  # type: ignore[assignment]


class CohereRerankRequest(RequestBody):
    """Cohere's rerank body; ``model`` names the served model (any name, where one model is served)."""

    query: NonBlank
    documents: Annotated[list[NonBlank | CohereDocument], Field(min_length=1)] = Field(
        description="The documents to rank: strings, or objects with a `text`.")
    top_n: Count | None = Field(None, description="Return the best `top_n` documents; null for all of them.")
    return_documents: bool = Field(False, description="Include each document's text in its result.")
    rank_fields: None = Field(None, description=f"Structured documents are {NOT_DONE}.")
    max_tokens_per_doc: Count | None = Field(None, description="Cut each document to its first this many tokens of "
                                             "the model's tokenizer before pairing it with the query; null: no "
                                             "limit but the model's maximum for the pair.")
    max_chunks_per_doc: None = Field(None, description=f"Chunking documents is {NOT_DONE}.")
    relevant_spans: None = Field(None, description="Relevant spans are not computed by kiln: leave it out.")
    priority: None = Field(None, description="kiln serves requests in arrival order: leave it out.")

    def texts(self) -> tuple[str, ...]:
        return tuple(d if isinstance(d, str) else d.text for d in self.documents)

    def items(self) -> list[Any]:
        return [RerankQuery(self.query, self.texts())]

    def input_count(self) -> int:
        return len(self.documents)

    def options(self) -> dict[str, Any]:
        return {"top_n": self.top_n, "return_documents": self.return_documents,
                "max_tokens_per_doc": self.max_tokens_per_doc}


class CohereText(ResponseModel):
    text: str


class CohereResult(ResponseModel):
    index: int = Field(description="The document's position in the request's documents.")
    relevance_score: float
    document: CohereText | None = None


class CohereVersion(ResponseModel):
    version: str


class CohereUnits(ResponseModel):
    search_units: int


class CohereMeta(ResponseModel):
    api_version: CohereVersion
    billed_units: CohereUnits


class CohereRerankResponse(ResponseModel):
    id: str
    results: list[CohereResult] = Field(description="Best first.")
    meta: CohereMeta


def _render(version: str) -> Any:
    def render(body: CohereRerankRequest, model: str, prepared: Any, results: list[Any]) -> dict[str, Any]:
        ranked = [{"index": r.index, "relevance_score": r.score,
                   **({"document": {"text": r.text}} if body.return_documents else {})} for r in results[0]]
        return {"id": str(uuid.uuid4()), "results": ranked,
                "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}}}
    return render


def routes() -> tuple[Route, ...]:
    """/v1/rerank and /v2/rerank (Cohere's API)."""
    return tuple(Route(f"/{v}/rerank", f"Rank documents for a query (Cohere's rerank API, {v})", CohereRerankRequest,
                       CohereRerankResponse, _render(v[1:]), any_model_name=True, inputs_field="documents",
                       protocol=WireProtocol.COHERE) for v in ("v1", "v2"))
