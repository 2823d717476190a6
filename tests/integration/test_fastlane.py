"""The inference routes' fast lane (kiln.serving.fastlane) answers exactly as FastAPI does, and takes valid bodies."""

from __future__ import annotations

import orjson
from fastapi.testclient import TestClient

from kiln.serving.app import ServeConfig, create_app
from kiln.tasks import TaskName

JSON = "application/json"
# Valid and invalid bodies for every encoder route: each route takes some and refuses the rest, with FastAPI's
# exact message on either path.
BODIES: list[bytes] = [orjson.dumps(b) for b in (
    {"inputs": "a short text"}, {"inputs": ["one", "two"]},
    {"input": "openai style", "model": "feature-extraction"}, {"input": ["a", "b"], "model": "nope"},
    {"query": "what", "texts": ["this", "that"]}, {"inputs": {"question": "who", "context": "someone did"}},
    {"inputs": "a query", "is_query": True}, {"inputs": {"text": "a", "text_pair": "b"}}, {"inputs": [["a", "b"]]},
    {}, [], "text", {"inputs": 5}, {"inputs": ""}, {"inputs": "   "}, {"inputs": "x", "unknown": 1},
    {"inputs": "x", "truncate": "yes"}, {"inputs": "x", "normalize": "true"}, {"inputs": "x", "model": "nope"},
    {"inputs": "x", "dimensions": 0}, {"inputs": ["x"] * 70},
    {"input": "x", "model": "feature-extraction", "encoding_format": "base64"},
    {"query": "what", "documents": ["this", {"text": "that"}], "model": "text-ranking"},
    {"query": "what", "documents": []},
)] + [b'{"inputs": ', b'{"inputs": "x", "f": NaN}', b""]
CONTENT_TYPES = [JSON, "application/json; charset=utf-8", "text/plain", None]


def answers(client: TestClient, path: str) -> list[tuple[int, object]]:
    out = []
    for body in BODIES:
        for content_type in CONTENT_TYPES if body == BODIES[0] else [JSON]:
            headers = {"content-type": content_type} if content_type else {}
            response = client.post(path, content=body, headers=headers)
            answer = response.json()
            if isinstance(answer, dict):
                answer.pop("id", None)  # Cohere's answer: a new id per request
            out.append((response.status_code, answer))
    return out


def test_the_fast_lane_answers_every_body_as_fastapi_does_and_takes_the_valid_ones(task_artifacts):
    models = {task.value: path for task, path in task_artifacts.items() if task is not TaskName.TEXT_GENERATION}
    apps = {lane: create_app(ServeConfig(models=models, sessions=1, fast_lane=lane)) for lane in (True, False)}
    with TestClient(apps[True]) as fast, TestClient(apps[False]) as plain:
        paths = sorted(apps[True].state.fast_routes)
        assert {"/kiln/embed", "/v1/embeddings", "/classify", "/kiln/rerank"} <= set(paths)
        seen = {path: (answers(fast, path), answers(plain, path)) for path in paths}
    lane = apps[True].state.fast_lane
    assert not hasattr(apps[False].state, "fast_lane")
    for path, (through_lane, through_fastapi) in seen.items():
        assert through_lane == through_fastapi, path
        statuses = {status for status, _ in through_lane}
        assert 200 in statuses and 422 in statuses, (path, statuses)  # the corpus exercises both ways
    # Every 200 went through the lane (and the endpoint's own refusals: an unknown model, too many inputs).
    assert lane.served >= sum(status == 200 for pair in seen.values() for status, _ in pair[0]) > 0
