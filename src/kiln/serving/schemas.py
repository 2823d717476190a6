"""The server's own response bodies (task routes declare theirs in their task module)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kiln.choices import WireProtocol


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Model):
    type: str
    message: str


class ErrorBody(_Model):
    """Every error the server answers: 401, 404, 413, 422, 429, 499, 500, 503."""

    error: ErrorDetail


class Health(_Model):
    status: Literal["ok"]


class Ready(_Model):
    ready: Literal[True]
    models: list[str]


class Info(_Model):
    models: list[dict[str, Any]]
    limits: dict[str, Any]


class ModelCard(_Model):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Model):
    object: Literal["list"]
    data: list[ModelCard]


class TEIError(BaseModel):
    """TEI's ErrorResponse: what its routes answer on kiln serve when they fail."""

    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class CohereError(BaseModel):
    """Cohere's error body: what its rerank routes answer on kiln serve when they fail."""

    message: str


# Responses every inference route may give besides 200 (the guard and the error table produce them).
INFERENCE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (401, "Missing or wrong API key (with --api-key)."),
        (404, "No such served model, or the model does another task."),
        (413, "Body over the size limit, too many inputs, or an input over the model's length with truncate false."),
        (422, "The body does not match this schema; the message names the field."),
        (429, "Too many requests in flight; retry after the Retry-After seconds."),
        (500, "Inference failed; every request of the failed batch gets this answer."),
        (503, "The model is still loading, or the server is over its --max-memory budget (retry after the "
              "Retry-After seconds)."),
    )
}

# The same, for TEI's routes: TEI's error shape.
TEI_ERRORS: dict[int | str, dict[str, Any]] = {status: {**entry, "model": TEIError}
                                               for status, entry in INFERENCE_ERRORS.items()}

# The same, for Cohere's rerank routes: Cohere's error shape.
COHERE_ERRORS: dict[int | str, dict[str, Any]] = {status: {**entry, "model": CohereError}
                                                  for status, entry in INFERENCE_ERRORS.items()}
# Each protocol's error documentation (kiln's and OpenAI's share kiln's ErrorBody).
ERRORS_BY_PROTOCOL = {WireProtocol.TEI: TEI_ERRORS, WireProtocol.COHERE: COHERE_ERRORS}
