"""token-classification on the wire: POST /tokens."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kiln.tasks.token_classification.task import (
    TokenClassification,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import FormField, RequestBody, ResponseModel, Route, Texts, listify, render_results


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


class TokenClassificationWire(TaskWire):
    task = TokenClassification
    routes = (Route("/tokens", "Tag tokens and group entities", TokensRequest, TokensResponse, render_results,
                    form=(FormField("text", "Text", multiline=True),)),)


WIRE = TokenClassificationWire
