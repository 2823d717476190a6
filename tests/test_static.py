"""kiln distill --static: a static-embedding model from a teacher, in sentence-transformers' format, whose vectors
sentence-transformers and kiln's numpy reading agree on; deterministic; bad options refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from kiln.compress.static import LINEAGE_FILE, encode_static, principal_components, sif_weights
from kiln.data.texts import builtin_sentences
from kiln.tasks import TaskName


def _distill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "distill", *args], capture_output=True, text=True,
                          timeout=300)


def test_a_static_student_loads_in_sentence_transformers_and_agrees_with_kiln(tiny_model, tmp_path):
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    teacher = tiny_model("bert")
    run = _distill(str(teacher), "--static", "--dims", "16", "-o", str(tmp_path / "static"))
    assert run.returncode == 0, run.stderr
    assert "dimensions" in run.stdout and "of the variance" in run.stdout
    texts = list(builtin_sentences()[:8]) + ["", "x"]
    theirs = SentenceTransformer(str(tmp_path / "static"), device="cpu").encode(texts)
    ours = encode_static(tmp_path / "static", texts)
    assert theirs.shape == (len(texts), 16)
    np.testing.assert_allclose(ours[:-2], theirs[:-2], atol=1e-6)
    table = load_file(str(tmp_path / "static" / "model.safetensors"))["embedding.weight"]
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    assert not table[tokenizer.all_special_ids].any()  # special tokens get no row: they carry no meaning alone
    lineage = json.loads((tmp_path / "static" / LINEAGE_FILE).read_text())
    assert lineage["recipe"]["dims"] == 16 and lineage["teacher"] and 0 < lineage["explained_variance"] <= 1
    again = _distill(str(teacher), "--static", "--dims", "16", "-o", str(tmp_path / "again"))
    assert again.returncode == 0 and np.array_equal(
        table, load_file(str(tmp_path / "again" / "model.safetensors"))["embedding.weight"])


def test_the_recipe_pieces():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 12)) @ np.diag(np.linspace(3, 0.1, 12))
    reduced, explained = principal_components(vectors.astype(np.float32), 4)
    assert reduced.shape == (200, 4) and 0.5 < explained < 1
    variances = reduced.var(axis=0)
    assert np.all(np.diff(variances) <= 1e-6)  # components in order of the variance they hold
    weights = sif_weights(1000, 1e-4)
    assert weights[0] < weights[10] < weights[-1] < 1  # frequent (low-rank) tokens weigh less


def test_bad_static_options_are_one_clear_error(tiny_model, tmp_path):
    wrong_task = _distill(str(tiny_model("bert")), "--static", "--task", TaskName.TEXT_CLASSIFICATION.value,
                          "-o", str(tmp_path / "x"))
    assert wrong_task.returncode == 2 and "--static distils a sentence-embedding model" in wrong_task.stderr
    zero = _distill(str(tiny_model("bert")), "--static", "--dims", "0", "-o", str(tmp_path / "y"))
    assert zero.returncode == 2 and "--dims" in zero.stderr


def test_the_static_artifact_serves_what_sentence_transformers_computes(tiny_model, tmp_path):
    """The artifact kiln distill --static writes beside the model: kiln.load().encode(), kiln serve and kiln embed
    give sentence-transformers' vectors (a table lookup and a mean; no ONNX, no torch)."""
    import httpx
    from sentence_transformers import SentenceTransformer

    import kiln
    from kiln.serve import process
    from kiln.serve.app import ServeConfig, create_app

    out = tmp_path / "static"
    assert _distill(str(tiny_model("bert")), "--static", "--dims", "16", "-o", str(out)).returncode == 0
    texts = list(builtin_sentences()[:10])
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    predictor = kiln.load(out / "artifact")
    np.testing.assert_allclose(predictor.encode(texts), theirs, atol=1e-6)
    with process.serve_in_thread(create_app(ServeConfig(models={"s": out / "artifact"}))) as base:
        served = np.array(httpx.post(f"{base}/embed", json={"inputs": texts}).json()["embeddings"])
    np.testing.assert_allclose(served, theirs, atol=1e-6)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run = subprocess.run([sys.executable, "-m", "kiln", "embed", str(out / "artifact"), str(corpus), "-o",
                          str(tmp_path / "vectors")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import pyarrow.parquet as pq

    stored = np.array(pq.read_table(tmp_path / "vectors" / "part-00000.parquet").column("vector").to_pylist())
    np.testing.assert_allclose(stored, theirs, atol=1e-6)
