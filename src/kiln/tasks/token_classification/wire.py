"""token-classification on the wire: kiln's POST /tokens, and the Hugging Face Inference API's token-classification
body (what huggingface_hub's ``InferenceClient(base_url=URL).token_classification`` posts to the server's root) at
/token_classification, which POST / and /invocations run where a tagger is the first served model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from kiln.choices import WireProtocol
from kiln.tasks.token_classification.task import (
    TokenClassification,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import (
    FormField,
    NonBlank,
    RequestBody,
    ResponseModel,
    Route,
    Texts,
    listify,
    render_results,
)


class TokensRequest(RequestBody):
    inputs: Texts = Field(description="A text or a list of texts.")
    aggregation: Literal["none", "simple", "first", "average", "max"] = "simple"

    def items(self) -> list[Any]:
        return listify(self.inputs)

    def options(self) -> dict[str, Any]:
        return {"aggregation": self.aggregation}


class EntityModel(ResponseModel):
    label: str
    score: float
    word: str
    start: int
    end: int
    index: int | None


class TokensResponse(ResponseModel):
    model: str
    results: list[list[EntityModel]]
    truncated: list[bool]


Strategy = Literal["none", "simple", "first", "average", "max"]


class InferenceParameters(BaseModel):
    """The Inference API's token-classification parameters, as huggingface_hub sends them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    aggregation_strategy: Strategy | None = Field(None, description="How word pieces are grouped into entities; "
                                                  "default: simple.")
    ignore_labels: list[NonBlank] | None = Field(None, description="Labels left out of the answer; default: O.")
    stride: None = Field(None, description="kiln cuts a text to the model's maximum length: leave it out.")


class InferenceTokensRequest(RequestBody):
    inputs: NonBlank = Field(description="One text.")
    parameters: InferenceParameters | None = Field(None, description="The Inference API's parameters.")

    def items(self) -> list[Any]:
        return [self.inputs]

    def options(self) -> dict[str, Any]:
        given = self.parameters or InferenceParameters()
        return {"aggregation": given.aggregation_strategy or "simple",
                **({"ignore_labels": given.ignore_labels} if given.ignore_labels is not None else {})}


class InferenceEntity(ResponseModel):
    entity_group: str | None = Field(None, description="The entity's label (grouped entities).")
    entity: str | None = Field(None, description="The token's label (aggregation_strategy none).")
    score: float
    word: str
    start: int
    end: int
    index: int | None = None


class InferenceTokensResponse(RootModel[list[InferenceEntity]]):
    pass


def _inference_entities(body: InferenceTokensRequest, model: str, prepared: Any, results: list[Any]) -> Any:
    grouped = (body.parameters is None or body.parameters.aggregation_strategy != "none")
    return [{("entity_group" if grouped else "entity"): e.label, "score": e.score, "word": e.word, "start": e.start,
             "end": e.end, **({} if grouped else {"index": e.index})} for e in results[0]]


class TokenClassificationWire(TaskWire):
    task = TokenClassification
    routes = (Route("/tokens", "Tag tokens and group entities", TokensRequest, TokensResponse, render_results,
                    form=(FormField("text", "Text", multiline=True),)),
              # the root route of a server whose first model is a tagger, as the Inference API answers it
              Route("/token_classification", "Tag tokens (the Hugging Face Inference API's body and answer)",
                    InferenceTokensRequest, InferenceTokensResponse, _inference_entities,
                    protocol=WireProtocol.TEI),)


WIRE = TokenClassificationWire
