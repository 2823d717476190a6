"""text-classification on the wire: POST /classify and TEI's /predict."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import kiln.tasks.wire.tei as tei
from kiln.tasks.inputs import TextPair
from kiln.tasks.text_classification.task import (
    TextClassification,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import (
    ChunkingModel,
    Count,
    FormField,
    NonBlank,
    RequestBody,
    ResponseModel,
    Route,
    listify,
    render_results,
)


class PairItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: NonBlank
    text_pair: NonBlank


ClassifyItem = NonBlank | PairItem


class ClassifyChunking(ChunkingModel):
    mode: Literal["max", "mean"] = Field("max", description="How the windows' logits combine: max (a label "
                                         "anywhere in the text counts) or mean.")


class ClassifyRequest(RequestBody):
    inputs: ClassifyItem | Annotated[list[ClassifyItem], Field(min_length=1)] = Field(
        description="A text, a {text, text_pair} pair, or a list of them.")
    top_k: Count | None = Field(1, description="Labels per input; null for every label.")
    chunking: ClassifyChunking | None = Field(None, description="Classify texts longer than a window as "
                                              "overlapping token windows instead of truncating them (single texts "
                                              "only).")

    def items(self) -> list[Any]:
        return [x if isinstance(x, str) else TextPair(x.text, x.text_pair) for x in listify(self.inputs)]

    def options(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "chunking": self.chunking}


class LabelScoreModel(ResponseModel):
    label: str
    score: float


class ClassifyResponse(ResponseModel):
    model: str
    results: list[list[LabelScoreModel]]
    truncated: list[bool]


class TextClassificationWire(TaskWire):
    task = TextClassification
    routes = (Route("/classify", "Classify texts or text pairs", ClassifyRequest, ClassifyResponse, render_results,
                    form=(FormField("text", "Text", multiline=True),
                          FormField("text_pair", "Second text (optional: classifies the pair)", required=False,
                                    multiline=True))), tei.route("/predict"))


WIRE = TextClassificationWire
