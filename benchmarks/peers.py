"""kiln against what a user can assemble from existing tools, on the same texts, in one sitting (issue 10).

Peers, each run the way their documentation shows:
  * sentence-transformers on PyTorch fp32 (``SentenceTransformer(model).encode``);
  * sentence-transformers' OpenVINO backend on optimum-intel's fp32 IR at OpenVINO's default precision (bf16
    where the CPU has it), and on an int8 IR made by optimum-intel's export + NNCF (``nncf.quantize``,
    transformer preset, its default SmoothQuant), calibrated on the same texts kiln calibrates on by default --
    that int8 peer also with batches of 8 (``st-openvino-int8-b8``), the batch kiln.load's split plan now uses, so
    that a lead from batch size alone shows as such;
  * sentence-transformers' ONNX backend on its own dynamic int8 export
    (``export_dynamic_quantized_onnx_model``, the avx512_vnni config where the CPU has VNNI, else avx2);
  * fastembed 0.9.1 on that fp32 ONNX export, and on a per-channel int8 of it (ONNX Runtime's dynamic
    quantization, as the int8 MiniLM fastembed downloads is made), loaded as a local custom model;
and kiln's chosen variant through ``kiln.load(ARTIFACT).predict`` as users run it (its defaults), and as one session
of the peers' threads with their batches of 32.

Two measurements per configuration: end to end (texts in, embeddings out: tokenization included, each
library's own batching) and engine-only (the same pre-tokenized, length-sorted batches of 32 padded to their
longest, tokenization excluded; OpenVINO IRs through a plain ``compile_model`` with the LATENCY hint and the
same threads), plus batch-1 latency at 128 tokens. Fidelity: cosine of each configuration's embeddings to
sentence-transformers on PyTorch, mean and min, on the held-out texts and, separately, on kiln's 50 built-in plain
English sentences (1-50 words; no configuration calibrates on them, and kiln's gate sees them among its agreement
inputs). On a 2-core AMX Xeon every int8 OpenVINO IR run with bf16 float ops, the optimum-intel peer's included,
held 0.996 on the held-out texts and fell to ~0.70 on such sentences: one text set hides it.

optimum-intel pins an older transformers than kiln's, so the peers run in their own virtual environments,
created on first use (``--venv``, default ``benchmarks/.peers-venv``; ``benchmarks/.st-onnx-venv``: the ONNX
backend's optimum-onnx needs transformers < 4.58, so sentence-transformers 5.x there; ``benchmarks/.fastembed-venv``;
each needs the package index once). Each
configuration runs in a fresh process; ``--rounds`` rounds alternate peers and kiln, and each figure is
reported per round and as the median.

    python benchmarks/peers.py kiln-out [--rounds 2] [--texts 1024] [--threads 2] [--json out.json] [--variants]

``--variants`` also times every variant kiln optimize accepted, end to end through ``kiln.load(kiln-out,
variant=NAME).predict`` (its defaults, passes alternated between variants), and says whether the one it chose as
``best/`` from its own timing (engine and batching on pre-tokenized inputs) is the fastest end to end.

Decoders (GPT-2-shaped, greedy continuations; see benchmarks/decoder_peers.py):

    python benchmarks/peers.py decoders MODEL_DIR KILN_OPTIMIZE_OUT [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEER_PACKAGES = ["torch==2.13.0", "optimum-intel[openvino,nncf]==2.2.0", "sentence-transformers==6.2.0"]
# sentence-transformers 6 needs transformers >= 5; optimum-onnx (its ONNX backend) needs < 4.58: the 5.x line.
ST_ONNX_PACKAGES = ["torch==2.13.0", "sentence-transformers[onnx]<6"]
FASTEMBED_PACKAGES = ["fastembed==0.9.1", "onnx"]  # onnx: ONNX Runtime's quantizer reads the graph with it
BATCH = 32
SMALL_BATCH = 8  # kiln.artifact.directory.SPLIT_CORES_BATCH, tried on the best peer too
PEERS = ("st-torch", "st-openvino", "st-openvino-int8", "st-openvino-int8-b8", "st-onnx-int8", "fastembed-fp32",
         "fastembed-int8")


# -- the orchestrator (kiln's environment) -------------------------------------------------------------------
def _ensure_venv(venv: Path, packages: list[str] = PEER_PACKAGES) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating a peers' environment in {venv} ({', '.join(packages)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
        # optimum-intel pulls a torchvision built for another torch ("operator torchvision::nms does not
        # exist" on importing transformers' models); nothing here needs it.
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=False)
    return python


def _prepare(artifact: Path, work: Path, count: int, root: Path) -> dict:
    """Texts, calibration texts and pre-tokenized batches, written once for every configuration. ``root``: the kiln
    optimize output ``artifact`` (its best/) came from."""
    import numpy as np

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import held_out_mix
    from kiln.tasks import task_spec

    art = Artifact.open(artifact)
    encoder = art.encoder()
    texts = held_out_mix(count, encoder.token_count)
    calibration = task_spec(art.task_config.task).validation.calibration_inputs(encoder)  # kiln's default calibration
    encodings = encoder.encode(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    batches = [encoder.collate([encodings[i] for i in order[b : b + BATCH]]) for b in range(0, len(order), BATCH)]
    np.savez(work / "batches.npz", **{f"{k}.{i}": v for i, b in enumerate(batches) for k, v in b.items()})
    one = encoder.collate(encoder.encode([" ".join(["kiln"] * 400)]))
    np.savez(work / "b1.npz", **{k: v[:, :128] for k, v in one.items()})
    from kiln.data.texts import builtin_sentences
    from kiln.system.cpu import cpu_info

    setup = {"texts": texts, "sentences": list(builtin_sentences()), "calibration": calibration, "order": order,
             "batches": len(batches),
             "model_dir": art.manifest.source.path, "artifact": str(artifact), "root": str(root),
             "vnni": "avx512-vnni" in cpu_info().features, "dimension": art.task_config.dimension}
    (work / "setup.json").write_text(json.dumps(setup))
    return setup


def _run_stage(python: Path, stage: str, work: Path, threads: int) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([str(python), __file__, "--stage", stage, "--work", str(work), "--threads", str(threads)],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"stage {stage} failed:\n{out.stderr[-4000:]}")
    return json.loads((work / f"{stage}.json").read_text())


def _fidelity(work: Path, name: str, texts: str = "") -> tuple[float, float]:
    """Cosine mean and min of ``name``'s embeddings to sentence-transformers on PyTorch (``texts``: "" for the
    held-out texts, ".sentences" for the built-in plain sentences)."""
    import numpy as np

    ref, got = np.load(work / f"st-torch{texts}.npy"), np.load(work / f"{name}{texts}.npy")
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    return float(cos.mean()), float(cos.min())


def _save(work: Path, name: str, encode) -> None:
    """``name``'s embeddings of the held-out texts and of the plain sentences, for the fidelity figures."""
    import numpy as np

    setup = json.loads((work / "setup.json").read_text())
    np.save(work / f"{name}.npy", np.asarray(encode(setup["texts"])))
    np.save(work / f"{name}.sentences.npy", np.asarray(encode(setup["sentences"])))


# -- the stages (each in a fresh process) ---------------------------------------------------------------------
def _batches(work: Path) -> list[dict]:
    import numpy as np

    data = np.load(work / "batches.npz")
    setup = json.loads((work / "setup.json").read_text())
    return [{k: data[f"{k}.{i}"] for k in ("input_ids", "attention_mask", "token_type_ids")}
            for i in range(setup["batches"])]


def _b1(work: Path) -> dict:
    import numpy as np

    data = np.load(work / "b1.npz")
    return {k: data[k] for k in data.files}


# The stages keep their own two small timers, not kiln.runtime.timing: the peer stage runs in a venv without
# kiln, and every configuration must be timed by the same code.
def _time(fn, repeats: int = 2) -> float:
    """Best of ``repeats`` passes (after one untimed pass) in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _latency(fn, runs: int = 30) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def _ov_engine_only(xml: Path, batches: list[dict], b1: dict, threads: int) -> dict:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(xml)), "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    names = [i.get_any_name() for i in compiled.inputs]
    request = compiled.create_infer_request()

    def run(b):
        return request.infer({n: b[n] for n in names})

    seconds = _time(lambda: [run(b) for b in batches])
    return {"engine_per_s": sum(len(b["input_ids"]) for b in batches) / seconds, "b1_128_ms": _latency(lambda: run(b1))}


def stage_peer(work: Path, threads: int) -> dict:
    """sentence-transformers on torch, and on OpenVINO with an optimum-intel + NNCF int8 IR."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    setup = json.loads((work / "setup.json").read_text())
    texts, batches, b1 = setup["texts"], _batches(work), _b1(work)
    results = {"st-torch": _st_torch(setup["model_dir"], texts, batches, b1, work)}
    peer_dir = work / "st-openvino"
    xml = peer_dir / "openvino" / "openvino_model_qint8.xml"
    if not xml.exists():
        results["build"] = _build_peer_ir(Path(setup["model_dir"]), peer_dir, setup["calibration"])
    ov_st = SentenceTransformer(str(peer_dir), device="cpu", backend="openvino", model_kwargs={
        "file_name": "openvino/openvino_model_qint8.xml",
        "ov_config": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}})
    seconds = _time(lambda: ov_st.encode(texts, batch_size=BATCH))
    _save(work, "st-openvino-int8", lambda t: ov_st.encode(t, batch_size=BATCH))
    results["st-openvino-int8"] = {"end_to_end_per_s": len(texts) / seconds,
                                   **_ov_engine_only(xml, batches, b1, threads)}
    seconds = _time(lambda: ov_st.encode(texts, batch_size=SMALL_BATCH))
    _save(work, "st-openvino-int8-b8", lambda t: ov_st.encode(t, batch_size=SMALL_BATCH))
    results["st-openvino-int8-b8"] = {"end_to_end_per_s": len(texts) / seconds}
    # The fp32 IR at OpenVINO's default precision: bf16 on a CPU with AVX-512 BF16 or AMX, else fp32.
    default = SentenceTransformer(str(peer_dir), device="cpu", backend="openvino", model_kwargs={
        "file_name": "openvino/openvino_model.xml", "ov_config": {"INFERENCE_NUM_THREADS": threads}})
    seconds = _time(lambda: default.encode(texts, batch_size=BATCH))
    _save(work, "st-openvino", lambda t: default.encode(t, batch_size=BATCH))
    results["st-openvino"] = {"end_to_end_per_s": len(texts) / seconds}
    return results


def stage_st_onnx(work: Path, threads: int) -> dict:
    """sentence-transformers' ONNX backend: its fp32 export (saved for fastembed too) and its dynamic int8."""
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    setup = json.loads((work / "setup.json").read_text())
    texts, peer_dir = setup["texts"], work / "st-onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    config = "avx512_vnni" if setup["vnni"] else "avx2"

    def exported_int8() -> str | None:  # its name says the weights' type: qint8 (avx512_vnni), quint8 (avx2)
        found = sorted(peer_dir.glob(f"onnx/model_q*int8_{config}.onnx"))
        return found[0].relative_to(peer_dir).as_posix() if found else None

    if exported_int8() is None:
        shutil.copytree(setup["model_dir"], peer_dir, ignore=shutil.ignore_patterns("README.md"), dirs_exist_ok=True)
        exported = SentenceTransformer(str(peer_dir), device="cpu", backend="onnx")  # exports with optimum-onnx
        exported.save_pretrained(str(peer_dir))  # onnx/model.onnx: the fp32 graph fastembed loads
        export_dynamic_quantized_onnx_model(exported, config, str(peer_dir))
        # save_pretrained rewrote tokenizer_config.json with max_length 128 (a call default); fastembed takes the
        # tighter of that and model_max_length as its context and cut every text at 128 tokens (min cosine 0.77
        # against sentence-transformers, which reads 256). The model's own file, as published, goes back.
        shutil.copy(Path(setup["model_dir"]) / "tokenizer_config.json", peer_dir / "tokenizer_config.json")
    name = exported_int8()
    st = SentenceTransformer(str(peer_dir), device="cpu", backend="onnx", model_kwargs={
        "file_name": name, "provider": "CPUExecutionProvider", "session_options": options})
    seconds = _time(lambda: st.encode(texts, batch_size=BATCH))
    _save(work, "st-onnx-int8", lambda t: st.encode(t, batch_size=BATCH))
    return {"st-onnx-int8": {"end_to_end_per_s": len(texts) / seconds, "config": config}}


def stage_fastembed(work: Path, threads: int) -> dict:
    """fastembed on the ONNX backend's fp32 export and on a per-channel int8 of it, as local custom models."""
    import numpy as np
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType
    from onnxruntime.quantization import QuantType, quantize_dynamic

    setup = json.loads((work / "setup.json").read_text())
    texts, peer_dir = setup["texts"], work / "st-onnx"
    int8 = peer_dir / "onnx" / "model_int8_per_channel.onnx"
    if not int8.exists():
        quantize_dynamic(str(peer_dir / "onnx" / "model.onnx"), str(int8), per_channel=True,
                         weight_type=QuantType.QInt8)
    results = {}
    for label, file in (("fastembed-fp32", "onnx/model.onnx"), ("fastembed-int8", f"onnx/{int8.name}")):
        name = f"kiln-peers/{label}"
        TextEmbedding.add_custom_model(model=name, pooling=PoolingType.MEAN, normalization=True,
                                       sources=ModelSource(hf=name), dim=setup["dimension"], model_file=file)
        model = TextEmbedding(model_name=name, specific_model_path=str(peer_dir), threads=threads)
        seconds = _time(lambda model=model: list(model.embed(texts, batch_size=BATCH)))
        _save(work, label, lambda t, model=model: np.stack(list(model.embed(t, batch_size=BATCH))))
        results[label] = {"end_to_end_per_s": len(texts) / seconds}
    return results


def _st_torch(model_dir: str, texts: list[str], batches: list[dict], b1: dict, work: Path) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model_dir, device="cpu")
    seconds = _time(lambda: st.encode(texts, batch_size=BATCH))
    _save(work, "st-torch", lambda t: st.encode(t, batch_size=BATCH))
    model = st[0].auto_model

    def forward(b):
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v) for k, v in b.items()})

    engine = _time(lambda: [forward(b) for b in batches])
    return {"end_to_end_per_s": len(texts) / seconds, "engine_per_s": len(texts) / engine,
            "b1_128_ms": _latency(lambda: forward(b1))}


def _build_peer_ir(model_dir: Path, dest: Path, calibration: list[str]) -> dict:
    """optimum-intel's export, then NNCF int8 as its documentation shows (transformer preset)."""
    import nncf
    import openvino as ov
    from optimum.intel import OVModelForFeatureExtraction
    from transformers import AutoTokenizer

    start = time.perf_counter()
    shutil.copytree(model_dir, dest, ignore=shutil.ignore_patterns("*.safetensors", "README.md"))
    exported = OVModelForFeatureExtraction.from_pretrained(str(model_dir), export=True, compile=False)
    exported.save_pretrained(str(dest / "openvino"))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = ov.Core().read_model(str(dest / "openvino" / "openvino_model.xml"))
    names = {i.get_any_name() for i in model.inputs}
    data = [{k: v for k, v in tokenizer(t, return_tensors="np").items() if k in names} for t in calibration]
    quantized = nncf.quantize(model, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(data))
    ov.save_model(quantized, str(dest / "openvino" / "openvino_model_qint8.xml"))
    return {"seconds": time.perf_counter() - start, "calibration_texts": len(data)}


def stage_kiln(work: Path, threads: int) -> dict:
    """kiln.load(...).predict end to end, as users run it (kiln.load's defaults: serving.json where kiln bench wrote
    one, else its split of the cores) and as one session of the same threads with batches of 32 (the peers'
    shape), the two passes alternated; its engine on the same batches; its IR on plain OpenVINO too."""
    import numpy as np

    import kiln

    setup = json.loads((work / "setup.json").read_text())
    texts, batches, b1 = setup["texts"], _batches(work), _b1(work)
    loaded = kiln.load(setup["artifact"])
    one = kiln.load(setup["artifact"], threads=threads, batch_size=BATCH, sessions=1)
    seconds = {"loaded": float("inf"), "one": float("inf")}
    for _ in range(2):  # alternated: this VM's speed drifts within a minute
        for name, predictor in (("loaded", loaded), ("one", one)):
            seconds[name] = min(seconds[name], _time(lambda p=predictor: p.predict(texts), repeats=1))
    _save(work, "kiln", lambda t: np.stack(loaded.predict(t)))
    engine = one.engine
    engine_s = _time(lambda: [engine.run(b) for b in batches])
    plan = f"{len(loaded.sessions)} session(s), batches of {loaded.batch_size}" + (", a lone batch on all threads"
                                                                                  if loaded.solo else "")
    result = {"end_to_end_per_s": len(texts) / seconds["loaded"], "kiln_load_plan": plan,
              "one_session_end_to_end_per_s": len(texts) / seconds["one"], "engine_per_s": len(texts) / engine_s,
              "b1_128_ms": _latency(lambda: engine.run(b1)), "variant": one.engine.name}
    from kiln.artifact.directory import Artifact

    art = Artifact.open(setup["artifact"])
    record = art.variant()
    result["variant"] = art.variant_name()
    if record.engine == "openvino":  # the same plain-runtime protocol as the peer's IR
        result["plain_openvino"] = _ov_engine_only(art.path / record.path, batches, b1, threads)
    result["serving_default"] = art.serving_default()
    return {"kiln": result}


def stage_kiln_variants(work: Path, threads: int) -> dict:
    """Every accepted variant of the kiln optimize output end to end, as kiln.load runs each by default: does the
    end-to-end order keep kiln optimize's choice first?"""
    import kiln
    from kiln.artifact.directory import Artifact
    from kiln.records.artifact import Status

    setup = json.loads((work / "setup.json").read_text())
    root = Path(setup["root"])
    manifest = Artifact.open(root).manifest
    names = [n for n, r in manifest.variants.items() if r.status is Status.ACCEPTED]
    loaded = {n: kiln.load(root, variant=n) for n in names}
    seconds = dict.fromkeys(names, float("inf"))
    for _ in range(2):  # alternated: this VM's speed drifts within a minute
        for name, predictor in loaded.items():
            seconds[name] = min(seconds[name], _time(lambda p=predictor: p.predict(setup["texts"]), repeats=1))
    per_s = {n: len(setup["texts"]) / s for n, s in seconds.items()}
    fastest = max(per_s, key=per_s.get)
    return {"kiln-variants": {"end_to_end_per_s": per_s, "best": manifest.build.best, "fastest": fastest,
                              "best_vs_fastest": per_s[manifest.build.best] / per_s[fastest],
                              "optimize_ms_per_seq": {n: manifest.variants[n].timing.ms_per_sequence for n in names
                                                      if manifest.variants[n].timing is not None}}}


STAGES = {"peer": stage_peer, "st-onnx": stage_st_onnx, "fastembed": stage_fastembed, "kiln": stage_kiln,
          "kiln-variants": stage_kiln_variants}


# -- main -------------------------------------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "decoders":  # the decoder peers: benchmarks/decoder_peers.py
        sys.argv = [str(HERE / "decoder_peers.py"), *sys.argv[2:]]
        sys.path.insert(0, str(HERE))
        import decoder_peers

        decoder_peers.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--venv", type=Path, default=HERE / ".peers-venv")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variants", action="store_true",
                        help="also time every accepted variant end to end: is kiln optimize's best the fastest?")
    parser.add_argument("--stage", choices=tuple(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        result = STAGES[args.stage](args.work, args.threads)
        (args.work / f"{args.stage}.json").write_text(json.dumps(result))
        return
    if args.artifact is None:
        parser.error("name a kiln optimize output (e.g. kiln-out)")
    artifact = args.artifact / "best" if (args.artifact / "best" / "manifest.json").is_file() else args.artifact
    pythons = {"peer": _ensure_venv(args.venv),
               "st-onnx": _ensure_venv(HERE / ".st-onnx-venv", ST_ONNX_PACKAGES),
               "fastembed": _ensure_venv(HERE / ".fastembed-venv", FASTEMBED_PACKAGES),
               "kiln": Path(sys.executable)}
    if args.variants:
        pythons["kiln-variants"] = Path(sys.executable)
    with tempfile.TemporaryDirectory(prefix="kiln-peers-") as tmp:
        work = Path(tmp)
        setup = _prepare(artifact, work, args.texts, root=args.artifact)
        rounds = []
        for r in range(args.rounds):
            row = {}
            for stage, python in pythons.items():  # fastembed after st-onnx: it loads that stage's export
                row.update(_run_stage(python, stage, work, args.threads))
            for name in (*PEERS[1:], "kiln"):
                row[name]["cosine_mean"], row[name]["cosine_min"] = _fidelity(work, name)
                row[name]["sentences_cosine_mean"], row[name]["sentences_cosine_min"] = _fidelity(
                    work, name, ".sentences")
            rounds.append(row)
            print(f"round {r + 1}: " + json.dumps(row), flush=True)
    summary = _summarise(rounds)
    print(_table(summary))
    if args.variants:
        summary["kiln-variants"] = _variants_summary(rounds)
        print(_variants_table(summary["kiln-variants"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"texts": len(setup["texts"]), "threads": args.threads, "batch": BATCH,
                                         "rounds": rounds, "median": summary}, indent=2) + "\n")


def _summarise(rounds: list[dict]) -> dict:
    names = (*PEERS, "kiln")
    keys = ("end_to_end_per_s", "engine_per_s", "b1_128_ms", "cosine_mean", "cosine_min", "sentences_cosine_mean",
            "sentences_cosine_min")
    out = {n: {k: statistics.median(r[n][k] for r in rounds) for k in keys if k in rounds[0][n]} for n in names}
    if "plain_openvino" in rounds[0]["kiln"]:
        out["kiln"]["plain_openvino_engine_per_s"] = statistics.median(
            r["kiln"]["plain_openvino"]["engine_per_s"] for r in rounds)
    out["kiln"]["one_session_end_to_end_per_s"] = statistics.median(
        r["kiln"]["one_session_end_to_end_per_s"] for r in rounds)
    # The best peer at kiln's own bar (min cosine >= 0.99 to sentence-transformers on PyTorch), end to end: on the
    # held-out texts (the figure earlier sittings compared), and on those and the plain sentences both.
    fair = [n for n in PEERS if out[n].get("cosine_min", 1.0) >= 0.99]
    best = max(fair, key=lambda n: out[n]["end_to_end_per_s"])
    fair_both = [n for n in fair if out[n].get("sentences_cosine_min", 1.0) >= 0.99]
    best_both = max(fair_both, key=lambda n: out[n]["end_to_end_per_s"])
    out["ratios"] = {"best_peer": best,
                     "end_to_end_vs_best_peer": statistics.median(
                         r["kiln"]["end_to_end_per_s"] / r[best]["end_to_end_per_s"] for r in rounds),
                     "best_peer_on_both_text_sets": best_both,
                     "end_to_end_vs_best_peer_on_both": statistics.median(
                         r["kiln"]["end_to_end_per_s"] / r[best_both]["end_to_end_per_s"] for r in rounds),
                     "one_session_vs_best_peer": statistics.median(
                         r["kiln"]["one_session_end_to_end_per_s"] / r[best]["end_to_end_per_s"] for r in rounds),
                     "engine_vs_peer_int8": statistics.median(
                         r["kiln"]["engine_per_s"] / r["st-openvino-int8"]["engine_per_s"] for r in rounds),
                     "b1_vs_peer_int8": statistics.median(
                         r["kiln"]["b1_128_ms"] / r["st-openvino-int8"]["b1_128_ms"] for r in rounds)}
    return out


def _variants_summary(rounds: list[dict]) -> dict:
    names = rounds[0]["kiln-variants"]["end_to_end_per_s"]
    per_s = {n: statistics.median(r["kiln-variants"]["end_to_end_per_s"][n] for r in rounds) for n in names}
    first = rounds[0]["kiln-variants"]
    fastest = max(per_s, key=per_s.get)
    return {"end_to_end_per_s": per_s, "best": first["best"], "fastest": fastest,
            "best_vs_fastest": per_s[first["best"]] / per_s[fastest],
            "optimize_ms_per_seq": first["optimize_ms_per_seq"]}


def _variants_table(v: dict) -> str:
    rows = ["| variant | kiln optimize ms/seq | end to end texts/s (kiln.load defaults) |", "| --- | --- | --- |"]
    for name, per_s in sorted(v["end_to_end_per_s"].items(), key=lambda kv: -kv[1]):
        mark = " (best/)" if name == v["best"] else ""
        ms = v["optimize_ms_per_seq"].get(name)
        rows.append(f"| {name}{mark} | {ms:.2f} | {per_s:.1f} |" if ms is not None else f"| {name}{mark} | - | "
                    f"{per_s:.1f} |")
    rows.append(f"\nkiln optimize's best ({v['best']}) end to end: {v['best_vs_fastest']:.2f}x the fastest variant "
                f"({v['fastest']})")
    return "\n".join(rows)


def _table(s: dict) -> str:
    rows = ["| configuration | end to end texts/s | engine-only seq/s | batch-1 ms @128 | cosine mean / min | "
            "plain sentences: cosine mean / min |", "| --- | --- | --- | --- | --- | --- |"]
    for name in (*PEERS, "kiln"):
        r = s[name]
        fid = f"{r['cosine_mean']:.4f} / {r['cosine_min']:.4f}" if "cosine_mean" in r else "1 / 1"
        if "sentences_cosine_mean" in r:
            fid += f" | {r['sentences_cosine_mean']:.4f} / {r['sentences_cosine_min']:.4f}"
        else:
            fid += " | 1 / 1"
        engine = f"{r['engine_per_s']:.1f} | {r['b1_128_ms']:.2f}" if "engine_per_s" in r else "| "
        rows.append(f"| {name} | {r['end_to_end_per_s']:.1f} | {engine} | {fid} |")
    q = s["ratios"]
    rows.append(f"\nkiln end to end vs best peer ({q['best_peer']}): {q['end_to_end_vs_best_peer']:.2f}x; "
                f"vs the best at min cosine >= 0.99 on the plain sentences too ({q['best_peer_on_both_text_sets']}): "
                f"{q['end_to_end_vs_best_peer_on_both']:.2f}x; "
                f"engine-only vs the peer's int8 IR: {q['engine_vs_peer_int8']:.2f}x; batch-1 latency vs it: "
                f"{q['b1_vs_peer_int8']:.2f}x; kiln as one session of the same threads, batches of {BATCH}: "
                f"{s['kiln']['one_session_end_to_end_per_s']:.1f} texts/s end to end "
                f"({q['one_session_vs_best_peer']:.2f}x the best peer)")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
