"""Request bodies. Pydantic validates them; errors become 422 responses that name the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Texts = str | list[str]


def _non_empty(value: Texts) -> Texts:
    items = [value] if isinstance(value, str) else value
    if not items:
        raise ValueError("must not be an empty list")
    for i, text in enumerate(items):
        if not text.strip():
            raise ValueError(f"item {i} is an empty string")
    return value


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Which served model; default: the only/first one.")


class EmbedRequest(_Body):
    inputs: Texts
    truncate: bool = Field(True, description="Cut inputs longer than the model's maximum (else 413).")
    _check = field_validator("inputs")(_non_empty)


class ClassifyRequest(EmbedRequest):
    top_k: int | None = Field(1, ge=1, description="Labels per input; null for every label.")


class TokensRequest(EmbedRequest):
    aggregation: Literal["none", "simple", "first", "average", "max"] = "simple"


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    context: str = Field(min_length=1)


class AnswerRequest(_Body):
    inputs: QAItem | list[QAItem]
    top_k: int = Field(1, ge=1)
    max_answer_len: int = Field(15, ge=1)
    allow_null: bool = False
    null_threshold: float = 0.0

    @field_validator("inputs")
    @classmethod
    def _some(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("must not be an empty list")
        return value


class OpenAIEmbeddingRequest(BaseModel):
    """The OpenAI embeddings API body (``dimensions`` and ``user`` accepted and ignored)."""

    input: Texts
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    _check = field_validator("input")(_non_empty)
