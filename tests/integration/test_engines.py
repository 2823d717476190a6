"""Every engine behind one protocol: same results alone and in padded batches, chosen by registry."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kiln.artifact.directory import Artifact
from kiln.choices import ExportFormat, Precision
from kiln.data.texts import builtin_sentences
from kiln.engines import ENGINES, EngineOptions, create_engine
from kiln.engines.torch_eager import TorchEngine
from kiln.errors import UsageError
from kiln.exporting.job import ExportConfig, run_export
from kiln.source.loading import load_source
from kiln.source.reference import source_encoder, task_module
from kiln.tasks import TaskName

SHORT = "A short sentence."
LONG = [builtin_sentences()[-1], builtin_sentences()[-2], builtin_sentences()[-5]]

# The formats an encoder exports to (onnx-fused is a decoder's step graph: tests/integration/test_generation.py).
ENCODER_FORMATS = (ExportFormat.ONNX, ExportFormat.TORCHSCRIPT)
# Stated invariance tolerances: fp32 engines agree to float rounding; autocast engines to their precision.
TOLERANCE = {Precision.FP32: 1e-5, Precision.BF16: 5e-2, Precision.FP16: 5e-3}


@pytest.fixture(scope="module")
def artifacts(tiny_model, tmp_path_factory):
    model = str(tiny_model("bert"))
    out = {}
    for fmt in ENCODER_FORMATS:
        path = tmp_path_factory.mktemp(fmt.value) / "art"
        run_export(ExportConfig(model=model, task=TaskName.FEATURE_EXTRACTION, format=fmt, output=path))
        out[fmt] = path
    return out


def _alone_and_padded(engine, encoder, output="last_hidden_state"):
    alone = engine.run(encoder.collate(encoder.encode([SHORT])))[output][0]
    batch = encoder.collate(encoder.encode([*LONG, SHORT]))
    padded = engine.run(batch)[output][-1]
    n = int(batch["attention_mask"][-1].sum())
    assert batch["attention_mask"].shape[1] > n  # the short sentence really is padded
    return alone[:n], padded[:n]


@pytest.mark.parametrize("precision", list(Precision))
def test_torch_engine_invariance(tiny_model, precision):
    source = load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION)
    engine = TorchEngine(task_module(source), EngineOptions(precision=precision))
    engine.warmup()
    alone, padded = _alone_and_padded(engine, source_encoder(source))
    np.testing.assert_allclose(alone, padded, atol=TOLERANCE[precision])
    assert engine.providers == (f"torch-cpu-{precision.value}",)


@pytest.mark.parametrize("fmt", ENCODER_FORMATS)
def test_exported_engine_invariance(artifacts, fmt):

    art = Artifact.open(artifacts[fmt])
    engine = art.engine(options=EngineOptions(intra_op_threads=1))
    engine.warmup()
    alone, padded = _alone_and_padded(engine, art.encoder())
    np.testing.assert_allclose(alone, padded, atol=1e-5)
    assert engine.is_padded


def test_onnxruntime_threads_and_provider(artifacts):

    engine = Artifact.open(artifacts[ExportFormat.ONNX]).engine(
        options=EngineOptions(intra_op_threads=1, inter_op_threads=1))
    assert engine.providers == ("CPUExecutionProvider",)
    assert engine.session.get_session_options().intra_op_num_threads == 1


def test_kiln_spin_wait_sets_whether_onnxruntime_threads_spin_unless_the_caller_says(artifacts, monkeypatch):
    """KILN_SPIN_WAIT=0: the sessions of kiln.load (and kiln serve's) sleep between runs; spin_wait= still wins."""
    from kiln.engines.base import SPIN_WAIT_ENV
    from kiln.engines.onnxruntime import session_options

    def spins(options: EngineOptions) -> str:
        try:
            return session_options(options).get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # no entry: ONNX Runtime's default, which spins
            return "default"

    monkeypatch.delenv(SPIN_WAIT_ENV, raising=False)
    assert EngineOptions().spin_wait and spins(EngineOptions()) == "default"
    monkeypatch.setenv(SPIN_WAIT_ENV, "0")
    assert spins(EngineOptions()) == "0"
    artifact = Artifact.open(artifacts[ExportFormat.ONNX])
    assert not artifact.serving_plan().options.spin_wait and artifact.serving_plan(spin_wait=True).options.spin_wait
    monkeypatch.setenv(SPIN_WAIT_ENV, "no")
    with pytest.raises(UsageError, match="KILN_SPIN_WAIT must be 0 or 1 \\(got 'no'\\)"):
        EngineOptions()


def test_torchscript_handles_many_lengths(artifacts):
    """A frozen trace must stay correct across lengths it never saw (no shape baked in)."""

    art = Artifact.open(artifacts[ExportFormat.TORCHSCRIPT])
    engine, encoder = art.engine(), art.encoder()
    words = " ".join(builtin_sentences()).split()
    for n in (1, 3, 9, 27, 60, 100):
        arrays = encoder.collate(encoder.encode([" ".join(words[:n])]))
        out = engine.run(arrays)["last_hidden_state"]
        assert out.shape[:2] == arrays["input_ids"].shape and np.isfinite(out).all()


def test_registry_and_bad_options(artifacts):
    assert set(ENGINES) == {"onnxruntime", "torchscript", "torch", "openvino", "static"}
    with pytest.raises(UsageError, match="engine must be one of: onnxruntime, torchscript, torch, openvino, static"):
        create_engine("tensorflow", artifacts[ExportFormat.ONNX])
    with pytest.raises(UsageError, match="threads must be between 1 and"):
        EngineOptions(intra_op_threads=0)
    with pytest.raises(UsageError, match="device must be one of: cpu, cuda, tensorrt"):
        EngineOptions(device="tpu")


def test_gpu_provider_missing_is_a_clear_error(artifacts):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UsageError, match="device cuda needs CUDAExecutionProvider"):
        create_engine("onnxruntime", artifacts[ExportFormat.ONNX] / "onnx-fp32" / "model.onnx",
                      EngineOptions(device="cuda"))


def test_each_engine_says_up_front_where_it_cannot_run():
    import torch

    from kiln.engines import DEVICE_CHECKS, check_device

    assert set(ENGINES) == set(DEVICE_CHECKS)
    for engine in ENGINES:
        check_device(engine, "cpu")
    for engine, runtime in (("openvino", "OpenVINO"), ("static", "static embeddings")):
        with pytest.raises(UsageError, match=f"device cuda: kiln runs {runtime}.* on the cpu device only"):
            check_device(engine, "cuda")
    with pytest.raises(UsageError, match="device tensorrt is an ONNX Runtime provider; TorchScript runs on cpu"):
        check_device("torchscript", "tensorrt")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="device cuda: this torch .* sees no CUDA GPU"):
            check_device("torch", "cuda")


def _tensorrt_installed() -> bool:
    import ctypes

    for name in ("libnvinfer.so.10", "libnvinfer.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "tensorrt"])
def test_gpu_engines_with_iobinding(artifacts, device):
    art = Artifact.open(artifacts[ExportFormat.ONNX])
    if device == "tensorrt" and not _tensorrt_installed():  # onnxruntime-gpu lists the provider regardless
        with pytest.raises(UsageError, match="fell back from TensorrtExecutionProvider .*libnvinfer"):
            art.engine(options=EngineOptions(device=device))
        return
    cpu = art.engine()
    gpu = art.engine(options=EngineOptions(device=device))
    assert gpu.providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
    batch = art.encoder().collate(art.encoder().encode([*LONG, SHORT]))
    # fp32 on the GPU as on the CPU: with ONNX Runtime's default TF32 MatMuls this moved by up to 2.9e-3 (H200)
    np.testing.assert_allclose(gpu.run(batch)["last_hidden_state"], cpu.run(batch)["last_hidden_state"],
                               atol=1e-4)
    alone, padded = _alone_and_padded(gpu, art.encoder())
    np.testing.assert_allclose(alone, padded, atol=1e-4)


@pytest.mark.gpu
def test_torchscript_runs_on_the_device_it_was_traced_on(tiny_model, tmp_path):
    """A trace keeps the tensors the model makes on the fly (the attention mask's fill value) as constants on
    the trace's device, which map_location does not move: a CPU trace failed on an H100. kiln traces on the
    device it will run on, records it, and refuses the other one with a clear error."""
    from kiln.engines.torchscript import TorchScriptEngine
    from kiln.exporting.torchscript import export_torchscript
    from kiln.source.reference import example_inputs

    source = load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION)
    encoder = source_encoder(source)
    batch = encoder.collate(encoder.encode([*LONG, SHORT]))
    cpu = TorchEngine(task_module(source), EngineOptions()).run(batch)["last_hidden_state"]
    for device in ("cpu", "cuda"):
        path = tmp_path / f"{device}.pt"
        export_torchscript(task_module(source), example_inputs(source), path, device=device)
        np.testing.assert_allclose(TorchScriptEngine(path, EngineOptions(device=device)).run(batch)[
            "last_hidden_state"], cpu, atol=1e-4)
        other = "cpu" if device == "cuda" else "cuda"
        with pytest.raises(UsageError, match=f"device {other}: this TorchScript was traced on {device}"):
            TorchScriptEngine(path, EngineOptions(device=other))


@pytest.mark.parametrize("fmt", [*ENCODER_FORMATS, "openvino"])
def test_an_engine_never_writes_into_its_inputs(artifacts, fmt, tmp_path):
    """OpenVINO's zero-copy inputs were seen rewritten in place (issue 10): engines must copy what they change."""
    from kiln.optimizing.openvino_passes import convert

    art = Artifact.open(artifacts[ExportFormat.ONNX if fmt == "openvino" else fmt])
    encoder = art.encoder()
    if fmt == "openvino":
        convert(art.path / art.variant().path, tmp_path / "model.xml")
        engine = create_engine("openvino", tmp_path / "model.xml", EngineOptions(intra_op_threads=1))
    else:
        engine = art.engine(options=EngineOptions(intra_op_threads=1))
    batches = [encoder.collate(encoder.encode(texts)) for texts in ([SHORT], LONG, [*LONG, SHORT], [SHORT] * 3)]
    kept = [{k: v.copy() for k, v in b.items()} for b in batches]
    for _ in range(2):
        for batch in batches:
            engine.run(batch)
    for batch, before in zip(batches, kept):
        for name in before:
            np.testing.assert_array_equal(batch[name], before[name])


def test_the_openvino_vocabulary_is_read_from_the_gather_the_ids_reach():
    """embedding_rows follows input_ids through Converts to the Gather that takes them as indices; a graph where
    they reach no Gather has no table to check against (None: the engine then does not guess one)."""
    import openvino as ov
    import openvino.opset13 as ops

    from kiln.engines.openvino import embedding_rows

    def ids() -> object:
        parameter = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
        parameter.output(0).set_names({"input_ids"})
        return parameter

    looked_up = ids()
    table = ops.gather(ops.constant(np.zeros((7, 3), np.float32)), ops.convert(looked_up, ov.Type.i32),
                       ops.constant(np.int64(0)))
    assert embedding_rows(ov.Model([table], [looked_up])) == 7
    added = ids()
    plain = ops.add(ops.convert(added, ov.Type.f32), ops.constant(np.float32(1)))
    assert embedding_rows(ov.Model([plain], [added])) is None


def test_an_openvino_call_casts_its_inputs_and_a_bad_call_leaves_the_session_usable(artifacts, tmp_path):
    """kiln's OpenVINO call copies the inputs into the request's own tensors (kiln.engines.openvino._call): int32
    ids answer as int64 ones do; a call missing an input fails naming it and frees the session's request; inputs
    OpenVINO's synchronous call would run without complaint (ids and mask of different widths, 3-D ids, ids outside
    the vocabulary) are refused as ONNX Runtime refuses them; and such a call made past that check does not break
    later calls of the same shape, which OpenVINO's start_async + wait path did (every later call of that shape
    failed)."""
    from kiln.optimizing.openvino_passes import convert

    art = Artifact.open(artifacts[ExportFormat.ONNX])
    convert(art.path / art.variant().path, tmp_path / "model.xml")
    engine = create_engine("openvino", tmp_path / "model.xml", EngineOptions(intra_op_threads=1))
    batch = art.encoder().collate(art.encoder().encode([*LONG, SHORT]))
    want = engine.run(batch)["last_hidden_state"]
    narrow = engine.run({k: v.astype(np.int32) for k, v in batch.items()})["last_hidden_state"]
    np.testing.assert_array_equal(narrow, want)
    with pytest.raises(KeyError, match="attention_mask"):
        engine.run({k: v for k, v in batch.items() if k != "attention_mask"})
    assert not engine._own.locked()
    mismatched = {**batch, "attention_mask": batch["attention_mask"][:, :-1]}  # one token fewer than the ids
    with pytest.raises(UsageError, match=r"share one \[batch, length\] shape"):
        engine.run(mismatched)
    with pytest.raises(UsageError, match="'input_ids' takes 2-D arrays"):
        engine.run({**batch, "input_ids": batch["input_ids"][None]})
    vocabulary = art.encoder().tokenizer.get_vocab_size()
    assert engine._vocabulary == vocabulary  # read from the graph's embedding Gather, not assumed
    for bad in (vocabulary, -1):  # OpenVINO would read outside its table and answer; ONNX Runtime refuses
        ids = batch["input_ids"].copy()
        ids[0, 1] = bad
        with pytest.raises(UsageError, match=f"token id {bad} is outside the model's vocabulary \\(0 to "
                                             f"{vocabulary - 1}\\)"):
            engine.run({**batch, "input_ids": ids})
    assert not engine._own.locked()
    from kiln.engines.openvino import _call

    try:  # past kiln's check, straight to OpenVINO: its synchronous call runs it; what it answers is not the point
        _call(engine._request, mismatched, engine.input_names, engine.output_names)
    except RuntimeError:  # failing would be as good, if the next call of the batch's shape still answers right
        pass
    np.testing.assert_array_equal(engine.run(batch)["last_hidden_state"], want)


def test_openvino_sessions_are_streams_of_one_compiled_model(artifacts, tmp_path):
    """Sessions of an OpenVINO model are infer requests on one model compiled with a stream per session."""
    from kiln.engines import open_sessions
    from kiln.optimizing.openvino_passes import convert
    from kiln.runtime.predictor import Predictor
    from kiln.tasks import task_handler

    art = Artifact.open(artifacts[ExportFormat.ONNX])
    convert(art.path / art.variant().path, tmp_path / "model.xml")
    sessions = open_sessions("openvino", tmp_path / "model.xml", EngineOptions(intra_op_threads=1), 2)
    compiled = {id(s.compiled_model) for s in sessions}
    assert len(sessions) == 2 and len(compiled) == 1 and len({id(s._request) for s in sessions}) == 2
    assert int(sessions[0].compiled_model.get_property("NUM_STREAMS")) == 2
    assert int(sessions[0].compiled_model.get_property("INFERENCE_NUM_THREADS")) == 2  # 1 thread per stream
    texts = [SHORT, *LONG] * 6
    encoder = art.encoder()
    single = create_engine("openvino", tmp_path / "model.xml", EngineOptions(intra_op_threads=1))
    want = Predictor(task_handler(art.task_config), encoder, single, batch_size=2).predict(texts)
    got = Predictor(task_handler(art.task_config), encoder, sessions[0], batch_size=2,
                    sessions=sessions[1:]).predict(texts)
    np.testing.assert_allclose(np.stack(got), np.stack(want), atol=1e-4)


def test_single_thread_onnxruntime_sessions_share_one_loaded_model(artifacts):
    """Single-thread ONNX Runtime sessions are views of one InferenceSession (the weights and the arena once) that
    answer side by side as separate sessions do; sessions of several threads each load their own."""
    from kiln.engines import open_sessions
    from kiln.runtime.predictor import Predictor
    from kiln.tasks import task_handler

    art = Artifact.open(artifacts[ExportFormat.ONNX])
    path = art.path / art.variant().path
    shared = open_sessions("onnxruntime", path, EngineOptions(intra_op_threads=1), 3)
    assert len(shared) == 3 and len({id(s.session) for s in shared}) == 1 and len(set(map(id, shared))) == 3
    apart = open_sessions("onnxruntime", path, EngineOptions(intra_op_threads=2), 2)
    assert len({id(s.session) for s in apart}) == 2
    rows = open_sessions("onnxruntime", path, EngineOptions(intra_op_threads=1, rows_alone=True), 2)
    assert len({id(s.engine.session) for s in rows}) == 1  # each view wrapped row by row
    texts = [SHORT, *LONG] * 6
    encoder = art.encoder()
    want = Predictor(task_handler(art.task_config), encoder, apart[0], batch_size=2).predict(texts)
    got = Predictor(task_handler(art.task_config), encoder, shared[0], batch_size=2,
                    sessions=shared[1:]).predict(texts)
    np.testing.assert_allclose(np.stack(got), np.stack(want), atol=1e-5)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenVINO's throughput hint gives one stream on one core")
def test_kiln_load_splits_the_cores_of_an_openvino_variant_and_runs_a_lone_batch_on_all(tiny_model, tmp_path,
                                                                                        monkeypatch):
    """Without serving.json, kiln.load runs an OpenVINO variant as one single-thread stream per core (passes over many
    texts) and a call that makes one batch on a session of all cores; the caller's flags still win, other engines
    keep one session, and every way gives the same answers."""
    from dataclasses import replace

    import kiln
    import kiln.system.cpu as cpu
    from kiln.artifact.directory import SPLIT_CORES_BATCH, split_cores_plan
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    out = tmp_path / "ov"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32", "openvino-fp32"))).run()
    real = cpu.cpu_info()
    monkeypatch.setattr(cpu, "cpu_info", lambda: replace(real, usable_cores=2))
    split = kiln.load(out, "openvino-fp32")
    compiled = split.sessions[0].compiled_model  # OpenVINO's throughput hint picked the streams: 2 x 1 on 2 cores
    assert compiled.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert len(split.sessions) == int(compiled.get_property("NUM_STREAMS")) >= 2 and split.solo is not None
    assert len({id(s.compiled_model) for s in split.sessions}) == 1  # the weights once
    assert split.batch_size == SPLIT_CORES_BATCH and kiln.load(out, "openvino-fp32", batch_size=32).batch_size == 32
    assert int(split.solo.compiled_model.get_property("INFERENCE_NUM_THREADS")) == 2
    one = kiln.load(out, "openvino-fp32", sessions=1)
    assert len(one.sessions) == 1 and one.solo is None
    assert kiln.load(out, "onnx-fp32").solo is None and len(kiln.load(out, "onnx-fp32").sessions) == 1
    assert split_cores_plan("openvino", TaskName.TEXT_GENERATION, "cpu") is None  # one loop steps
    texts = [SHORT, *LONG] * 6
    calls: list[str] = []
    for name, engine in (("solo", split.solo), ("session", split.sessions[1])):
        run = engine.run
        monkeypatch.setattr(engine, "run", lambda inputs, run=run, name=name: calls.append(name) or run(inputs))
    lone = [SHORT, "A short phrase."]  # like lengths: one batch (a short and a long text run as two)
    np.testing.assert_allclose(np.stack(split.predict(lone)), np.stack(one.predict(lone)), atol=1e-4)
    assert calls == ["solo"]  # the lone batch
    calls.clear()
    import kiln.runtime.predictor as predictor_module
    from kiln.system.memory import trim_heap

    trims: list[bool] = []
    monkeypatch.setattr(predictor_module, "TRIM_AFTER_S", 0.0)  # every pass counts as long
    monkeypatch.setattr(predictor_module, "trim_heap", lambda: trims.append(trim_heap()))
    np.testing.assert_allclose(np.stack(split.with_batch_size(2).predict(texts)),
                               np.stack(one.predict(texts)), atol=1e-4)
    assert "session" in calls and "solo" not in calls  # nine batches: side by side on the streams
    assert len(trims) == 1  # the streams' freed buffers handed back once, after the pass
    monkeypatch.setattr(cpu, "cpu_info", lambda: replace(real, usable_cores=1))
    assert kiln.load(out, "openvino-fp32").solo is None


@pytest.mark.parametrize("fmt", [ExportFormat.ONNX, "openvino"])
def test_one_predictor_answers_8_threads_at_once_as_it_answers_one(artifacts, fmt, tmp_path):
    """A predictor shared by 8 user threads (a web app's workers) gives each call its sequential answer. OpenVINO's
    single infer request used to be shared by all of them (it refuses or mixes concurrent calls)."""
    from kiln.optimizing.openvino_passes import convert
    from kiln.runtime.predictor import Predictor
    from kiln.tasks import task_handler
    from tests.waiting import concurrently

    art = Artifact.open(artifacts[ExportFormat.ONNX])
    if fmt == "openvino":
        convert(art.path / art.variant().path, tmp_path / "model.xml")
        engine = create_engine("openvino", tmp_path / "model.xml", EngineOptions(intra_op_threads=1))
    else:
        engine = art.engine(options=EngineOptions(intra_op_threads=1))
    predictor = Predictor(task_handler(art.task_config), art.encoder(), engine, batch_size=4)
    calls = [[SHORT, *LONG][: 1 + k % 3] + [f"thread {k} " * (1 + 7 * k)] for k in range(8)]
    want = [np.stack(predictor.predict(texts)) for texts in calls]
    for _ in range(3):
        got = concurrently([lambda t=t: np.stack(predictor.predict(t)) for t in calls], "8 concurrent predict() calls")
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-5)


def test_rows_alone_answers_each_input_as_if_it_ran_by_itself(artifacts, tmp_path):
    """RowByRow (EngineOptions(rows_alone=True)) over dynamic int8: an input's output no longer depends on its batch,
    and equals the plain engine's on that input alone; per-token outputs are padded back to the batch's width."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from kiln.engines.rows import RowByRow

    art = Artifact.open(artifacts[ExportFormat.ONNX])
    quantize_dynamic(art.path / art.variant().path, tmp_path / "int8.onnx", weight_type=QuantType.QInt8)
    plain = create_engine("onnxruntime", tmp_path / "int8.onnx", EngineOptions(intra_op_threads=1))
    rows = create_engine("onnxruntime", tmp_path / "int8.onnx", EngineOptions(intra_op_threads=1, rows_alone=True))
    assert isinstance(rows, RowByRow) and rows.sequence_outputs == {"last_hidden_state"}
    encoder = art.encoder()
    texts = [SHORT, *LONG]
    batch = encoder.collate(encoder.encode(texts))
    together = rows.run(batch)["last_hidden_state"]
    assert together.shape == plain.run(batch)["last_hidden_state"].shape
    for i, text in enumerate(texts):
        alone = plain.run(encoder.collate(encoder.encode([text])))["last_hidden_state"][0]
        n = alone.shape[0]
        np.testing.assert_array_equal(together[i, :n], alone)  # bit-identical to running it by itself
        assert not together[i, n:].any()  # padding positions are zeros


FIRST_CALLS = """
import sys, threading
from pathlib import Path
sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible: the race below then happens nearly every run
from kiln.engines import EngineOptions, open_sessions
import numpy as np
sessions = open_sessions("openvino", Path(sys.argv[1]), EngineOptions(intra_op_threads=1), int(sys.argv[2]))
start = threading.Barrier(len(sessions))
def first_call(session):
    start.wait()
    session.run({"x": np.ones((2, 4), np.float32)})
threads = [threading.Thread(target=first_call, args=(s,), daemon=True) for s in sessions]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("all answered", flush=True)
"""


def test_openvino_sessions_making_their_first_calls_at_once_do_not_deadlock(tmp_path):
    """OpenVINO's Python binding builds a static map of numpy dtypes on its first tensor-to-numpy conversion, calling
    into numpy with the GIL while other threads wait for that static's guard holding the GIL. Eight sessions making
    their first calls at once, the GIL switching every microsecond, hung in 9 of 10 fresh processes before
    OpenVinoEngine primed the map on one thread (kiln.engines.openvino.prime_numpy_views); three in a row must now
    answer."""
    import subprocess
    import sys

    ov = pytest.importorskip("openvino")
    from openvino import opset13 as ops

    x = ops.parameter([-1, 4], np.float32, name="x")
    ov.save_model(ov.Model([ops.relu(x)], [x]), tmp_path / "relu.xml")
    sessions = min(8, 4 * (os.cpu_count() or 1))  # kiln allows up to 4 threads a core
    for _ in range(3):
        try:
            run = subprocess.run([sys.executable, "-c", FIRST_CALLS, str(tmp_path / "relu.xml"), str(sessions)],
                                 capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("sessions making their first calls at once deadlocked")
        assert run.returncode == 0 and "all answered" in run.stdout, run.stderr[-2000:]
