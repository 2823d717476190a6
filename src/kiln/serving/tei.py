"""TEI's server-level routes on kiln serve: /tokenize, /decode, and /info (kiln's own is at /kiln/info).

The task routes TEI clients call (/embed, /embed_sparse, /rerank, /predict) are declared by the tasks
(kiln.tasks.wire.tei); these belong to the server. They use the first served model's tokenizer, as TEI serves one.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from kiln.choices import WireProtocol
from kiln.serving.endpoints import HTTPError, not_ready
from kiln.tasks import task_spec
from kiln.tasks.wire.http import TOKEN_ID_MAX, NonBlank, TokenIdList

SERVER_PATHS = ("/tokenize", "/decode")  # POST routes of the server itself (guarded like inference routes)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TokenizeRequest(_Strict):
    inputs: NonBlank | Annotated[list[NonBlank], Field(min_length=1)]
    add_special_tokens: bool = True
    prompt_name: None = Field(None, description="kiln artifacts carry no prompt table: leave it out.")


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = None
    stop: int | None = None


class DecodeRequest(_Strict):
    ids: TokenIdList | Annotated[list[TokenIdList], Field(min_length=1)]
    skip_special_tokens: bool = True


class TEIInfo(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: dict[str, Any]
    served_model_name: str
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None = None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str


def _first(app: FastAPI) -> Any:
    error = not_ready(app.state.models)
    if error is not None:
        raise error
    return next(iter(app.state.models.values()))


def _model_type(served: Any) -> dict[str, Any]:
    """TEI's ModelType: classifier/reranker with its labels, or embedding with its pooling."""
    config, spec = served.artifact.task_config, task_spec(served.task)
    if spec.embeds or not config.id2label:
        return {"embedding": {"pooling": getattr(config.pooling, "value", str(config.pooling))}}
    labels = {str(k): v for k, v in config.id2label.items()}
    kind = "reranker" if spec.ranks else "classifier"
    return {kind: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}}


def cap_token_ids(node: Any, top: int) -> None:
    """Lower every token-id bound (``TOKEN_ID_MAX``) in a schema ``node`` to ``top``, the served vocabulary's last
    id: ids outside it are refused, so the schema says so."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and node.get("maximum") == TOKEN_ID_MAX:
            node["maximum"] = top
        for value in node.values():
            cap_token_ids(value, top)
    elif isinstance(node, list):
        for value in node:
            cap_token_ids(value, top)


def exact_schema(schema: dict[str, Any], served: Any) -> None:
    """/decode's ids can only be ids of the served tokenizer's vocabulary (the first model's, as /decode uses)."""
    cap_token_ids(schema.get("components", {}).get("schemas", {}).get("DecodeRequest", {}),
                  served.predictor.encoder.tokenizer.get_vocab_size() - 1)


def mount(app: FastAPI, *, info: bool) -> None:
    from kiln.serving.schemas import TEIError

    errors = {status: {"model": TEIError, "description": text} for status, text in (
        (413, "Too many inputs."), (422, "The body does not match this schema."), (503, "The model is loading."))}

    @app.post("/tokenize", response_model=list[list[SimpleToken]], responses=errors,
              summary="Tokenize texts (text-embeddings-inference's API)")
    async def tokenize(body: TokenizeRequest) -> list[list[dict[str, Any]]]:
        texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
        limit = app.state.config.max_inputs_per_request
        if len(texts) > limit:
            raise HTTPError(413, "too_many_inputs", f"{len(texts)} inputs in one request; the limit is {limit}")
        tokenizer = _first(app).predictor.encoder.tokenizer
        out = []
        for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=body.add_special_tokens)):
            tokens = []
            for token_id, token, (start, stop), special in zip(encoding.ids, encoding.tokens, encoding.offsets,
                                                              encoding.special_tokens_mask):
                tokens.append({"id": token_id, "text": token if special else text[start:stop],
                               "special": bool(special), "start": None if special else start,
                               "stop": None if special else stop})
            out.append(tokens)
        return out

    @app.post("/decode", response_model=list[str], responses=errors,
              summary="Decode token ids (text-embeddings-inference's API)")
    async def decode(body: DecodeRequest) -> list[str]:
        rows = body.ids if isinstance(body.ids[0], list) else [body.ids]
        tokenizer = _first(app).predictor.encoder.tokenizer
        size = tokenizer.get_vocab_size()
        bad = next((i for row in rows for i in row if i >= size), None)
        if bad is not None:
            raise HTTPError(422, "validation_error", f"ids: {bad} is not in the vocabulary (size {size})")
        return tokenizer.decode_batch(rows, skip_special_tokens=body.skip_special_tokens)

    if info:
        @app.get("/info", response_model=TEIInfo, summary="Served model info (text-embeddings-inference's API)")
        async def tei_info() -> dict[str, Any]:
            from kiln import __version__

            served, config = _first(app), app.state.config
            record = served.artifact.variant(served.variant)
            return {"model_id": str(served.artifact.path), "model_dtype": record.options.precision,
                    "model_type": _model_type(served), "served_model_name": served.name,
                    "max_concurrent_requests": config.max_concurrent,
                    "max_input_length": served.artifact.task_config.max_length,
                    "max_batch_tokens": config.limits.max_batch_tokens,
                    "max_batch_requests": config.limits.max_batch_size,
                    "max_client_batch_size": config.max_inputs_per_request, "auto_truncate": False,
                    "tokenization_workers": config.tokenizer_threads, "version": __version__}


def serves_info(protocols: tuple[WireProtocol, ...]) -> bool:
    """TEI's /info is served wherever TEI is (kiln's own is at /kiln/info): the two answers differ."""
    return WireProtocol.TEI in protocols
