"""How `kiln audit` asks a running deployment for embeddings or rerank scores: one adapter per wire format and
kind of answer, a registry of each by protocol.

Every failure a user can meet becomes one AuditError naming the URL and what was wrong: a bad URL, nothing
listening, a timeout, an HTTP error status, a body that is not JSON, or JSON of the wrong shape (not one vector
of equal length per text, not one score per text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from kiln.choices import KILN_PREFIX
from kiln.choices import WireProtocol as Protocol
from kiln.errors import KilnError, UsageError


class AuditError(KilnError):
    """The deployment could not be asked, or answered something that is not embeddings."""

    exit_code = 3


@dataclass(frozen=True)
class Endpoint:
    url: str  # the server's base URL (scheme://host:port[/prefix])
    protocol: Protocol
    model: str | None = None  # the model name the protocol needs (OpenAI, v2)
    timeout_s: float = 30.0
    headers: tuple[tuple[str, str], ...] = ()
    # A route the server answered at its fallback path (a 404 first): later requests go there at once (Infinity
    # serves /embeddings, not /v1/embeddings: every request of an audit took two round trips).
    moved: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"URL must be http(s)://host[:port][/prefix] (got {self.url!r})")
        object.__setattr__(self, "protocol", Protocol(self.protocol))
        object.__setattr__(self, "url", self.url.rstrip("/"))


def _post(endpoint: Endpoint, path: str, body: Any, fallback: str | None = None) -> Any:
    """POST ``body`` as JSON to ``path`` (or, when the server has no such route (404), to ``fallback``)."""
    import httpx

    if path in endpoint.moved:
        path, fallback = endpoint.moved[path], None
    url = f"{endpoint.url}{path}"
    try:
        response = httpx.post(url, json=body, timeout=endpoint.timeout_s, headers=dict(endpoint.headers))
    except httpx.TimeoutException as err:
        raise AuditError(f"{url} did not answer within {endpoint.timeout_s:g} s (--timeout)") from err
    except httpx.ConnectError as err:
        raise AuditError(f"nothing answers at {url} ({err}); is the server running there?") from err
    except httpx.HTTPError as err:
        raise AuditError(f"{url}: {type(err).__name__}: {err}") from err
    if response.status_code == 404 and fallback is not None:
        answer = _post(endpoint, fallback, body)
        endpoint.moved[path] = fallback
        return answer
    if response.status_code != 200:
        raise AuditError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        return response.json()
    except ValueError as err:
        raise AuditError(f"{url} answered with something that is not JSON: {response.text[:200]!r}") from err


def _vectors(rows: Any, count: int, where: str) -> np.ndarray:
    """``rows`` as a [count, dim] float array, or an AuditError saying what the answer was instead."""
    try:
        array = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise AuditError(f"{where}: the answer is not a list of numeric vectors ({err})") from err
    if array.ndim != 2 or array.shape[0] != count or array.shape[1] == 0:
        raise AuditError(f"{where}: expected {count} vectors of one length, got an array of shape {array.shape}")
    if not np.isfinite(array).all():
        raise AuditError(f"{where}: the vectors hold NaN or infinite values")
    return array


def _openai(endpoint: Endpoint, texts: Sequence[str]) -> np.ndarray:
    # OpenAI's path is /v1/embeddings; Infinity serves /embeddings unless started with --url-prefix /v1.
    path = "/v1/embeddings" if not endpoint.url.endswith("/v1") else "/embeddings"
    body = _post(endpoint, path, {"input": list(texts), "model": endpoint.model or "default"},
                 fallback="/embeddings" if path == "/v1/embeddings" else None)
    try:
        rows = [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])]
    except (KeyError, TypeError) as err:
        raise AuditError(f"{endpoint.url}{path}: not an OpenAI embeddings answer (no data[].embedding)") from err
    return _vectors(rows, len(texts), f"{endpoint.url}{path}")


def _tei(endpoint: Endpoint, texts: Sequence[str]) -> np.ndarray:
    # TEI's truncate defaults to false (a 413 past the maximum, unless the server runs with --auto-truncate); its
    # normalize defaults to true, which is what its clients get, so the audit asks the same way.
    body = _post(endpoint, "/embed", {"inputs": list(texts), "truncate": True})
    return _vectors(body, len(texts), f"{endpoint.url}/embed")


def _kiln(endpoint: Endpoint, texts: Sequence[str]) -> np.ndarray:
    path = KILN_PREFIX + "/embed"  # kiln's own body; a bare /embed answers TEI's
    body = _post(endpoint, path, {"inputs": list(texts), **({"model": endpoint.model} if endpoint.model else {})})
    if not isinstance(body, dict) or "embeddings" not in body:
        raise AuditError(f"{endpoint.url}{path}: not a kiln answer (no 'embeddings')")
    return _vectors(body["embeddings"], len(texts), f"{endpoint.url}{path}")


def _v2_infer(endpoint: Endpoint, tensors: dict[str, Sequence[str]], output: str) -> tuple[np.ndarray, str]:
    """POST BYTES tensors of shape [n, 1] to /v2/models/NAME/infer: the output named ``output`` (else the first
    one) as an array, and where it came from."""
    if not endpoint.model:
        raise UsageError("protocol v2 needs --model-name (the served model's name in /v2/models/NAME/infer)")
    path = f"/v2/models/{endpoint.model}/infer"
    body = _post(endpoint, path, {"inputs": [{"name": name, "shape": [len(column), 1], "datatype": "BYTES",
                                              "data": list(column)} for name, column in tensors.items()]})
    try:
        outputs = body["outputs"]
        chosen = next((o for o in outputs if o.get("name") == output), outputs[0])
        array = np.asarray(chosen["data"], dtype=np.float32).reshape(chosen["shape"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise AuditError(f"{endpoint.url}{path}: not a v2 inference answer ({type(err).__name__}: {err})") from err
    return array, f"{endpoint.url}{path}"


def _v2(endpoint: Endpoint, texts: Sequence[str]) -> np.ndarray:
    array, where = _v2_infer(endpoint, {"TEXT": texts}, "EMBEDDING")
    return _vectors(array.reshape(len(texts), -1), len(texts), where)


# Protocol -> how to get one vector per text.
CLIENTS: dict[Protocol, Callable[[Endpoint, Sequence[str]], np.ndarray]] = {
    Protocol.OPENAI: _openai, Protocol.TEI: _tei, Protocol.KILN: _kiln, Protocol.V2: _v2}


def embed(endpoint: Endpoint, texts: Sequence[str]) -> np.ndarray:
    if endpoint.protocol not in CLIENTS:
        raise AuditError(f"--protocol {endpoint.protocol}: that API ranks documents and returns no vectors; audit an "
                         f"embedding deployment over {', '.join(p.value for p in CLIENTS)}")
    return CLIENTS[endpoint.protocol](endpoint, texts)


def _scores(rows: Any, count: int, where: str, key: str = "score") -> np.ndarray:
    """[{index, <key>}, ...] (any order, every index once) as the scores in request order."""
    try:
        pairs = [(int(row["index"]), float(row[key])) for row in rows]
    except (KeyError, TypeError, ValueError) as err:
        raise AuditError(f"{where}: not a list of {{'index', '{key}'}} results ({type(err).__name__}: {err})") from err
    if sorted(i for i, _ in pairs) != list(range(count)):
        raise AuditError(f"{where}: expected one score for each of the {count} texts, got indexes "
                         f"{sorted(i for i, _ in pairs)[:12]}")
    scores = np.array([s for _, s in sorted(pairs)], dtype=np.float64)
    if not np.isfinite(scores).all():
        raise AuditError(f"{where}: the scores hold NaN or infinite values")
    return scores


def _tei_rerank(endpoint: Endpoint, query: str, texts: Sequence[str]) -> np.ndarray:
    body = _post(endpoint, "/rerank", {"query": query, "texts": list(texts), "raw_scores": False, "truncate": True})
    return _scores(body, len(texts), f"{endpoint.url}/rerank")


def _kiln_rerank(endpoint: Endpoint, query: str, texts: Sequence[str]) -> np.ndarray:
    path = KILN_PREFIX + "/rerank"
    body = _post(endpoint, path, {"query": query, "texts": list(texts),
                                  **({"model": endpoint.model} if endpoint.model else {})})
    if not isinstance(body, dict) or "results" not in body:
        raise AuditError(f"{endpoint.url}{path}: not a kiln answer (no 'results')")
    return _scores(body["results"], len(texts), f"{endpoint.url}{path}")


def _cohere_rerank(endpoint: Endpoint, query: str, texts: Sequence[str], path: str = "/rerank") -> np.ndarray:
    # Cohere's body and answer: at /rerank where OpenAI-compatible servers add it (Infinity, vLLM, Jina), at
    # /v2/rerank where a server speaks Cohere's API itself (kiln serve).
    body = _post(endpoint, path, {"query": query, "documents": list(texts), "model": endpoint.model or "default",
                                  "return_documents": False})
    if not isinstance(body, dict) or "results" not in body:
        raise AuditError(f"{endpoint.url}{path}: not a Cohere-style rerank answer (no 'results')")
    return _scores(body["results"], len(texts), f"{endpoint.url}{path}", key="relevance_score")


def _v2_rerank(endpoint: Endpoint, query: str, texts: Sequence[str]) -> np.ndarray:
    array, where = _v2_infer(endpoint, {"QUERY": [query] * len(texts), "TEXT": texts}, "SCORE")
    if array.size != len(texts):
        raise AuditError(f"{where}: expected {len(texts)} scores, got an array of shape {array.shape}")
    return _scores([{"index": i, "score": s} for i, s in enumerate(array.reshape(-1))], len(texts), where)


# Protocol -> how to get one relevance score per text for a query, in the texts' order.
SCORERS: dict[Protocol, Callable[[Endpoint, str, Sequence[str]], np.ndarray]] = {
    Protocol.OPENAI: _cohere_rerank, Protocol.TEI: _tei_rerank, Protocol.KILN: _kiln_rerank, Protocol.V2: _v2_rerank,
    Protocol.COHERE: lambda e, q, t: _cohere_rerank(e, q, t, "/v2/rerank")}


def rerank(endpoint: Endpoint, query: str, texts: Sequence[str]) -> np.ndarray:
    return SCORERS[endpoint.protocol](endpoint, query, texts)


def _openai_complete(endpoint: Endpoint, prompt: str, max_tokens: int) -> tuple[str, int | None]:
    # OpenAI's completions API, as kiln serve, vLLM, TGI and llama.cpp's server speak it: greedy at temperature 0.
    path = "/v1/completions" if not endpoint.url.endswith("/v1") else "/completions"
    where = f"{endpoint.url}{path}"
    body = _post(endpoint, path, {"model": endpoint.model or "default", "prompt": prompt, "max_tokens": max_tokens,
                                  "temperature": 0})
    try:
        text = body["choices"][0]["text"]
    except (KeyError, IndexError, TypeError) as err:
        raise AuditError(f"{where}: not an OpenAI completions answer (no choices[0].text)") from err
    if not isinstance(text, str):
        raise AuditError(f"{where}: choices[0].text is {type(text).__name__}, not text")
    usage = body.get("usage") if isinstance(body, dict) else None
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return text, prompt_tokens if isinstance(prompt_tokens, int) else None


# Protocol -> how to ask for a greedy completion of one prompt: (text, the prompt's tokens as the server counts them).
COMPLETERS: dict[Protocol, Callable[[Endpoint, str, int], tuple[str, int | None]]] = {
    Protocol.OPENAI: _openai_complete}


def require_completer(protocol: Protocol) -> None:
    """A UsageError unless kiln audit can ask for completions over ``protocol``."""
    if protocol not in COMPLETERS:
        raise UsageError(f"protocol {protocol.value}: kiln audit asks a decoder's deployment through the "
                         f"completions API of: {', '.join(p.value for p in COMPLETERS)}")


def complete(endpoint: Endpoint, prompt: str, max_tokens: int) -> tuple[str, int | None]:
    require_completer(endpoint.protocol)
    return COMPLETERS[endpoint.protocol](endpoint, prompt, max_tokens)
