"""kiln bench on a tiny artifact: grid statistics, mix, memory, load time, sweep, serving default, compare."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from importlib.util import find_spec

import numpy as np
import pytest

from kiln.artifact.directory import Artifact
from kiln.artifact.manifest import read_manifest, seal
from kiln.benchmarking.compare import compare
from kiln.benchmarking.job import (
    SERVING_FILE,
    SWEEP_BATCH_SIZES,
    SWEEP_PAD_MULTIPLES,
    BenchConfig,
    BenchJob,
    sweep_points,
)
from kiln.choices import ExportFormat
from kiln.errors import UsageError
from kiln.exporting.job import ExportConfig, run_export
from kiln.records.bench import SCHEMA, read_results
from kiln.system.cpu import cpu_info
from kiln.tasks import TaskName


@pytest.fixture(scope="module")
def benched(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    art = root / "art"
    run_export(ExportConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                            format=ExportFormat.ONNX, output=art))
    shutil.copytree(art, root / "best")  # laid out like `kiln optimize` output: the chosen variant in best/
    shutil.move(root / "best", art / "best")
    seal(art, read_manifest(art))
    lengths = root / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (12, 40, 90, 20, 64, 128, 33, 7) * 4))
    results = BenchJob(BenchConfig(target=str(art), output=root / "out", batch_sizes=(1, 4), seq_lens=(16, 64, 512),
                                   lengths_file=lengths, threads=1)).run()
    return art, root / "out", results


def test_results_schema_and_environment(benched):
    _, out, results = benched
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["schema"] == SCHEMA == "kiln.bench/2"
    read = read_results(out / "results.json")  # the typed record comes back as written
    assert (read.targets, read.settings, read.serving_default) == (results.targets, results.settings,
                                                                   results.serving_default)
    env = on_disk["environment"]
    assert {"cpu", "memory_gb", "gpus", "versions", "execution_providers"} <= env.keys()
    assert env["cpu"]["features"] is not None and "onnxruntime" in env["versions"]
    assert [t["name"] for t in on_disk["targets"]] == ["pytorch-fp32", "onnx-fp32"]  # the baseline in the same run


def test_grid_statistics_and_skipped_cells(benched):
    _, _, results = benched
    for target in results.targets:
        assert target.error is None
        cells = {(c.batch_size, c.seq_len) for c in target.grid}
        assert cells == {(1, 16), (4, 16), (1, 64), (4, 64)}
        for cell in target.grid:
            assert cell.n >= 5 and cell.median_ms > 0
            assert cell.median_ms <= cell.p90_ms <= cell.p99_ms
            assert cell.ms_per_sequence == pytest.approx(cell.median_ms / cell.batch_size)
        assert {c.seq_len for c in target.skipped_cells} == {512}  # past the tiny model's 128 tokens
        assert "longer than the model's 128 tokens" in target.skipped_cells[0].reason


def test_mix_memory_and_load_time(benched):
    _, _, results = benched
    for target in results.targets:
        mix = target.mix
        assert mix.sequences == 32 and mix.sorted_per_s > 0 and mix.unsorted_per_s > 0
        assert mix.sorted_padding_efficiency >= mix.unsorted_padding_efficiency
        assert target.peak_rss_mb > 50 and target.load_seconds > 0
    torch_rss = results.targets[0].peak_rss_mb
    onnx_rss = results.targets[1].peak_rss_mb
    assert onnx_rss < torch_rss  # the ONNX worker never imports torch


def test_sweep_writes_the_serving_default_into_the_artifact(benched):
    art, _, results = benched
    variant = results.targets[1]
    grid = list(sweep_points(_cores()))
    points = [(p.sessions, p.threads, p.batch_size) for p in variant.sweep]
    assert points[: len(grid)] == grid and {p.batch_size for p in variant.sweep} == set(SWEEP_BATCH_SIZES)
    assert {p.pad_multiple for p in variant.sweep[: len(grid)]} == {1}  # ONNX Runtime's own: no padding
    # then the padding multiples, each at the best point of the grid
    grid_best = max(variant.sweep[: len(grid)], key=lambda p: p.sorted_per_s)
    padded = variant.sweep[len(grid):]
    assert [p.pad_multiple for p in padded] == [m for m in SWEEP_PAD_MULTIPLES if m != 1]
    assert {(p.sessions, p.threads, p.batch_size) for p in padded} == {
        (grid_best.sessions, grid_best.threads, grid_best.batch_size)}
    default = results.serving_default
    best = max(variant.sweep, key=lambda p: p.sorted_per_s)
    assert (default.sessions, default.threads, default.batch_size, default.pad_multiple) == (
        best.sessions, best.threads, best.batch_size, best.pad_multiple)
    assert json.loads((art / SERVING_FILE).read_text())["threads"] == best.threads
    manifest = Artifact.open(art).manifest  # re-sealed: every checksum still verifies
    assert manifest.build.serving_default.variant == "onnx-fp32"
    best_dir = Artifact.open(art / "best")  # what `kiln serve kiln-out/best` reads, also verified
    assert best_dir.serving_default().threads == best.threads and (art / "best" / SERVING_FILE).is_file()


def test_load_runs_with_the_serving_default(benched):
    """kiln.load picks up what the sweep measured: threads, batch size and sessions side by side."""
    import kiln

    art, _, results = benched
    default = results.serving_default
    predictor = kiln.load(art)
    assert predictor.batch_size == default.batch_size and len(predictor.sessions) == default.sessions
    assert predictor.pad_multiple == default.pad_multiple
    assert kiln.load(art, pad_multiple=8).pad_multiple == 8
    texts = [" ".join(["word"] * n) for n in (3, 40, 7, 90, 12, 60, 5, 33)] * 3
    two = kiln.load(art, sessions=2, batch_size=2)  # 12 batches over two engines, results in input order
    assert len(two.sessions) == 2
    np.testing.assert_allclose(np.stack(two.predict(texts)), np.stack(kiln.load(art, sessions=1).predict(texts)),
                               atol=1e-5)
    with pytest.raises(UsageError, match="sessions must be at least 1"):
        kiln.load(art, sessions=0)


def _cores() -> int:
    from kiln.system.cpu import cpu_info

    return cpu_info().usable_cores


def test_compare_reports_changes_beyond_noise(benched):
    _, _, results = benched
    # The compared cell made steady (p90 = median): a real cell's own spread on a loaded machine can exceed the
    # doubling below, and compare() rightly calls changes within a cell's spread noise.
    onnx = results.targets[1]
    cell = replace(onnx.grid[0], p90_ms=onnx.grid[0].median_ms, p99_ms=onnx.grid[0].median_ms)
    results = replace(results, targets=(results.targets[0], replace(onnx, grid=(cell, *onnx.grid[1:]))))
    onnx = results.targets[1]
    slower_cell = replace(cell, median_ms=2 * cell.median_ms, p90_ms=2 * cell.p90_ms, p99_ms=2 * cell.p99_ms)
    slower_onnx = replace(onnx, grid=(slower_cell, *onnx.grid[1:]),
                          mix=replace(onnx.mix, sorted_per_s=1.5 * onnx.mix.sorted_per_s))
    slower = replace(results, targets=(results.targets[0], slower_onnx))
    changes = compare(results, slower)
    described = [c.describe() for c in changes]
    assert any("onnx-fp32 batch 1 x 16 tokens" in d and "slower" in d for d in described)
    assert any("length mix sorted" in d and "faster" in d for d in described)
    assert compare(results, results) == []


def test_cli_compare_and_bad_input(benched, tmp_path):
    _, out, results = benched
    new = tmp_path / "new.json"
    changed = json.loads((out / "results.json").read_text())
    changed["targets"][0]["mix"]["unsorted_per_s"] /= 3
    new.write_text(json.dumps(changed))
    run = subprocess.run([sys.executable, "-m", "kiln", "bench", "--compare", str(out / "results.json"), str(new)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "pytorch-fp32 length mix unsorted" in run.stdout and "slower" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "kiln", "bench", "--batch-sizes", "1,x"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--batch-sizes must be comma-separated positive integers" in bad.stderr
    old = tmp_path / "old.json"
    old.write_text('{"schema": "other/9"}')
    wrong = subprocess.run([sys.executable, "-m", "kiln", "bench", "--compare", str(old), str(new)],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert "has schema 'other/9'; this kiln reads 'kiln.bench/1' or 'kiln.bench/2'" in wrong.stderr


def test_variants_need_an_artifact(tiny_model, tmp_path):
    with pytest.raises(UsageError, match="variants needs an artifact directory"):
        BenchJob(BenchConfig(target=str(tiny_model("bert")), output=tmp_path, variants=("onnx-fp32",))).run()


def test_gemm_bound_counts_every_weight_gemm_of_the_graph(benched, tiny_model, tmp_path):
    """The bound is built from the variant's own GEMMs: every dense layer, in the precision the graph runs it in."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from kiln.benchmarking.gemm import INT8, onnx_weight_gemms, openvino_weight_gemms
    from kiln.optimizing.openvino_passes import convert

    art, _, results = benched
    config = json.loads((tiny_model("bert") / "config.json").read_text())
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    expected = sorted([h * h] * 4 * layers + [h * i] * 2 * layers)  # Q, K, V, attention out; FFN in and out
    model = art / Artifact.open(art).variant().path
    fp32 = onnx_weight_gemms(model)
    assert sorted(g.inner * g.outer for g in fp32) == expected and {g.precision for g in fp32} == {"fp32"}
    quantize_dynamic(model, tmp_path / "int8.onnx", weight_type=QuantType.QInt8)
    int8 = onnx_weight_gemms(tmp_path / "int8.onnx")
    assert sorted(g.inner * g.outer for g in int8) == expected and {g.precision for g in int8} == {INT8}
    convert(model, tmp_path / "model.xml")
    assert sorted((g.inner, g.outer) for g in openvino_weight_gemms(tmp_path / "model.xml")) == sorted(
        (g.inner, g.outer) for g in fp32)

    baseline, variant = results.targets[0], results.targets[1]
    assert baseline.gemm is None  # PyTorch is timed as users run it; the bound is read from a variant's graph
    bound = variant.gemm
    assert (bound.gemms, bound.int8_gemms) == (6 * layers, 0)
    assert bound.gop_per_sequence == pytest.approx(2 * 128 * sum(expected) / 1e9)
    # an fp32 variant's own bound is its GEMM work at the fp32 rate
    assert bound.own_bound_per_s == pytest.approx(bound.fp32_gops * 1e9 / (2 * 128 * sum(expected)))
    assert bound.of_int8_bound == pytest.approx(bound.reached_per_s / bound.int8_bound_per_s)
    assert min(bound.int8_gops, bound.fp32_gops, bound.reached_per_s) > 0
    # the bf16 rate is timed where the CPU has native bf16 (OpenVINO times it), and only there
    assert (bound.bf16_gops is not None) == (cpu_info().has_bf16 and find_spec("openvino") is not None)


@pytest.mark.skipif(find_spec("openvino") is None, reason="OpenVINO is not installed")
def test_an_openvino_variant_reaches_its_bound_the_faster_of_one_session_and_a_stream_per_thread(benched, tiny_model,
                                                                                                  tmp_path):
    """kiln.load splits the cores of an OpenVINO variant (one single-thread stream per core), so the bound's figures
    are taken both ways: the variant as 1 x 2 and 2 x 1, each stream on its own batch, and its GEMMs alone timed
    the same two ways; the faster of each counts, and the table says which way the variant reached it."""
    from kiln.benchmarking.gemm import FP32, INT8, openvino_weight_gemms, time_gemms, time_gemms_bf16
    from kiln.benchmarking.worker import BenchSettings, Target, _build, _gemm_bound
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob
    from kiln.report.tables import gemm_table

    out = tmp_path / "ov"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("openvino-fp32",))).run()
    target = Target("openvino-fp32", str(out), None, TaskName.FEATURE_EXTRACTION.value)
    encoder, _, engine = _build(target, 2)
    bound = _gemm_bound(target, engine, encoder, BenchSettings((1,), (16,), ("text",), threads=2, budget_s=0.05,
                                                                min_runs=2))
    assert bound.reached_as in ("1 x 2", "2 x 1") and bound.reached_per_s > 0
    assert "the fastest of 1 x 2 and 2 x 1" in bound.kernel
    gemms = openvino_weight_gemms(out / Artifact.open(out).variant("openvino-fp32").path)
    for precision in (INT8, FP32):  # two sessions of one thread each, the graph on each at once: seconds per graph
        assert time_gemms(gemms, precision, 2, budget_s=0.02, min_runs=1, streams=2) > 0
    if cpu_info().has_bf16:
        assert time_gemms_bf16(gemms, 2, budget_s=0.02, min_runs=1, streams=2) > 0
    _, _, results = benched
    header, rows = gemm_table(replace(results, targets=(replace(results.targets[1], gemm=bound),)))
    assert rows[0][header.index("reached seq/s")].endswith(f"({bound.reached_as})")


def test_a_bf16_variant_is_bounded_by_the_bf16_rate_and_the_best_bound_is_the_faster_precision(benched):
    """An OpenVINO variant with the bf16 hint runs its float GEMMs in bf16: its own bound is the bf16 one (on AMX,
    openvino-bf16 reached 186% of an fp32-rated own bound). The best bound is the faster of int8 and bf16."""
    from kiln.benchmarking.gemm import BF16, gemm_bound
    from kiln.report.tables import gemm_table

    art, _, results = benched
    model = art / Artifact.open(art).variant().path
    bound = gemm_bound(model, 100.0, 1, float_precision=BF16, bf16=True, budget_s=0.05, min_runs=1)
    assert bound.bf16_gops > 0 and bound.own_bound_per_s == pytest.approx(bound.bf16_bound_per_s)
    assert bound.best_bound_per_s == max(bound.int8_bound_per_s, bound.bf16_bound_per_s)
    assert bound.best_precision == ("bf16" if bound.bf16_bound_per_s > bound.int8_bound_per_s else "int8")
    assert bound.of_best_bound == pytest.approx(100.0 / bound.best_bound_per_s)
    faster = bound.with_reached(150.0)  # kiln bench keeps the variant's fastest call, timed before and after
    assert (faster.of_int8_bound, faster.of_own_bound, faster.of_best_bound) == pytest.approx(
        (150.0 / bound.int8_bound_per_s, 150.0 / bound.own_bound_per_s, 150.0 / bound.best_bound_per_s))
    with pytest.raises(ValueError, match="bf16=True"):
        gemm_bound(model, 100.0, 1, float_precision=BF16)
    target = replace(results.targets[1], gemm=bound)
    header, rows = gemm_table(replace(results, targets=(target,)))
    assert "bf16 GOP/s" in header and "of best bound" in header and len(rows[0]) == len(header)
    assert rows[0][header.index("best bound seq/s")].endswith(f"({bound.best_precision})")


def test_a_worker_killed_mid_cell_is_reported_at_once_with_its_signal(tiny_artifact, tmp_path):
    """SIGKILL the benchmark worker after its first progress event (the OOM killer's way): the job reports how it
    died within a second instead of waiting out the silence timeout."""
    import multiprocessing
    import os
    import signal
    import time

    from kiln.benchmarking.job import BenchConfig, BenchJob
    from kiln.benchmarking.worker import Target

    killed: dict[str, float] = {}

    class KillingBar:
        def advance(self) -> None:
            if not killed:
                (worker,) = multiprocessing.active_children()
                os.kill(worker.pid, signal.SIGKILL)
                killed["at"] = time.monotonic()

    job = BenchJob(BenchConfig(target=str(tiny_artifact), output=tmp_path, quick=True))
    settings = job._settings(Artifact.open(tiny_artifact).encoder(), 1, 1)
    result = job._run_one(Target("onnx-fp32", str(tiny_artifact), None, "feature-extraction"), settings, KillingBar())
    noticed = time.monotonic() - killed["at"]
    assert "killed by signal 9 (SIGKILL) (out of memory?)" in result.error
    assert "during loaded" in result.error  # the last thing it reported
    assert noticed < 1.0, f"the death was noticed after {noticed:.2f} s"
