"""The served OpenAPI schema tells the truth (fuzzed with schemathesis), and the request limits it declares."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kiln.artifact.directory import Artifact
from kiln.serving import process
from kiln.serving.app import ServeConfig, create_app
from kiln.tasks import TaskName

# 413 is this API's documented answer for too many inputs (maxItems) and over-long inputs. "chunking" on kiln's
# /kiln/embed and /kiln/classify (/classify too) has constraints between fields JSON Schema cannot state (overlap <
# size; size within the served model's window, which depends on its tokenizer), and so has a v2 inference body (a
# tensor's shape against its data, and the input names of the model the path names): a body that breaks one gets a
# 422 (v2: 400) naming it, so there, and only there, schema-valid data may be refused.
ST_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]

[[operations]]
include-path-regex = "^(/kiln)?/(embed|classify)$|/infer$"
# schemathesis's default for positive data, plus 422
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", 400, 401, 403, 404, 409, 422, 429, "5xx"]
"""


def test_fuzzing_the_served_schema_finds_no_failure(task_artifacts, tmp_path):
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is a test dependency (pip install 'kiln[test]')"
    config = tmp_path / "schemathesis.toml"
    config.write_text(ST_CONFIG)
    models = [arg for task, path in task_artifacts.items() for arg in ("--model", f"{task.value}={path}")]
    proc, port = process.start_server([sys.executable, "-m", "kiln", "serve", *models])
    try:
        run = subprocess.run([st, "--config-file", str(config), "run", f"http://127.0.0.1:{port}/openapi.json",
                              "--checks", "all", "--max-examples", "40", "--generation-deterministic", "--no-color",
                              "--request-timeout", "30"], capture_output=True, text=True, timeout=600,
                             cwd=tmp_path)  # its example cache goes to the scratch directory, not the repository
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report = run.stdout[-8000:]
    assert run.returncode == 0, report
    operations = [line for line in report.splitlines() if "Tested:" in line]
    # every route: kiln's 8 task routes under /kiln/ (multi-vector's /embed_multi, hybrid-embedding's /embed_hybrid
    # among them) and the 5 of them TEI does not define at their bare path too, OpenAI's /v1/embeddings and
    # /embeddings, 7 probes (/ping, /kiln/info, the playground's GET / among them), TEI's /embed, /rerank, /info,
    # /embed_all, /embed_sparse, /predict, /tokenize and /decode and its POST / and /invocations (the first model's TEI
    # route), the Inference API's /token_classification,
    # v2's 9 (server, live, ready, and model metadata, ready and infer with and without a version), and Cohere's
    # /v1/rerank and /v2/rerank
    assert operations and operations[-1].split()[-1] == "44", report
    generated = [line for line in report.splitlines() if "generated" in line]
    assert generated and int(generated[-1].split()[0]) >= 100, report


def _client(artifact, **kwargs) -> TestClient:
    return TestClient(create_app(ServeConfig(models={"m": artifact}, **kwargs)))


def test_too_many_inputs_is_413_and_declared(tiny_artifact):
    with _client(tiny_artifact, max_inputs_per_request=3) as client:
        assert client.post("/kiln/embed", json={"inputs": ["a", "b", "c"]}).status_code == 200
        refused = client.post("/kiln/embed", json={"inputs": ["a", "b", "c", "d"]})
        schema = client.get("/openapi.json").json()
    assert refused.status_code == 413 and refused.json()["error"]["type"] == "too_many_inputs"
    assert "the limit is 3 (--max-inputs-per-request)" in refused.json()["error"]["message"]
    inputs = schema["components"]["schemas"]["EmbedRequest"]["properties"]["inputs"]["anyOf"]
    assert {"type": "array", "maxItems": 3}.items() <= next(v for v in inputs if v.get("type") == "array").items()


def test_matryoshka_dimensions_cut_the_vector_and_the_schema_says_the_maximum(tiny_artifact):
    full = Artifact.open(tiny_artifact).predictor().predict(["hello world"])[0]
    with _client(tiny_artifact) as client:
        cut = client.post("/v1/embeddings", json={"input": "hello world", "model": "m", "dimensions": 8})
        embed = client.post("/kiln/embed", json={"inputs": ["hello world"], "dimensions": 8})
        too_large = client.post("/v1/embeddings", json={"input": "hello", "model": "m", "dimensions": 33})
        zero = client.post("/kiln/embed", json={"inputs": "hello", "dimensions": 0})
        schema = client.get("/openapi.json").json()
    assert cut.status_code == 200 and embed.status_code == 200
    # The tiny model does not normalise: the first 8 values as they are.
    np.testing.assert_allclose(cut.json()["data"][0]["embedding"], full[:8], atol=1e-5)
    np.testing.assert_allclose(embed.json()["embeddings"][0], full[:8], atol=1e-5)
    assert too_large.status_code == 422
    assert "dimensions must be between 1 and the model's size 32 (got 33)" in too_large.json()["error"]["message"]
    assert zero.status_code == 422 and "dimensions" in zero.json()["error"]["message"]
    for request in ("EmbedRequest", "OpenAIEmbeddingRequest"):
        allowed = schema["components"]["schemas"][request]["properties"]["dimensions"]["anyOf"]
        assert {"type": "integer", "minimum": 1, "maximum": 32}.items() <= allowed[0].items()


def test_only_the_served_tasks_routes_exist(task_artifacts):
    """kiln's and OpenAI's routes of the served task only (a QA model: no /embed, no TEI task route), the probes,
    and with the default --protocols the v2 routes and TEI's server routes."""
    with _client(task_artifacts[TaskName.QUESTION_ANSWERING]) as client:
        paths = set(client.get("/openapi.json").json()["paths"])
        embed = client.post("/embed", json={"inputs": "x"})
    v2 = {"/v2", "/v2/health/live", "/v2/health/ready"} | {f"/v2/models/{{name}}{version}{end}" for version in (
        "", "/versions/{version}") for end in ("", "/ready", "/infer")}
    # kiln's own routes under /kiln/ (and bare where TEI has no such path); /info is TEI's, kiln's at /kiln/info
    assert {"/", "/answer", "/kiln/answer", "/health", "/ping", "/ready", "/info", "/kiln/info", "/metrics",
            "/v1/models", "/tokenize", "/decode"} | v2 == paths  # GET / is the playground; POST / only for a TEI route
    assert embed.status_code == 404 and embed.json()["error"]["type"] == "not_found"
    with _client(task_artifacts[TaskName.QUESTION_ANSWERING], protocols=("kiln",)) as client:
        assert set(client.get("/openapi.json").json()["paths"]) == {
            "/", "/answer", "/kiln/answer", "/health", "/ping", "/ready", "/info", "/kiln/info", "/metrics",
            "/v1/models"}


def test_pooling_and_finalisation_run_off_the_event_loop(task_artifacts, monkeypatch):
    from kiln.tasks.token_classification.task import TokenClassification

    threads: dict[str, set[str]] = {"reduce": set(), "finalize": set()}
    for step in threads:
        original = getattr(TokenClassification, step)

        def recording(self, *args, _original=original, _step=step):
            threads[_step].add(threading.current_thread().name)
            return _original(self, *args)

        monkeypatch.setattr(TokenClassification, step, recording)
    with _client(task_artifacts[TaskName.TOKEN_CLASSIFICATION]) as client:
        loop_thread = threading.current_thread().name  # TestClient runs the loop in a portal thread: see below
        response = client.post("/tokens", json={"inputs": ["Anna lives in Berlin", "so does Jean"]})
    assert response.status_code == 200
    assert threads["reduce"] and all(name.startswith("kiln-engine-") for name in threads["reduce"]), threads
    assert threads["finalize"] and all(name.startswith("kiln-tokenize") for name in threads["finalize"]), threads
    assert loop_thread not in threads["reduce"] | threads["finalize"]


@pytest.mark.parametrize(("body", "fragment"), [
    ({"inputs": [{"text": "a", "text_pair": "b", "extra": 1}]}, "extra"),
    ({"inputs": "x", "top_k": True}, "top_k"),  # strict: true is not 1
    ({"inputs": "x", "truncate": 1}, "truncate"),  # strict: 1 is not true
])
def test_strict_bodies(task_artifacts, body, fragment):
    with _client(task_artifacts[TaskName.TEXT_CLASSIFICATION]) as client:
        response = client.post("/classify", json=body)
    assert response.status_code == 422 and fragment in response.json()["error"]["message"]
