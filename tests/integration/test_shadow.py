"""Live agreement (kiln serve --shadow-rate): sampled requests rerun through the artifact's fp32 reference while the
engine idles; the rolling figure matches offline agreement on the same texts; below the gate it is logged and,
with --shadow-policy unready, /ready turns 503 until it recovers."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kiln.artifact.directory import Artifact
from kiln.artifact.plan import ServingPlan
from kiln.data.texts import builtin_sentences
from kiln.engines import EngineOptions
from kiln.errors import UsageError
from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.scoring import cosine
from kiln.serving.app import ServeConfig, create_app
from kiln.serving.shadow import ShadowConfig
from kiln.tasks import TaskName
from kiln.tasks.validation import length_bound
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def int8_artifact(tiny_model, tmp_path_factory):
    """A tiny artifact whose best is dynamic int8 (not bit-equal to fp32), with its fp32 reference kept."""
    out = tmp_path_factory.mktemp("shadow") / "art"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-int8-dynamic",), tolerance=0.05)).run()
    return out


def metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_best_keeps_the_fp32_reference_and_the_live_figure_matches_offline_agreement(int8_artifact):
    texts = list(builtin_sentences()[:40])
    best = Artifact.open(int8_artifact / "best")
    reference = best.reference_variant()
    assert reference is not None and reference.name == "onnx-fp32" and best.variant_name() == "onnx-int8-dynamic"
    served = best.predictor()
    fp32 = best.predictor_of(reference, ServingPlan(EngineOptions(intra_op_threads=1), 1, 8))
    # offline: each text alone, as the server's idle engine runs a lone request
    offline = [cosine(served.with_batch_size(1).predict([t])[0], fp32.predict([t])[0]) for t in texts]
    app = create_app(ServeConfig(models={"m": int8_artifact / "best"}, shadow=ShadowConfig(rate=1.0, max_share=1.0)))
    with TestClient(app) as c:
        for text in texts:  # one at a time: each runs alone, as the offline figure did
            assert c.post("/kiln/embed", json={"inputs": text}).status_code == 200
        wait_until(lambda: app.state.models["m"].shadow.items == len(texts), "every request to be shadowed")
        scraped = c.get("/metrics").text
        info = c.get("/kiln/info").json()["models"][0]["shadow"]
    assert metric(scraped, 'kiln_shadow_agreement{figure="min_cosine",model="m"}') == pytest.approx(min(offline),
                                                                                                    abs=1e-6)
    assert info["mean"] == pytest.approx(float(np.mean(offline)), abs=1e-6) and info["items"] == len(texts)
    assert info["figure"] == "cosine" and info["judged"] == "min"
    # The gate's bound in the same words: the 40 texts' lengths, bucketed as the gate does, fitted the same way.
    lengths = [len(e.ids) for e in served.encoder.encode(texts)]
    assert info["bound"] == pytest.approx(length_bound(np.array(offline), lengths), abs=1e-5) and \
        info["bound"] <= min(offline)
    assert metric(scraped, 'kiln_shadow_agreement{figure="cosine_bound",model="m"}') == pytest.approx(info["bound"])
    assert info["below_floor"] is False and 0 < info["cpu_share"] <= 1
    assert metric(scraped, 'kiln_shadow_items_total{model="m"}') == len(texts)


def test_below_the_gate_is_logged_and_unready_until_it_recovers(int8_artifact, caplog):
    app = create_app(ServeConfig(models={"m": int8_artifact / "best"},
                                 shadow=ShadowConfig(rate=1.0, max_share=1.0, policy="unready")))
    with TestClient(app) as c, caplog.at_level(logging.INFO, logger="kiln"):
        shadow = app.state.models["m"].shadow
        shadow.floor = 1.5  # injected: a gate no variant meets, so the live figure is below it
        c.post("/kiln/embed", json={"inputs": "falls below"})
        wait_until(lambda: shadow.below, "the live agreement to fall below the floor")
        unready = c.get("/ready")
        shadow.floor = -1.0  # and recovers
        c.post("/kiln/embed", json={"inputs": "recovers"})
        wait_until(lambda: not shadow.below, "the live agreement to recover")
        ready = c.get("/ready")
    assert unready.status_code == 503 and "live agreement of model 'm' fell below its gate" in unready.text
    assert ready.status_code == 200
    assert any("fell below its gate" in r.getMessage() for r in caplog.records)
    assert any("back within its gate" in r.getMessage() for r in caplog.records)


def test_sampled_inputs_are_bounded_and_bad_flags_refused(int8_artifact, tiny_model, tmp_path):
    with pytest.raises(UsageError, match=r"shadow_rate must be in \(0, 1\] \(got 0\)"):
        ShadowConfig(rate=0)
    with pytest.raises(UsageError, match=r"shadow_max_share must be in \(0, 1\]"):
        ShadowConfig(rate=0.5, max_share=2)
    app = create_app(ServeConfig(models={"m": int8_artifact / "best"},
                                 shadow=ShadowConfig(rate=1.0, max_share=1.0, queue=4)))
    with TestClient(app) as c:
        shadow = app.state.models["m"].shadow
        shadow.offer([(None, None)] * 10)  # more than the queue holds: the oldest are dropped and counted
        assert len(shadow._waiting) == 4
        dropped = metric(c.get("/metrics").text, 'kiln_shadow_dropped_total{model="m",reason="queue_full"}')
        shadow._waiting.clear()
    assert dropped == 6
    refused = subprocess.run([sys.executable, "-m", "kiln", "serve", str(int8_artifact), "--shadow-rate", "1.5"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--shadow-rate must be in (0, 1] (got 1.5)" in refused.stderr


@pytest.mark.parametrize("min_share", [0.0, 0.2])
def test_under_load_that_never_idles_the_shadow_still_gets_its_minimum_share(int8_artifact, min_share):
    """An engine that never idles (its idle event never set, as under sustained full load): with a minimum share
    the reference still runs, near that share of wall time, and the live figure refreshes; without one it waits."""
    import asyncio

    from kiln.serving.metrics import Metrics
    from kiln.serving.shadow import Shadow

    best = Artifact.open(int8_artifact / "best")
    served = best.predictor().with_batch_size(1)
    fp32 = best.predictor_of(best.reference_variant(), ServingPlan(EngineOptions(intra_op_threads=1), 1, 8))
    encodings = served.prepare(list(builtin_sentences())).encodings
    served_outputs = list(zip(encodings, served.run_features(encodings))) * 80  # more than 3 s of reference runs

    async def shadowed() -> tuple[int, float]:
        config = ShadowConfig(rate=1.0, max_share=1.0, min_share=min_share, queue=len(served_outputs))
        shadow = Shadow("m", fp32, cosine, config, Metrics(), 0.99, asyncio.Event())
        shadow.start()
        shadow.offer(served_outputs)
        await asyncio.sleep(3.0)
        await shadow.close()
        return shadow.items, shadow.share()

    items, share = asyncio.run(shadowed())
    if min_share == 0:
        assert items == 0
    else:
        assert 0 < items < len(served_outputs) and share == pytest.approx(min_share, abs=0.05), (items, share)
    with pytest.raises(UsageError, match="shadow_min_share must be between 0 and shadow_max_share 0.1 "):
        ShadowConfig(rate=0.5, min_share=0.5)


def test_the_minimum_share_holds_under_load_after_an_idle_spell(int8_artifact, monkeypatch):
    """min_share is held over the recent past (RECENT_S), not the server's life: a spell of idle engine, where the
    reference ran freely, does not starve the load that follows of its share."""
    import asyncio

    from kiln.serving import shadow as shadow_module
    from kiln.serving.metrics import Metrics
    from kiln.serving.shadow import Shadow

    monkeypatch.setattr(shadow_module, "RECENT_S", 1.0)
    best = Artifact.open(int8_artifact / "best")
    served = best.predictor().with_batch_size(1)
    fp32 = best.predictor_of(best.reference_variant(), ServingPlan(EngineOptions(intra_op_threads=1), 1, 8))
    encodings = served.prepare(list(builtin_sentences())).encodings
    served_outputs = list(zip(encodings, served.run_features(encodings))) * 200

    async def shadowed() -> tuple[int, int, float]:
        idle = asyncio.Event()
        config = ShadowConfig(rate=1.0, max_share=0.5, min_share=0.1, queue=len(served_outputs))
        shadow = Shadow("m", fp32, cosine, config, Metrics(), 0.99, idle)
        shadow.start()
        shadow.offer(served_outputs)
        idle.set()  # an idle spell: the reference runs up to max_share
        await asyncio.sleep(2.0)
        idle.clear()  # then load that never lets the engine idle
        at_load, started = shadow.items, shadow.share()
        await asyncio.sleep(3.0)
        await shadow.close()
        return at_load, shadow.items, started

    at_load, after, lifetime_share = asyncio.run(shadowed())
    assert lifetime_share > 0.2  # the idle spell's runs: over the whole life, far above min_share
    assert after - at_load > 10 * shadow_module.BATCH, (at_load, after)  # many runs under load, not a straggler


def test_each_task_is_shadowed_by_the_figure_its_gate_checks(tiny_model, tmp_path):
    """A classifier's live figure is the share of top labels kept, judged by its mean; token tagging, reranking
    have theirs (unit checks below)."""
    from kiln.records.task import TaskConfig
    from kiln.tasks import task_handler

    out = tmp_path / "clf"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert", TaskName.TEXT_CLASSIFICATION)),
                               task=TaskName.TEXT_CLASSIFICATION, output=out, variants=("onnx-int8-dynamic",),
                               tolerance=0.5)).run()
    texts = list(builtin_sentences()[:12])
    app = create_app(ServeConfig(models={"c": out / "best"}, shadow=ShadowConfig(rate=1.0, max_share=1.0)))
    with TestClient(app) as c:
        for text in texts:
            assert c.post("/classify", json={"inputs": text}).status_code == 200
        wait_until(lambda: app.state.models["c"].shadow.items == len(texts), "every request to be shadowed")
        scraped = c.get("/metrics").text
        info = c.get("/kiln/info").json()["models"][0]["shadow"]
    best = Artifact.open(out / "best")
    served = best.predictor().with_batch_size(1)
    fp32 = best.predictor_of(best.reference_variant(), ServingPlan(EngineOptions(intra_op_threads=1), 1, 8))
    kept = [float(served.predict([t])[0][0].label == fp32.predict([t])[0][0].label) for t in texts]
    assert info["figure"] == "label_agreement" and info["judged"] == "mean"
    assert info["mean"] == pytest.approx(np.mean(kept)) and info["items"] == len(texts)
    assert metric(scraped, 'kiln_shadow_agreement{figure="mean_label_agreement",model="c"}') == pytest.approx(
        np.mean(kept))
    clf = task_handler(TaskConfig(task=TaskName.TEXT_CLASSIFICATION.value, max_length=32, id2label={0: "a", 1: "b"}))
    assert clf.validation.live_agreement(clf, np.array([0.1, 2.0]), np.array([0.3, 1.0])) == 1.0
    assert clf.validation.live_agreement(clf, np.array([2.0, 0.1]), np.array([0.3, 1.0])) == 0.0
    tags = task_handler(TaskConfig(task=TaskName.TOKEN_CLASSIFICATION.value, max_length=32, id2label={0: "O", 1: "X"}))
    served, reference = np.array([[1, 0], [0, 1], [1, 0]]), np.array([[1, 0], [1, 0], [1, 0]])
    assert tags.validation.live_agreement(tags, served, reference) == pytest.approx(2 / 3)
    ranker = task_handler(TaskConfig(task=TaskName.TEXT_RANKING.value, max_length=32, id2label={0: "LABEL_0"}))
    assert ranker.validation.live_agreement(ranker, np.array([0.0]), np.array([0.0])) == 1.0
    assert ranker.validation.live_agreement(ranker, np.array([0.0]), np.array([100.0])) == pytest.approx(0.5)
