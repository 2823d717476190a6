"""kiln triton: repositories that parse with Triton's schema, a checker that finds miswiring, and a real
tritonserver (PyPI's nvidia-pytriton) answering like kiln's offline predictor, batching concurrent requests."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.data.texts import builtin_sentences, joined
from kiln.errors import ArtifactError, UsageError
from kiln.integrations.triton.check import check_repository, read_configs
from kiln.integrations.triton.repository import TritonConfig, write_repository
from kiln.integrations.triton.server import find_install, start_triton
from kiln.tasks import QAInput, TaskName
from kiln.tasks.wire import task_wire

TEXTS = [builtin_sentences()[3], "Anna Schmidt works for Acme Corporation in Berlin.", joined(5, 6)]


def _repo(artifact: Path, out: Path, **kwargs) -> Path:
    return write_repository(TritonConfig(artifact=artifact, output=out, name=out.name, **kwargs))


def test_gpu_repository_parses_and_matches_the_onnx_graph(task_artifacts, tmp_path):
    repo = _repo(task_artifacts[TaskName.TEXT_CLASSIFICATION], tmp_path / "r", device="tensorrt",
                 buckets=(32, 64, 128), instances=2)
    configs = read_configs(repo)
    assert set(configs) == {"r", "r_tokenizer", "r_model", "r_post"}
    model = configs["r_model"]
    assert model.backend == "onnxruntime" and model.max_batch_size == 32 and model.instance_group[0].count == 2
    assert model.instance_group[0].kind == model.instance_group[0].KIND_GPU
    assert [list(i.dims) for i in model.input] == [[-1]] * len(model.input)  # batch-free dims
    assert [list(o.dims) for o in model.output] == [[-1]]  # sequence-level logits
    assert model.dynamic_batching.max_queue_delay_microseconds == 2000
    accelerator = model.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    assert configs["r"].platform == "ensemble"
    assert [s.model_name for s in configs["r"].ensemble_scheduling.step] == ["r_tokenizer", "r_model", "r_post"]
    assert "# buckets (padded lengths, from the token lengths of kiln's timing mix): [32, 64, 128]" in \
        (repo / "r_tokenizer" / "config.pbtxt").read_text()
    assert (repo / "r_model" / "1" / "model.onnx").is_file() and (repo / "README.md").is_file()


def test_the_checker_finds_miswiring(tiny_artifact, tmp_path):
    repo = _repo(tiny_artifact, tmp_path / "r", python_model=True)
    check_repository(repo)  # as written: fine
    model = repo / "r_model" / "config.pbtxt"
    model.write_text(model.read_text().replace("max_batch_size: 32", "max_batch_size: 0"))
    post = repo / "r_post" / "config.pbtxt"
    post.write_text(post.read_text().replace('name: "attention_mask"\n  data_type: TYPE_INT64',
                                             'name: "attention_mask"\n  data_type: TYPE_FP32'))
    ensemble = repo / "r" / "config.pbtxt"
    ensemble.write_text(ensemble.read_text().replace('value: "last_hidden_state"\n    }\n    output_map',
                                                     'value: "hidden"\n    }\n    output_map', 1))
    with pytest.raises(ArtifactError) as err:
        check_repository(repo)
    message = str(err.value)
    assert "r_model: max_batch_size 0 turns dynamic batching off" in message
    assert "is TYPE_INT64 but r_post.attention_mask takes TYPE_FP32" in message


def test_onnx_dims_are_checked_against_the_graph(tiny_artifact, tmp_path):
    repo = _repo(tiny_artifact, tmp_path / "g", device="cuda")
    config = repo / "g_model" / "config.pbtxt"
    config.write_text(config.read_text().replace("  dims: -1\n  dims: -1\n", "  dims: -1\n", 1))
    with pytest.raises(ArtifactError, match="last_hidden_state has 2 dims .batch excluded. in the graph, 1 in"):
        check_repository(repo)


def test_a_row_by_row_variant_keeps_its_batch_invariance_on_triton(tiny_artifact, tmp_path):
    """onnx-int8-dynamic-rows is batch-invariant only inside kiln's engine (each row run alone): the repository runs
    it in the Python step, and refuses a GPU backend that would batch it."""
    import json
    import shutil

    from kiln.artifact.manifest import MANIFEST_NAME

    rows = tmp_path / "rows"
    shutil.copytree(tiny_artifact, rows)
    manifest = json.loads((rows / MANIFEST_NAME).read_text())
    manifest["variants"]["onnx-fp32"]["options"]["rows_alone"] = True
    (rows / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert read_configs(_repo(rows, tmp_path / "r"))["r_model"].backend == "python"
    assert read_configs(_repo(tiny_artifact, tmp_path / "plain"))["plain_model"].backend == "onnxruntime"
    with pytest.raises(UsageError, match="runs each row of a batch alone to stay batch-invariant"):
        _repo(rows, tmp_path / "gpu", device="cuda")


def test_question_answering_needs_the_python_model_step(task_artifacts, tmp_path):
    with pytest.raises(UsageError, match="question-answering inputs become several windows each.*--python-model"):
        _repo(task_artifacts[TaskName.QUESTION_ANSWERING], tmp_path / "qa", device="cuda")
    repo = _repo(task_artifacts[TaskName.QUESTION_ANSWERING], tmp_path / "qa", python_model=True)
    configs = read_configs(repo)
    assert [i.name for i in configs["qa"].input] == ["QUESTION", "CONTEXT"]
    assert [list(i.dims) for i in configs["qa_model"].input] == [[-1, -1]] * len(configs["qa_model"].input)


@pytest.fixture(scope="module")
def triton_install():
    install = find_install(Path(__file__).resolve().parents[2] / ".venv-triton")
    if isinstance(install, str):
        pytest.skip(install)
    return install


@pytest.fixture(scope="module")
def served(triton_install, task_artifacts, tmp_path_factory):
    """One tritonserver with a CPU (--python-model) repository per task kiln triton writes one for."""
    root = tmp_path_factory.mktemp("triton")
    repo = root / "repo"
    repo.mkdir()
    tasks = [t for t in task_artifacts if task_wire(t).triton_refusal() is None]
    for task in tasks:
        part = _repo(task_artifacts[task], root / task.value.replace("-", "_"), python_model=True,
                     max_queue_delay_us=20_000)
        for model in part.iterdir():
            if model.is_dir():
                model.rename(repo / model.name)
    running = start_triton(triton_install, repo, root / "tritonserver.log")
    yield running, {t: t.value.replace("-", "_") for t in tasks}
    running.stop()


def _infer(client_module, port: int, model: str, texts: list[str], output: str) -> np.ndarray:
    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    text = client_module.InferInput("TEXT", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return client.infer(model, [text]).as_numpy(output)


def test_triton_answers_questions_over_several_windows(served, task_artifacts):
    import json

    import tritonclient.http as http

    running, names = served
    pairs = [(builtin_sentences()[2], joined(6, 5)), (builtin_sentences()[7], builtin_sentences()[8])]
    client = http.InferenceServerClient(f"127.0.0.1:{running.http_port}")
    inputs = []
    for name, column in (("QUESTION", 0), ("CONTEXT", 1)):
        tensor = http.InferInput(name, [len(pairs), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[p[column].encode()] for p in pairs], dtype=object))
        inputs.append(tensor)
    got = [json.loads(row[0]) for row in client.infer(names[TaskName.QUESTION_ANSWERING], inputs).as_numpy("RESULT")]
    want = kiln.load(task_artifacts[TaskName.QUESTION_ANSWERING]).predict([QAInput(q, c) for q, c in pairs])
    assert kiln.load(task_artifacts[TaskName.QUESTION_ANSWERING]).prepare([QAInput(*pairs[0])]).owners.count(0) > 1
    for g, w in zip(got, want):
        assert [(a["answer"], a["start"], a["end"]) for a in g] == [(a.answer, a.start, a.end) for a in w]
        np.testing.assert_allclose([a["score"] for a in g], [a.score for a in w], atol=1e-5)


def check_answers_like_kiln(module, port: int, names: dict, task_artifacts: dict) -> None:
    """Triton client code for the repository's models (embeddings, classification, tagging) against the offline
    predictor; tests/e2e/test_serve_protocols.py runs the same code against kiln serve."""
    import json

    embeddings = _infer(module, port, names[TaskName.FEATURE_EXTRACTION], TEXTS, "EMBEDDING")
    offline = np.stack(kiln.load(task_artifacts[TaskName.FEATURE_EXTRACTION]).predict(TEXTS))
    np.testing.assert_allclose(embeddings, offline, atol=1e-5)
    for task in (TaskName.TEXT_CLASSIFICATION, TaskName.TOKEN_CLASSIFICATION):
        raw = _infer(module, port, names[task], TEXTS, "RESULT")
        got = [json.loads(row[0]) for row in raw]
        want = kiln.load(task_artifacts[task]).predict(TEXTS)
        for g, w in zip(got, want):
            assert [x["label"] for x in g] == [x.label for x in w]
            np.testing.assert_allclose([x["score"] for x in g], [x.score for x in w], atol=1e-5)
            if task is TaskName.TOKEN_CLASSIFICATION:
                assert [(x["start"], x["end"], x["word"]) for x in g] == [(x.start, x.end, x.word) for x in w]


def check_rerank_like_kiln(module, port: int, names: dict, task_artifacts: dict) -> None:
    """(QUERY, TEXT) rows -> SCORE against kiln's rerank, with the same client code on either server."""
    query, texts = builtin_sentences()[3], list(builtin_sentences()[10:14])
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = []
    for name, column in (("QUERY", [query] * len(texts)), ("TEXT", texts)):
        tensor = module.InferInput(name, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in column], dtype=object))
        inputs.append(tensor)
    got = client.infer(names[TaskName.TEXT_RANKING], inputs).as_numpy("SCORE")[:, 0]
    want = {r.index: r.score for r in kiln.load(task_artifacts[TaskName.TEXT_RANKING]).rerank(query, texts)}
    np.testing.assert_allclose(got, [want[i] for i in range(len(texts))], atol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_answers_like_kiln(served, task_artifacts, protocol):
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    running, names = served
    module, port = (http, running.http_port) if protocol == "http" else (grpc, running.grpc_port)
    check_answers_like_kiln(module, port, names, task_artifacts)


def test_concurrent_requests_are_batched(served):
    import tritonclient.http as http

    running, names = served
    model = names[TaskName.FEATURE_EXTRACTION]
    barrier = threading.Barrier(16)

    def one(k: int) -> np.ndarray:
        barrier.wait(timeout=30)  # all at once, so the model step's queue holds several requests
        return _infer(http, running.http_port, model, [builtin_sentences()[k % 5]], "EMBEDDING")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))
    assert all(r.shape == (1, 32) for r in results)
    stats = http.InferenceServerClient(f"127.0.0.1:{running.http_port}").get_inference_statistics(f"{model}_model")
    entry = stats["model_stats"][0]
    assert entry["inference_count"] > entry["execution_count"], entry  # batches larger than 1


def test_triton_scores_query_text_pairs_like_kiln_rerank(served, task_artifacts):
    import tritonclient.http as http

    running, names = served
    check_rerank_like_kiln(http, running.http_port, names, task_artifacts)


@pytest.mark.parametrize("task", [TaskName.FEATURE_EXTRACTION, TaskName.TEXT_RANKING])
def test_kiln_audit_asks_triton_over_v2(served, tiny_model, task, tmp_path):
    """kiln audit's v2 adapter against a real tritonserver: TEXT -> EMBEDDING, and (QUERY, TEXT) -> SCORE."""
    from kiln.auditing.job import AuditConfig, run_audit
    from kiln.auditing.protocols import Endpoint

    running, names = served
    result = run_audit(AuditConfig(Endpoint(f"http://127.0.0.1:{running.http_port}", "v2", names[task]),
                                   str(tiny_model("bert", task)), count=24, output=tmp_path, task=task.value))
    assert result.within_tolerance and result.min_agreement > 0.9999, result.verdict()
    assert not any(f.differs for f in result.findings), result.findings
