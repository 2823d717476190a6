"""kiln optimize on tiny models: every variant built and validated, the gate, the choice, the output."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.errors import UsageError
from kiln.optimizing.job import NothingPassed, OptimizeConfig, OptimizeJob
from kiln.optimizing.outcome import RunSummary, read_results
from kiln.optimizing.variants import VARIANTS, default_variants
from kiln.records import to_jsonable
from kiln.source.loading import load_source
from kiln.source.reference import reference_predictor
from kiln.tasks import TaskName
from kiln.validation.gate import Verdict


@pytest.fixture(scope="module")
def optimized(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("opt") / "out"
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=out)).run()
    return out, summary


def test_every_default_variant_is_built_validated_and_timed(optimized):
    out, summary = optimized
    names = [o.name for o in summary.outcomes]
    assert names == default_variants("cpu")
    for outcome in summary.outcomes:
        assert outcome.status in ("accepted", "rejected", "skipped"), (outcome.name, outcome.reason)
        if outcome.status == "skipped":
            assert outcome.reason  # e.g. no bf16 on this CPU
            continue
        assert outcome.agreement.primary == "min_cosine"
        assert {"mean_cosine", "pairwise_spearman", "top10_neighbour_recall"} <= outcome.agreement.figures.keys()
        assert outcome.agreement.buckets and outcome.size_bytes > 0
        if outcome.status == "accepted":  # a variant the agreement rejects is not scored on the task too
            assert "spearman" in outcome.metric  # the built-in STS pairs
            assert outcome.timing.ms_per_sequence > 0
        else:
            assert outcome.metric is None and outcome.timing is None
    assert summary.best in {o.name for o in summary.outcomes if o.status == "accepted"}


def test_output_files_and_manifest(optimized):
    out, summary = optimized
    assert {"manifest.json", "results.json", "summary.md", "best", "tokenizer"} <= {p.name for p in out.iterdir()}
    art = Artifact.open(out)  # every checksum verifies, best/ included
    assert art.manifest.build.best == summary.best
    assert art.manifest.build.cpu["features"] is not None
    for record in art.manifest.variants.values():
        assert record.status in ("accepted", "rejected")
        assert record.recipe and record.agreement.value > 0
    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == "kiln.optimize/3"
    assert results["best"] == summary.best and results["reference_timing"]["sequences"] > 0
    back = read_results(out / "results.json")  # typed records again, equal to what the run returned
    assert back.outcomes == summary.outcomes and back.reference_timing == summary.reference_timing
    assert to_jsonable(back) == to_jsonable(summary)
    table = (out / "summary.md").read_text()
    assert ("| variant | size MB | agreement (worst batching) | batch drift | task metric | ms/seq | speed-up vs "
            "PyTorch fp32 | status |") in table
    assert f"| {summary.best} |" in table
    # What "accepted" promises, in words: all 160 agreement texts within the floor bound 98.1% of texts like them.
    assert "Accepted means: every one of the 160 agreement texts" in table and "at least 98.1% of texts" in table
    best = next(o for o in summary.outcomes if o.name == summary.best)
    assert best.agreement.figures["cosine_bound"] >= 0.99 and "cosine_bound" in best.reason


def test_best_is_a_servable_artifact_that_matches_pytorch(optimized, tiny_model):
    out, summary = optimized
    best = Artifact.open(out / "best")
    assert list(best.manifest.variants) == [summary.best]
    texts = list(builtin_sentences()[:10])
    got = np.stack(best.predictor().predict(texts))
    want = np.stack(reference_predictor(load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION))
                    .predict(texts))
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99  # within the gate's default tolerance


def test_tight_tolerance_triggers_sensitivity_and_records_it(tiny_model, tmp_path, caplog, monkeypatch):
    model = str(tiny_model("bert"))
    first = OptimizeJob(OptimizeConfig(model=model, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "a",
                                       tolerance=1e-6, variants=("onnx-fp32", "onnx-int8-dynamic"),
                                       sensitivity=False)).run()
    full = next(o for o in first.outcomes if o.name == "onnx-int8-dynamic")
    assert full.status == "rejected" and full.sensitivity is None  # fully quantized: outside 1e-6
    # Kept in the artifact for comparison; loading it by name says it failed the gate.
    with caplog.at_level(logging.WARNING, logger="kiln.artifact"):
        Artifact.open(tmp_path / "a").predictor("onnx-int8-dynamic")
    assert "variant onnx-int8-dynamic was rejected by kiln optimize" in caplog.text
    # A tolerance the fully quantized model misses by construction and that keeping layers in fp32 reaches (the
    # tiny model is the same every session: its tokenizer is kept in kiln/testing/tokenizers).
    # The gate holds the least cosine and the bound on what 99.9% of texts reach: the tolerance comes from the lower.
    tolerance = (1 - min(full.agreement.value, full.agreement.figures["cosine_bound"])) * 0.999
    summary = OptimizeJob(OptimizeConfig(model=model, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "b",
                                         tolerance=tolerance, variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
    int8 = next(o for o in summary.outcomes if o.name == "onnx-int8-dynamic")
    assert int8.sensitivity is not None and int8.sensitivity.rounds and int8.sensitivity.ranking
    assert int8.status == "accepted", int8.reason
    excluded = int8.sensitivity.excluded
    assert excluded and tuple(int8.record.recipe[-1]["excluded_nodes"]) == excluded
    assert int8.sensitivity.speed_cost > 0
    recorded = Artifact.open(tmp_path / "b").manifest.variants["onnx-int8-dynamic"].sensitivity
    assert recorded.excluded == excluded
    # Attempts are screened on sorted batches; the set the search settles on gets every batching.
    assert int8.batched is not None and int8.batched.complete and "alone" in int8.batched.agreements

    # Fault injection: the screen turns down 1 and 2 layers, so after the most allowed passes the search doubles to
    # 4 (passes) and bisects to 3 (passes); then 3 fails its full check (as a batching other than the sorted one
    # could make it). The search must not ship 3: the next larger set that passed the screen, 4, is checked in full
    # and kept. With every larger set refused as well, the variant is rejected with its fully quantized files.
    real_check = OptimizeJob._check

    def injected(refuse_full: Callable[[int], bool]):
        def check(self, built, params, screen=False):
            checked = real_check(self, built, params, screen)
            kept = len(built.record().recipe[-1].get("excluded_nodes") or ())
            if (screen and kept in (1, 2)) or (not screen and refuse_full(kept)):
                return dataclasses.replace(checked, verdict=Verdict(False, f"injected: {kept} refused"))
            return checked
        return check

    def run(name: str, refuse_full: Callable[[int], bool]):
        monkeypatch.setattr(OptimizeJob, "_check", injected(refuse_full))
        try:
            summary = OptimizeJob(OptimizeConfig(model=model, task=TaskName.FEATURE_EXTRACTION,
                                                 output=tmp_path / name, tolerance=tolerance,
                                                 variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
        finally:
            monkeypatch.undo()
        return next(o for o in summary.outcomes if o.name == "onnx-int8-dynamic")

    moved = run("c", lambda kept: kept == 3)
    most, *rounds = moved.sensitivity.rounds
    assert most.accepted and most.excluded >= 4  # the search's bound (paying_limit, from this run's timings)
    doubled = [(4, True)] if most.excluded > 4 else []  # at the bound 4 is known to pass
    assert [(r.excluded, r.accepted) for r in rounds] == [(1, False), (2, False), *doubled, (3, True)]
    assert moved.status == "accepted" and len(moved.sensitivity.excluded) == 4
    assert tuple(moved.record.recipe[-1]["excluded_nodes"]) == moved.sensitivity.excluded
    refused = run("d", lambda kept: kept >= 3)
    assert refused.status == "rejected" and not refused.sensitivity.accepted
    assert not refused.record.recipe[-1].get("excluded_nodes")  # the fully quantized files the rejection describes
    # ... and they are those files on disk, put back after the search's attempts overwrote them.
    import onnx

    def integer_matmuls(artifact):
        graph = onnx.load(str(tmp_path / artifact / "onnx-int8-dynamic" / "model.onnx")).graph
        return sum(n.op_type == "MatMulInteger" for n in graph.node)

    assert integer_matmuls("d") == integer_matmuls("a") > integer_matmuls("c")


def test_int8_search_keeps_no_more_layers_in_fp32_than_can_pay(tiny_model, tmp_path):
    """The search's bound comes from this run's own timings (fully int8, the float graph it quantizes, the fastest
    accepted variant), is said in the sensitivity record, and no attempt passes it."""
    import re

    model = str(tiny_model("bert"))
    summary = OptimizeJob(OptimizeConfig(model=model, task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "o",
                                         tolerance=1e-6, variants=("onnx-fp32", "onnx-int8-static"))).run()
    fp32, int8 = (next(o for o in summary.outcomes if o.name == n) for n in ("onnx-fp32", "onnx-int8-static"))
    assert fp32.status == "accepted" and fp32.timing is not None
    bound = int8.sensitivity.bound
    if bound.startswith("not searched"):  # the tiny model's int8 kernels need not be faster than its fp32
        assert int8.sensitivity.rounds == () and "not searched" in int8.reason
    else:
        limit = int(re.match(r"searching up to (\d+) of (\d+) layers", bound).group(1))
        assert int8.sensitivity.rounds and max(r.excluded for r in int8.sensitivity.rounds) <= limit
    assert "onnx-fp32" in bound and "ms a text" in bound


def test_nothing_passing_is_an_error_with_every_reason(tiny_model, tmp_path):
    with pytest.raises(NothingPassed, match=r"no variant passed the gate \(torch-int8-dynamic rejected: "
                                            r"min_cosine 0\.\d+ < 0\.9999990"):
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "out", tolerance=1e-6, variants=("torch-int8-dynamic",))).run()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task", [TaskName.TEXT_CLASSIFICATION, TaskName.TOKEN_CLASSIFICATION,
                                  TaskName.QUESTION_ANSWERING])
def test_other_tasks_use_their_agreement_figure(tiny_model, tmp_path, task):
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert", task)), task=task, output=tmp_path / "o",
                                         variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
    primary = {TaskName.TEXT_CLASSIFICATION: "label_agreement", TaskName.TOKEN_CLASSIFICATION: "tag_agreement",
               TaskName.QUESTION_ANSWERING: "answer_f1"}[task]
    fp32 = summary.outcomes[0]
    assert fp32.agreement.primary == primary and fp32.agreement.value == pytest.approx(1.0)
    assert summary.primary_metric is None  # no labelled data given


def test_config_errors_name_the_flag():
    with pytest.raises(UsageError, match=r"variants must be from: onnx-fp32, .* \(got onnx-int4\)"):
        OptimizeConfig(model=None, task=TaskName.FEATURE_EXTRACTION, output=None, variants=("onnx-int4",))
    with pytest.raises(UsageError, match=r"target must be one of: cpu, cuda \(got 'tpu'\)"):
        OptimizeConfig(model=None, task=TaskName.FEATURE_EXTRACTION, output=None, target="tpu")
    with pytest.raises(UsageError, match=r"calibration_method must be one of: minmax, entropy, percentile"):
        OptimizeConfig(model=None, task=TaskName.FEATURE_EXTRACTION, output=None, calibration_method="mse")


def test_cuda_target_builds_fp16_variants():
    assert {"onnx-fp16", "torch-fp16"} <= set(default_variants("cuda"))
    assert "onnx-int8-dynamic" not in default_variants("cuda")
    assert set(VARIANTS) >= {"onnx-fp32", "onnx-fused", "onnx-fused-gelu-approx", "onnx-int8-dynamic",
                             "onnx-int8-static", "openvino-fp32", "openvino-bf16", "openvino-int8-static",
                             "onnx-fp16", "torchscript", "torch-bf16", "torch-fp16", "torch-int8-dynamic"}


def test_fp16_variant_builds_and_is_validated(tiny_model, tmp_path):
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "o", variants=("onnx-fp16",))).run()
    fp16 = summary.outcomes[0]
    assert fp16.status == "accepted", fp16.reason
    assert fp16.record.recipe[-1]["keep_io_types"] is True


def test_cli_bad_eval_file_names_the_line(tiny_model, tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "a"}\n')
    result = subprocess.run([sys.executable, "-m", "kiln", "optimize", str(tiny_model("bert")), "--eval", str(bad),
                             "-o", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert f"error: {bad} line 2: missing field 'sentence2'" in result.stderr
    assert "Traceback" not in result.stderr
    tol = subprocess.run([sys.executable, "-m", "kiln", "optimize", "--tolerance", "3", "-o", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=300)
    assert tol.returncode == 2 and "--tolerance must be between 0 and 1 (got 3)" in tol.stderr


def test_optimize_help_documents_defaults():
    result = subprocess.run([sys.executable, "-m", "kiln", "optimize", "--help"], capture_output=True, text=True,
                            env={"COLUMNS": "200", "PATH": ""}, timeout=120)
    assert result.returncode == 0
    text_only = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())  # rich wraps inside its panel
    for text in ("min cosine >= 1-t", "(default t=0.01)", "answer F1 against the original's answers >= 1-t "
                 "(default t=0.02)",
                 "--calibration-method", "--variants", "--target", "SQuAD .json"):
        assert text in text_only, text


def test_a_variant_whose_retry_raises_is_reported_failed_and_the_run_goes_on(tiny_model, tmp_path, monkeypatch):
    from kiln.optimizing import variants

    def flaky(ctx, excluded=(), **params):
        if params:
            raise RuntimeError("boom in the alternative build")
        return variants._int8_dynamic(ctx, excluded)  # fails a 1e-6 gate, so the alternatives are tried

    spec = variants.VariantSpec("flaky-int8", flaky, variants.CPU, alternatives=({"boom": True},))
    monkeypatch.setitem(variants.VARIANTS, spec.name, spec)
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "o", tolerance=1e-6,
                                         variants=("flaky-int8", "onnx-fp32"))).run()
    flaky_outcome, fp32 = summary.outcomes
    assert flaky_outcome.status == "failed" and "boom in the alternative build" in flaky_outcome.reason
    assert fp32.status == "accepted" and summary.best == "onnx-fp32"  # the run went on and kept its work
    assert Artifact.open(tmp_path / "o").manifest.build.skipped["flaky-int8"] == flaky_outcome.reason


def test_a_rejected_variant_no_faster_than_an_accepted_one_tries_no_alternatives(tiny_model, tmp_path,
                                                                                 monkeypatch):
    """Alternative parameters move accuracy, not speed: a fully int8 variant timed no faster than the fastest
    accepted one is rejected with its figures, before any alternative is built or a layer ranked."""
    from kiln.optimizing import job, variants
    from kiln.records.timing import Timing

    def int8(ctx, excluded=(), **params):
        if params:
            raise AssertionError("an alternative was built")
        return variants._int8_dynamic(ctx, excluded)  # fails a 1e-6 gate

    def ranked(*_):
        raise AssertionError("layers were ranked")

    spec = variants.VariantSpec("slow-int8", int8, variants.CPU, alternatives=({"alpha": 1},), rank=ranked)
    monkeypatch.setitem(variants.VARIANTS, spec.name, spec)
    timed = job.time_predictor
    # The full variant's one-round timing (the one this decision reads) made slow; every other timing real.
    monkeypatch.setattr(job, "time_predictor", lambda predictor, encodings, rounds=2: Timing(
        len(encodings), 1e3, 1) if rounds == 1 else timed(predictor, encodings, rounds=rounds))
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "o", tolerance=1e-6,
                                         variants=("onnx-fp32", "slow-int8"))).run()
    fp32, slow = summary.outcomes
    assert fp32.status == "accepted" and slow.status == "rejected"
    assert slow.reason.endswith("; not searched: fully quantized, it is no faster than onnx-fp32"), slow.reason
    assert slow.sensitivity.rounds == ()
    assert re.match(r"fully quantized \d+\.\d ms a text, fastest accepted \(onnx-fp32\) \d+\.\d",
                    slow.sensitivity.bound), slow.sensitivity.bound


def test_the_reference_runs_on_the_runs_thread_count(tiny_model, tmp_path, monkeypatch):
    import torch

    from kiln.engines.torch_eager import TorchEngine

    seen: list[int] = []
    original = TorchEngine.run

    def recording(self, inputs):
        seen.append(torch.get_num_threads())
        return original(self, inputs)

    monkeypatch.setattr(TorchEngine, "run", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # as a torch-based variant built earlier in the process may have left it
    try:
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "o", threads=1, variants=("onnx-fp32",))).run()
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}  # every reference batch (agreement, metric, timing) on the run's 1 thread


def test_openvino_int8_is_left_out_by_default_only_where_its_kernels_are_slow():
    """Without VNNI/AMX OpenVINO's int8 ran no faster than its fp32 (issue 10); it is still built when named."""
    from types import SimpleNamespace

    from kiln.system.cpu import CpuInfo

    spec = VARIANTS["openvino-int8-static"]
    avx2 = CpuInfo("x", "x86_64", ("avx2", "f16c"), 2, 2)
    vnni = CpuInfo("x", "x86_64", ("avx2", "avx512", "avx512-vnni"), 2, 2)
    assert "no fast int8 kernels" in spec.not_by_default(SimpleNamespace(cpu=avx2))
    assert spec.not_by_default(SimpleNamespace(cpu=vnni)) is None
    encoder = SimpleNamespace(cpu=avx2, spec=SimpleNamespace(export=SimpleNamespace(fusion="bert")))
    assert all(VARIANTS[n].not_by_default(encoder) is None for n in ("onnx-int8-dynamic", "openvino-fp32"))


def _optimize_with_engine(engine_class, tiny_model, tmp_path, monkeypatch) -> RunSummary:
    """kiln optimize on the tiny BERT with a variant "under-test" (the fp32 graph run by ``engine_class``) beside
    onnx-fp32."""
    from kiln import engines
    from kiln.optimizing import variants
    from kiln.optimizing.context import BuiltVariant

    def under_test(ctx, excluded=(), **params):
        fp32 = variants._fp32(ctx)
        return BuiltVariant("under-test", "engine-under-test", fp32.path, fp32.files, fp32.recipe)

    monkeypatch.setitem(engines.ENGINES, "engine-under-test", engine_class)
    monkeypatch.setitem(variants.VARIANTS, "under-test", variants.VariantSpec("under-test", under_test, variants.CPU))
    return OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                      output=tmp_path / "o", variants=("under-test", "onnx-fp32"))).run()


class BatchOrderSensitive:
    """An ONNX Runtime engine whose answers depend on which rows share the batch (here: on how out of length order
    they are), as a per-batch activation scale makes them: alone and in length-sorted batches it is exact, in
    mixed-length batches off. A variant that passes the friendly batching and fails another."""

    def __init__(self, path, options):
        from kiln.engines.onnxruntime import OnnxRuntimeEngine

        self._engine = OnnxRuntimeEngine(path, options)
        self.input_names, self.output_names = self._engine.input_names, self._engine.output_names
        self.name, self.providers, self.is_padded, self.pad_multiple = "batch-order-sensitive", ("cpu",), True, 1

    def run(self, inputs):
        out = self._engine.run(inputs)
        hidden = out["last_hidden_state"]
        lengths = inputs["attention_mask"].sum(1)
        unsorted = float(np.mean(np.diff(lengths) < 0)) if len(lengths) > 1 else 0.0  # 0 for sorted or alone
        direction = np.sin(np.arange(hidden.shape[-1]))  # a fixed direction, the same for every row
        out["last_hidden_state"] = hidden + 2.0 * unsorted * direction
        return out

    def warmup(self):
        self._engine.warmup()


def test_the_gate_judges_the_worst_batching_and_records_the_drift(tiny_model, tmp_path, monkeypatch):
    """A variant within tolerance in sorted batches but not in mixed ones is rejected, the batching named; onnx-fp32
    is batch-invariant (bit-identical alone and batched) and says so in the manifest and the report."""
    summary = _optimize_with_engine(BatchOrderSensitive, tiny_model, tmp_path, monkeypatch)
    drifted, fp32 = summary.outcomes
    assert drifted.batched.agreements["sorted"].value >= 0.99  # the friendly batching alone would have passed
    assert drifted.status == "rejected" and drifted.reason.endswith("(mixed batches)")
    assert drifted.agreement == drifted.batched.agreements["mixed"]
    assert not drifted.batched.drift.invariant and drifted.batched.drift.min_cosine < 0.99
    assert fp32.status == "accepted" and fp32.batched.drift.invariant and fp32.batched.drift.max_abs_diff == 0
    record = Artifact.open(tmp_path / "o").manifest.variants["onnx-fp32"]
    assert record.batch_invariant and set(record.batched.agreements) == {"sorted", "mixed", "alone", "sessions"}
    page = (tmp_path / "o" / "report.html").read_text()
    assert "Batch-invariant: onnx-fp32" in page and "batch drift" in page


def test_serve_deterministic_serves_only_a_batch_invariant_variant(optimized, tmp_path):
    """kiln serve --deterministic keeps best when it is batch-invariant, else the fastest invariant variant, and
    refuses in one line (exit 2, the measured drift named) when none is."""
    import shutil

    from fastapi.testclient import TestClient

    from kiln.artifact.manifest import MANIFEST_NAME
    from kiln.serving.app import ServeConfig, create_app
    from kiln.serving.inference import served_variant

    out, summary = optimized
    art = Artifact.open(out)
    invariant = {n for n, r in art.manifest.variants.items() if r.batch_invariant}
    assert "onnx-fp32" in invariant
    chosen = served_variant(art, deterministic=True)
    assert chosen in invariant and (chosen == summary.best or summary.best not in invariant)
    with TestClient(create_app(ServeConfig(models={"m": out}, deterministic=True))) as c:
        info = c.get("/kiln/info").json()["models"][0]
    assert info["variant"] == chosen and info["validation"]["batch_invariant"] is True
    assert info["solo_threads"] is None  # the same threads for every request, idle server or not
    # An artifact whose every variant drifts: the manifest says so, and the server refuses to start.
    drifting = tmp_path / "drifting"
    shutil.copytree(out, drifting)
    body = json.loads((drifting / MANIFEST_NAME).read_text())
    for record in body["variants"].values():
        if record.get("batched"):
            record["batched"]["drift"]["max_abs_diff"] = 0.025
    (drifting / MANIFEST_NAME).write_text(json.dumps(body))
    refused = subprocess.run([sys.executable, "-m", "kiln", "serve", str(drifting), "--deterministic"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--deterministic: no variant of" in refused.stderr and "max abs diff 2.5e-02" in refused.stderr


def test_serve_variant_serves_the_named_accepted_variant(optimized, tmp_path):
    """kiln serve --variant NAME serves that variant instead of the best (its answers are that variant's), and
    refuses in one line (exit 2) a variant the artifact lacks, one kiln optimize did not accept, and --variant with
    --deterministic."""
    from fastapi.testclient import TestClient

    import kiln
    from kiln.serving.app import ServeConfig, create_app
    from kiln.serving.inference import served_variant

    out, summary = optimized
    accepted = [o.name for o in summary.outcomes if o.status == "accepted" and o.name != summary.best]
    assert accepted, "the tiny BERT's default run accepts more than its best"
    other = accepted[0]
    with TestClient(create_app(ServeConfig(models={"m": out}, variants={"m": other}))) as c:
        info = c.get("/kiln/info").json()["models"][0]
        served = c.post("/kiln/embed", json={"inputs": ["a variant by name", "and another"]}).json()["embeddings"]
    assert info["variant"] == other
    np.testing.assert_allclose(served, kiln.load(out, other).predict(["a variant by name", "and another"]),
                               atol=1e-6)
    # A variant the manifest records as rejected (as a tighter gate would have): refused with the gate's reason.
    import shutil

    from kiln.artifact.manifest import MANIFEST_NAME

    strict = tmp_path / "strict"
    shutil.copytree(out, strict)
    body = json.loads((strict / MANIFEST_NAME).read_text())
    body["variants"][other].update(status="rejected", reason="min_cosine 0.9871 < 0.9900")
    (strict / MANIFEST_NAME).write_text(json.dumps(body))
    with pytest.raises(UsageError, match=f"variant {other} of .* was rejected by kiln optimize: min_cosine 0.9871 < "
                                         f"0.9900; the accepted ones: .*{summary.best}"):
        served_variant(Artifact.open(strict), variant=other)
    with pytest.raises(UsageError, match="variant names models not served: other"):
        ServeConfig(models={"m": out}, variants={"other": other})
    for args, message in ((["--variant", "onnx-nope"], "--variant must be one of: "),
                          (["--variant", other, "--deterministic"], "--variant cannot be combined with deterministic"),
                          (["--variant", "a=b=c", "--variant", "d"], "--variant must be VARIANT, or MODEL=VARIANT")):
        refused = subprocess.run([sys.executable, "-m", "kiln", "serve", str(out), "--port", "1", *args],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr, \
            refused.stderr


class BatchSizeSigned(BatchOrderSensitive):
    """Off the original by the same small amount alone and batched, but in opposite directions: within tolerance
    of the original in every batching, yet a text's answer moves by twice that between them."""

    def run(self, inputs):
        out = self._engine.run(inputs)
        hidden = out["last_hidden_state"]
        sign = 1.0 if hidden.shape[0] == 1 else -1.0
        out["last_hidden_state"] = hidden + sign * 0.1 * np.sin(np.arange(hidden.shape[-1]))
        return out


def test_the_gate_rejects_a_variant_whose_drift_alone_exceeds_the_tolerance(tiny_model, tmp_path, monkeypatch):
    two_faced_outcome = _optimize_with_engine(BatchSizeSigned, tiny_model, tmp_path, monkeypatch).outcomes[0]
    floor = 0.99
    assert all(a.value >= floor for a in two_faced_outcome.batched.agreements.values())  # each batching passes
    assert two_faced_outcome.batched.drift.consistency < floor
    assert two_faced_outcome.status == "rejected"
    assert two_faced_outcome.reason.startswith("batch drift: min_cosine 0.98") and "between batchings" in \
        two_faced_outcome.reason


def test_dynamic_int8_run_row_by_row_is_batch_invariant(tiny_model, tmp_path):
    """onnx-int8-dynamic's per-batch activation scale makes it drift; onnx-int8-dynamic-rows (the same quantized
    graph, each input run on its own) is bit-identical across batchings, and its manifest record says how it runs."""
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "o", tolerance=0.05,
                                         variants=("onnx-int8-dynamic", "onnx-int8-dynamic-rows"))).run()
    dynamic, rows = summary.outcomes
    assert dynamic.batched.drift.max_abs_diff > 0
    assert rows.batched.drift.invariant and rows.record.options.rows_alone
    assert rows.record.recipe[-1] == {"pass": "rows-alone"}
    predictor = Artifact.open(tmp_path / "o").predictor("onnx-int8-dynamic-rows")
    texts = list(builtin_sentences()[:9])
    batched, alone = predictor.predict(texts), [predictor.with_batch_size(1).predict([t])[0] for t in texts]
    for a, b in zip(batched, alone):
        np.testing.assert_array_equal(a, b)
