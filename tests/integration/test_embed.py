"""kiln embed: ordered Parquet parts equal to the predictor's vectors, resume after SIGKILL, the same job on Ray."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.bulk.job import EmbedConfig, run_embed
from kiln.bulk.parts import JOB_FILE, finished_parts, read_output
from kiln.data.texts import builtin_sentences, joined
from kiln.errors import UsageError
from kiln.tasks import TaskName
from tests.waiting import wait_until


def corpus_texts(count: int) -> list[str]:
    """Mixed lengths: one to five built-in sentences per text."""
    return [joined(i, 1 + i % 5) for i in range(count)]


def write_corpus(path: Path, texts: list[str]) -> Path:
    rows = [{"doc": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif path.suffix == ".csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["doc", "text"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def vectors(output: Path) -> tuple[list, np.ndarray]:
    table = read_output(output)
    return table.column("id").to_pylist(), np.array(table.column("vector").to_pylist(), dtype=np.float32)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_parts_hold_every_text_in_order_as_the_predictor_embeds_it(tiny_artifact, tmp_path, suffix):
    texts = corpus_texts(150)
    source = write_corpus(tmp_path / f"corpus{suffix}", texts)
    summary = run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "out", id_field="doc", rows_per_part=64,
                                    window=16))
    ids, got = vectors(tmp_path / "out")
    assert (summary.rows, summary.parts, summary.dimension) == (150, 3, 32)
    assert finished_parts(tmp_path / "out") == {0, 1, 2}
    assert ids == [f"doc-{i}" for i in range(150)]
    np.testing.assert_allclose(got, np.stack(kiln.load(tiny_artifact).predict(texts)), atol=1e-5)


def test_a_killed_job_resumes_to_the_uninterrupted_output(tiny_artifact, tmp_path):
    source = write_corpus(tmp_path / "corpus.jsonl", corpus_texts(6000))
    whole = tmp_path / "whole"
    run_embed(EmbedConfig(tiny_artifact, source, whole, rows_per_part=100, window=50))
    cut = tmp_path / "cut"
    command = [sys.executable, "-m", "kiln", "embed", str(tiny_artifact), str(source), "-o", str(cut),
               "--rows-per-part", "100", "--window", "50"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(finished_parts(cut)) >= 3 or proc.poll() is not None, "three parts", timeout=120,
                   poll=0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    before = {p.name: p.stat().st_mtime_ns for p in cut.glob("part-*.parquet")}
    assert 3 <= len(before) < 60, "the job was killed before it finished"
    with pytest.raises(UsageError, match="pass --resume to continue it, or --force"):
        run_embed(EmbedConfig(tiny_artifact, source, cut, rows_per_part=100, window=50))
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(before)} kept from the interrupted run" in resumed.stdout
    assert {p.name: p.stat().st_mtime_ns for p in cut.glob("part-*.parquet") if p.name in before} == before
    assert not list(cut.glob(".part-*"))  # no half part left behind
    ids_cut, got = vectors(cut)
    ids_whole, want = vectors(whole)
    assert ids_cut == ids_whole == list(range(6000))
    np.testing.assert_array_equal(got, want)


def test_resume_refuses_parts_of_another_job_and_errors_name_the_parameter(tiny_artifact, task_artifacts, tmp_path):
    source = write_corpus(tmp_path / "corpus.jsonl", corpus_texts(20))
    run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "out", rows_per_part=10))
    with pytest.raises(UsageError, match=r"holds parts of another job \(rows_per_part differ"):
        run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "out", rows_per_part=5, resume=True))
    record = json.loads((tmp_path / "out" / JOB_FILE).read_text())
    assert record["rows"] == 20 and record["dimension"] == 32
    with pytest.raises(UsageError, match=r"has no column 'body' \(text_field\); it has: doc, text"):
        run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "o2", text_field="body"))
    with pytest.raises(UsageError, match="kiln embed needs an artifact of feature-extraction.*multi-vector"):
        run_embed(EmbedConfig(task_artifacts[TaskName.TEXT_CLASSIFICATION], source, tmp_path / "o3"))
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": "fine"}\n{"text": "  "}\n')
    with pytest.raises(UsageError, match=r"row 2: 'text' must be a non-blank string"):
        run_embed(EmbedConfig(tiny_artifact, blank, tmp_path / "o4"))
    with pytest.raises(UsageError, match="unsupported format .txt"):
        run_embed(EmbedConfig(tiny_artifact, tmp_path / "corpus.txt", tmp_path / "o5"))


def test_without_ray_installed_the_error_gives_the_install_hint(tiny_artifact, tmp_path, monkeypatch):
    source = write_corpus(tmp_path / "corpus.jsonl", builtin_sentences()[:4])
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError, match=r"pip install 'kiln\[ray\]'"):
        run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "out", ray="local"))


def test_on_a_local_ray_cluster_the_output_equals_the_single_process_one(tiny_artifact, task_artifacts, tmp_path):
    """One local cluster (a Ray cluster's processes cost ~30 CPU-s to start on 2 cores) for both shapes of output:
    a vector per text, and a multi-vector model's ragged token vectors through Ray Data, each in input order."""
    ray = pytest.importorskip("ray")
    source = write_corpus(tmp_path / "corpus.parquet", corpus_texts(300))
    run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "single", id_field="doc", rows_per_part=128, window=32))
    multi = task_artifacts[TaskName.MULTI_VECTOR]
    documents = [joined(i, 1 + i % 7) for i in range(9)]  # 1 to 7 sentences: token vectors of many counts
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_embed(EmbedConfig(tiny_artifact, source, tmp_path / "ray", id_field="doc", rows_per_part=128,
                                        window=32, ray="auto", threads=1))
        run_embed(EmbedConfig(multi, write_corpus(tmp_path / "documents.jsonl", documents), tmp_path / "multi",
                              rows_per_part=2, window=2, ray="auto", threads=1))
    finally:
        ray.shutdown()
    assert summary.parts == 3 and summary.rows_embedded == 300
    ids_ray, on_ray = vectors(tmp_path / "ray")
    ids_single, single = vectors(tmp_path / "single")
    assert ids_ray == ids_single
    np.testing.assert_allclose(on_ray, single, atol=1e-6)
    rows = read_output(tmp_path / "multi").column("vectors").to_pylist()
    want = kiln.load(multi).predict(documents)
    assert len(rows) == len(documents) and len({len(w) for w in want}) > 3
    for got, expected in zip(rows, want):
        np.testing.assert_allclose(np.array(got), expected, atol=1e-6)


def test_ray_local_starts_a_cluster_of_this_processs_cores(monkeypatch):
    """--ray local (ray="local") starts a cluster here, sized to the cores this process may use; any other value is
    an address to connect to (the cluster tests above run on one the test starts, with ray="auto")."""
    import os

    from kiln.bulk import on_ray

    calls = []

    class FakeRay:
        @staticmethod
        def init(**kwargs):
            calls.append(kwargs)

    on_ray._connect(FakeRay, on_ray.LOCAL)
    on_ray._connect(FakeRay, "ray://head:10001")
    assert calls == [{"num_cpus": len(os.sched_getaffinity(0)), "include_dashboard": False, "log_to_driver": False},
                     {"address": "ray://head:10001", "include_dashboard": False, "log_to_driver": False}]
