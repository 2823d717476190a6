"""What a served route is, and the request pieces every task's routes share.

Each task module declares its routes (path, request and response models, how a result becomes a response);
the server mounts the routes of the tasks it serves and nothing else, so the OpenAPI schema lists exactly
what is reachable. Request models are strict: ``true`` is not ``1``, unknown fields are refused, strings
must hold a non-blank character (declared as a pattern, so schema and check agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from kiln.choices import KILN_PREFIX, WireProtocol

# A string with a character other than ASCII whitespace. Spelled out, not \\S: JSON Schema (ECMA) and pydantic
# (Rust) disagree on whether U+0085 is whitespace, and the schema must say exactly what validation does.
NonBlank = Annotated[str, StringConstraints(pattern=r"[^ \t\n\r\f\x0b]")]
NonBlankList = Annotated[list[NonBlank], Field(min_length=1)]
Texts = NonBlank | NonBlankList
# JSON Schema calls 3.0 an integer; strict mode alone would refuse it, so integral floats become ints first.
Integral = BeforeValidator(lambda v: int(v) if isinstance(v, float) and v.is_integer() else v)
# A text as token ids of the model's vocabulary (OpenAI's and TEI's embedding APIs take them besides text, TEI's
# /decode reads them); each id is checked against the served tokenizer where it is read.
TOKEN_ID_MAX = 2**31 - 1  # the served schema lowers it to the served vocabulary (kiln.serving.tei.cap_token_ids)
TokenIdList = Annotated[list[Annotated[int, Field(ge=0, le=TOKEN_ID_MAX), Integral]], Field(min_length=1)]
TextsOrIds = Texts | TokenIdList | Annotated[list[TokenIdList], Field(min_length=1)]
# Counts bounded so a client cannot ask numpy for a slice past a C long (found by fuzzing).
Count = Annotated[int, Field(ge=1, le=1_000_000), Integral]


class RequestBody(BaseModel):
    """Fields every inference request has; subclasses say how their body becomes inputs and options."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, description="Which served model; default: the only (or first) one.")
    truncate: bool = Field(True, description="Cut inputs longer than the model's maximum (else 413).")

    def items(self) -> list[Any]:
        """The request's inputs, as the task's ``predict`` takes them."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """Per-request options for the task's ``options()``."""
        return {}

    def input_count(self) -> int:
        """What --max-inputs-per-request counts: the inputs (a reranker counts its texts)."""
        return len(self.items())


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def listify(value: Any) -> list[Any]:
    """One input or a list of them -> a list."""
    return list(value) if isinstance(value, list) else [value]


def texts_or_ids(value: Any) -> list[Any]:
    """A ``TextsOrIds`` field's inputs: texts, or ``TokenIds`` (one list of ids is one text)."""
    from kiln.tasks.inputs import TokenIds

    if isinstance(value, list) and isinstance(value[0], int):
        return [TokenIds(tuple(value))]
    if isinstance(value, list) and isinstance(value[0], list):
        return [TokenIds(tuple(ids)) for ids in value]
    return listify(value)


def render_results(body: Any, model: str, prepared: Any, results: list[Any]) -> dict[str, Any]:
    """The usual response: the model's name, one result per input, and which inputs were cut."""
    return {"model": model, "results": results, "truncated": list(prepared.truncated)}


@dataclass(frozen=True)
class FormField:
    """One input of the task's playground form (kiln serve's page at /)."""

    name: str
    label: str
    required: bool = True
    multiline: bool = False


@dataclass(frozen=True)
class Route:
    """One HTTP route of a task: POST ``path`` with ``request``, answered with ``response``."""

    path: str
    summary: str
    request: type[RequestBody]
    response: type[ResponseModel]
    # (request body, served model name, prepared inputs, task results) -> the response body
    render: Callable[[Any, str, Any, list[Any]], dict[str, Any]]
    # OpenAI clients always send a model name: with one model served, any name maps to it.
    any_model_name: bool = False
    inputs_field: str = "inputs"  # the request field that carries the inputs (its maxItems is the server's limit)
    # The playground's form for this route (empty: not offered there). With one field filled the page sends its
    # text as the input; with more, an object of the filled fields (a text pair, a question and its context).
    form: tuple[FormField, ...] = ()
    # How the server answers it (kiln.serving.app's MOUNTS): "infer" runs the batcher and ``render``; "generate" is a
    # decoder's step loop, with streaming.
    kind: str = "infer"
    # Whose API this route is (kiln serve --protocols): kiln's own, OpenAI's, or TEI's. Its errors take that
    # protocol's shape.
    protocol: WireProtocol = WireProtocol.KILN


def kiln_path(route: Route) -> str:
    """Where kiln serve always mounts ``route``: kiln's own routes under KILN_PREFIX (their bare path too where no
    other API defines it: kiln.serving.app), every other API's at its own path."""
    return KILN_PREFIX + route.path if route.protocol is WireProtocol.KILN else route.path


class ChunkingModel(BaseModel):
    """The ``chunking`` field of a request: split over-long inputs into windows instead of truncating them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    size: int = Field(ge=1, le=1_000_000, description="Tokens of text per window; at most the model's maximum "
                      "minus its special tokens.")
    overlap: int = Field(0, ge=0, le=1_000_000, description="Tokens each window repeats from the previous one; "
                         "less than size.")
