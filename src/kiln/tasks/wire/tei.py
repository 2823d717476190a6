"""Hugging Face text-embeddings-inference's API for the tasks TEI serves: /embed, /embed_all, /embed_sparse, /rerank,
/predict.

The bodies and answers are TEI's (tests/data/tei-openapi.json, TEI 1.9.3), so a TEI client works unchanged:
a bare list of vectors, of {index, value} terms, of {index, score} ranks, of {label, score} predictions. Each
task module adds its route to ``routes`` with ``protocol=WireProtocol.TEI``; kiln serve mounts them with
--protocols tei (on a path both declare TEI's body is served; kiln's own is under /kiln/).

What kiln does not do is refused by the schema, not ignored: token ids and prompts for sparse embeddings (SPLADE
models define none). /predict's raw_scores gives each label's logit. /embed takes the model's named prompts
(config_sentence_transformers.json) and token ids; every route takes either truncation direction as TEI does (a
causal reranker refuses Left with a 422: its score is read at its prompt's closing tokens).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from kiln.choices import WireProtocol
from kiln.tasks.wire.http import (
    Count,
    NonBlank,
    NonBlankList,
    RequestBody,
    ResponseModel,
    Route,
    Texts,
    TextsOrIds,
    listify,
    texts_or_ids,
)

TRUNCATE_HELP = "Cut inputs longer than the model's maximum; false (TEI's default): a 413 instead."


class TEIRequest(RequestBody):
    """What TEI's bodies share. TEI's truncate defaults to false (the server's --auto-truncate, off by default)."""

    truncate: bool | None = Field(False, description=TRUNCATE_HELP)  # type: ignore[assignment]
    truncation_direction: Literal["Right", "right", "Left", "left"] = Field(
        "Right", description="Which end of an input over the model's maximum is cut when truncate is true: Right, "
        "its end; Left, its start (its last tokens are kept; the special tokens stay). A pair loses tokens from "
        "its longer text first, at that end.")

    def truncation(self) -> dict[str, Any]:
        """The task option that carries the direction (every task TEI serves takes it)."""
        return {"truncation_side": self.truncation_direction.lower()}


class TEITextsOrIdsRequest(TEIRequest):
    """What /embed and /embed_all share: texts or token ids, and the model's named prompts for texts."""

    inputs: TextsOrIds = Field(description="A text, a list of texts, a text as token ids of the model's "
                               "vocabulary, or a list of those (special tokens where the caller put them, none "
                               "added; no prompt is put before ids).")
    prompt_name: NonBlank | None = Field(None, description="One of the model's prompts (config_sentence_transformers"
                                         ".json's `prompts`), put before each input; default: the model's default "
                                         "prompt. A name it does not define is a 422 listing those it has.")

    @model_validator(mode="after")
    def _prompt_for_texts(self) -> TEITextsOrIdsRequest:
        if self.prompt_name is not None and any(not isinstance(item, str) for item in listify(self.inputs)):
            raise ValueError("prompt_name: a prompt is put before texts; token ids are the model's whole input "
                             "(put the prompt's ids first yourself)")
        return self

    def items(self) -> list[Any]:
        return texts_or_ids(self.inputs)


class TEIEmbedRequest(TEITextsOrIdsRequest):
    normalize: bool = Field(True, description="Unit-length vectors; false: the pooled vectors, before any "
                            "Normalize module of the model (as TEI, which pools and normalizes itself).")
    dimensions: Count | None = Field(None, description="Keep the first `dimensions` values (Matryoshka models).")

    def options(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions, "prompt_name": self.prompt_name, "normalize": self.normalize,
                **self.truncation()}


class TEIEmbedResponse(RootModel[list[list[float]]]):
    pass


def _embed(body: TEIEmbedRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    return np.stack(results).astype(np.float32)  # normalized (or not) as the request's options asked


class TEIEmbedAllRequest(TEITextsOrIdsRequest):
    """Every token's vector of each input, unpooled and as the encoder gives it (special tokens included; a
    prompt's tokens too)."""

    def options(self) -> dict[str, Any]:
        return {"tokens": True, "prompt_name": self.prompt_name, **self.truncation()}


class TEIEmbedAllResponse(RootModel[list[list[list[float]]]]):
    pass


def _embed_all(body: TEIEmbedAllRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    return [np.asarray(states, dtype=np.float32) for states in results]  # per input: one vector per token


class TEISparseRequest(TEIRequest):
    inputs: Texts = Field(description="A text or a list of texts.")
    prompt_name: None = Field(None, description="kiln's sparse embeddings take no prompt: leave it out.")

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return self.truncation()


class SparseValue(ResponseModel):
    index: int
    value: float


class TEISparseResponse(RootModel[list[list[SparseValue]]]):
    pass


def _sparse(body: TEISparseRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    return [[{"index": int(i), "value": float(v)} for i, v in zip(r.indices, r.values)] for r in results]


class TEIRerankRequest(TEIRequest):
    query: NonBlank
    texts: NonBlankList = Field(description="The texts to rank for the query.")
    raw_scores: bool = Field(False, description="The model's logit instead of a 0-1 relevance score.")
    return_text: bool = Field(False, description="Include each text in its rank.")

    def items(self) -> list[Any]:
        from kiln.tasks.inputs import RerankQuery

        return [RerankQuery(self.query, tuple(self.texts))]

    def input_count(self) -> int:
        return len(self.texts)

    def options(self) -> dict[str, Any]:
        return {"raw_scores": self.raw_scores, "return_documents": self.return_text, **self.truncation()}


class Rank(ResponseModel):
    index: int
    score: float
    text: str | None = None


class TEIRerankResponse(RootModel[list[Rank]]):
    pass


def _rerank(body: TEIRerankRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    return [{"index": r.index, "score": r.score, **({"text": r.text} if body.return_text else {})}
            for r in results[0]]


Pair = Annotated[list[NonBlank], Field(min_length=2, max_length=2)]
OneOrPair = Annotated[list[NonBlank], Field(min_length=1, max_length=2)]


class PredictParameters(BaseModel):
    """The Hugging Face Inference API's text-classification parameters, which huggingface_hub's InferenceClient
    sends in ``parameters`` (TEI's own body has no such field)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    top_k: Count | None = Field(None, description="The k most probable labels; default: every label.")
    function_to_apply: None = Field(None, description="kiln applies the model's own function (softmax; sigmoid for "
                                    "a multi-label model): leave it out.")


class TEIPredictRequest(TEIRequest):
    inputs: NonBlank | Pair | Annotated[list[OneOrPair], Field(min_length=1)] = Field(
        description="A text, a pair of texts [a, b], or a batch of [text] and [a, b] items.")
    raw_scores: bool = Field(False, description="Each label's logit instead of its probability.")
    parameters: PredictParameters | None = Field(None, description="huggingface_hub's text-classification "
                                                 "parameters (kiln's extension of TEI's body).")

    def _batch(self) -> bool:
        return isinstance(self.inputs, list) and bool(self.inputs) and isinstance(self.inputs[0], list)

    def items(self) -> list[Any]:
        from kiln.tasks.inputs import TextPair

        if not self._batch():
            rows = [self.inputs if isinstance(self.inputs, list) else [self.inputs]]
        else:
            rows = self.inputs  # type: ignore[assignment]
        return [row[0] if len(row) == 1 else TextPair(row[0], row[1]) for row in rows]

    def options(self) -> dict[str, Any]:
        return {"top_k": self.parameters.top_k if self.parameters is not None else None,
                "raw_scores": self.raw_scores, **self.truncation()}


class Prediction(ResponseModel):
    label: str
    score: float


class TEIPredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    pass


def _predict(body: TEIPredictRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    rows = [[{"label": p.label, "score": p.score} for p in result] for result in results]
    return rows if body._batch() else rows[0]


def route(path: str, request: type[TEIRequest] | None = None) -> Route:
    """TEI's route at ``path`` (one of ROUTES); ``request``: a subclass of its body that adds the task's own options
    (a hybrid model's /embed_sparse asks for its lexical weights)."""
    summary, body, response, render, inputs = ROUTES[path]
    return Route(path, f"{summary} (text-embeddings-inference's API)", request or body, response, render,
                 inputs_field=inputs, protocol=WireProtocol.TEI)


# path -> (summary, request, response, render, the field carrying the inputs)
ROUTES: dict[str, tuple[str, Any, Any, Any, str]] = {
    "/embed": ("Embeddings", TEIEmbedRequest, TEIEmbedResponse, _embed, "inputs"),
    "/embed_all": ("Every token's vector, unpooled", TEIEmbedAllRequest, TEIEmbedAllResponse, _embed_all, "inputs"),
    "/embed_sparse": ("Sparse embeddings", TEISparseRequest, TEISparseResponse, _sparse, "inputs"),
    "/rerank": ("Rank texts for a query", TEIRerankRequest, TEIRerankResponse, _rerank, "texts"),
    "/predict": ("Classify a text or a pair", TEIPredictRequest, TEIPredictResponse, _predict, "inputs"),
}
