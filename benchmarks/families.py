"""The embedding families of issue 61 at their real sizes, random weights: what kiln's export costs, what kiln
optimize keeps, and kiln's speed against sentence-transformers on PyTorch on the same directory and texts.

Each family is built from its transformers config with the real model's sizes (hidden size, layers, heads,
vocabulary, sliding window, sentence-transformers pooling and Dense projections) and random weights, with the
family's small test tokenizer (kiln.testing.factory): the token counts differ from the real tokenizer's, the compute
per token does not. Random weights make the int8 verdicts meaningless as fidelity figures (an untrained network's
activations have none of a trained one's outliers); the speeds and the export's cost are real.

Per family, each step in its own process: ``kiln export`` (wall time and peak RSS from /usr/bin/time), ``kiln
optimize --variants ...`` (its table: agreement, ms/seq, verdicts), then end to end on the same held-out texts of
10-200 tokens (texts in, vectors out, each library's own tokenization and batching, best of 2 passes after a
warm-up): ``SentenceTransformer(dir).encode`` and ``kiln.load(best).encode``, with the cosine between them.

    python benchmarks/families.py [--families embeddinggemma-300m,qwen3-embedding-0.6b] [--texts 256] [--threads 2]
        [--variants onnx-fp32,openvino-fp32,openvino-int8-static | --variants ""] [--st-backends] [--work DIR]
        [--json out.json]

``--st-backends`` also times sentence-transformers' own ``backend="openvino"`` (optimum-intel's export, OpenVINO's
default precision) and ``backend="onnx"`` (optimum-onnx's export) on the same directory, each in the peers' venv
benchmarks/peers.py makes (created on first use); a backend that cannot export the family is reported with its error.

kiln optimize's gate dominates at these sizes: on a 2-core Xeon each variant's judging took ~7 minutes for
nomic-embed's 137M parameters; ``--variants ""`` times kiln export's onnx-fp32 alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

HERE = Path(__file__).resolve().parent

# The real models' sizes (their config.json and sentence-transformers files), as kiln's test families build them.
FAMILIES = {
    "nomic-embed-text-v1.5": ("nomic_bert", dict(vocab_size=30528, hidden_size=768, num_hidden_layers=12,
                                                 num_attention_heads=12, head_dim=64, intermediate_size=3072,
                                                 max_position_embeddings=2048), dict(pooling="mean")),
    "arctic-embed-m-v2.0": ("gte", dict(vocab_size=250048, hidden_size=768, num_hidden_layers=12,
                                        num_attention_heads=12, intermediate_size=3072,
                                        max_position_embeddings=8192), dict(pooling="cls")),
    "embeddinggemma-300m": ("gemma3_text", dict(vocab_size=262144, hidden_size=768, num_hidden_layers=24,
                                                num_attention_heads=3, num_key_value_heads=1, head_dim=256,
                                                intermediate_size=1152, max_position_embeddings=2048,
                                                sliding_window=257, query_pre_attn_scalar=256,
                                                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 4),
                            dict(pooling="mean", dense=(3072, 768))),
    "qwen3-embedding-0.6b": ("qwen3", dict(vocab_size=151669, hidden_size=1024, num_hidden_layers=28,
                                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                           intermediate_size=3072, max_position_embeddings=2048,
                                           tie_word_embeddings=True), dict(pooling="lasttoken")),
    # one model, three outputs (kiln's hybrid-embedding): timed end to end on its dense vectors, which are what
    # sentence-transformers computes from the same directory; kiln's graph computes all three in that time
    "bge-m3": ("xlm-roberta", dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                   intermediate_size=4096, max_position_embeddings=8194), dict(pooling="cls")),
}
TASKS = {"bge-m3": "hybrid-embedding"}  # the rest: feature-extraction
DEFAULT_VARIANTS = "onnx-fp32,openvino-fp32,openvino-int8-static"
# sentence-transformers' own backends: side -> (backend, the peers' venv it runs in), as benchmarks/peers.py makes
# them (ST 6 with optimum-intel; ST 5 with optimum-onnx, which needs transformers < 4.58)
ST_BACKENDS = {"st-openvino": ("openvino", ".peers-venv"), "st-onnx": ("onnx", ".st-onnx-venv")}


def build(name: str, directory: Path) -> int:
    """The family at its real size with random weights; returns its parameter count."""
    from kiln.tasks import TaskName
    from kiln.testing.factory import build_tiny_bge_m3, build_tiny_model, write_sentence_transformers_files

    arch, shape, st = FAMILIES[name]
    if TASKS.get(name) == "hybrid-embedding":  # its sentence-transformers files too: CLS pooling, Normalize
        build_tiny_bge_m3(directory, arch, shape=shape)
    else:
        build_tiny_model(arch, TaskName.FEATURE_EXTRACTION, directory, shape=shape)
        write_sentence_transformers_files(directory, **st)
    return sum(f.stat().st_size for f in directory.glob("*.safetensors")) // 4  # fp32 weights


def timed(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (GiB) of ``command`` in its own process, and its output's tail."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as stats:
        run = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", stats.name, *command], capture_output=True,
                             text=True)
        if run.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({run.returncode}):\n{run.stderr[-3000:]}")
        seconds, kib = Path(stats.name).read_text().split()[-2:]
    return float(seconds), int(kib) / 1024**2, run.stdout[-4000:]


def stage_encode(side: str, target: str, texts_file: Path, out: Path, threads: int) -> None:
    """One side's end-to-end pass (run in its own process): vectors to ``out``, texts/s printed as JSON."""
    import numpy as np

    texts = json.loads(texts_file.read_text())
    if side == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(target, device="cpu")
        encode = lambda: model.encode(texts, batch_size=32)  # noqa: E731
    elif side in ST_BACKENDS:  # in the peers' venv: sentence-transformers and optimum, no kiln
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        if side == "st-openvino":
            kwargs = {"ov_config": {"INFERENCE_NUM_THREADS": threads}}
        else:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
        model = SentenceTransformer(target, device="cpu", backend=ST_BACKENDS[side][0], model_kwargs=kwargs)
        encode = lambda: model.encode(texts, batch_size=32)  # noqa: E731
    else:
        import kiln

        model = kiln.load(target, threads=threads)
        encode = lambda: model.encode(texts)  # noqa: E731
    encode()  # warm-up: first-call allocations, OpenVINO's shape compilation
    best, vectors = float("inf"), None
    for _ in range(2):
        begin = time.perf_counter()
        vectors = encode()
        best = min(best, time.perf_counter() - begin)
    np.save(out, np.asarray(vectors, dtype=np.float32))
    print(json.dumps({"texts_per_s": len(texts) / best}))


def _encode(side: str, target: Path, texts_file: Path, out: Path, threads: int, python: str = sys.executable) -> float:
    run = subprocess.run([python, __file__, "--stage", side, str(target), str(texts_file), str(out),
                          "--threads", str(threads)], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{side} failed:\n{run.stderr[-3000:]}")
    return float(json.loads(run.stdout.strip().splitlines()[-1])["texts_per_s"])


def st_backends(model: Path, work: Path, texts_file: Path, threads: int, reference: np.ndarray) -> dict:
    """sentence-transformers' ONNX and OpenVINO backends on a copy of the model directory (their exports write beside
    it): texts/s and cosine to sentence-transformers on PyTorch, or the error a backend stopped with."""
    import shutil

    import numpy as np

    from peers import PEER_PACKAGES, ST_ONNX_PACKAGES, _ensure_venv  # benchmarks/ is this script's directory

    found = {}
    packages = {"st-openvino": PEER_PACKAGES, "st-onnx": ST_ONNX_PACKAGES}
    for side, (_, venv) in ST_BACKENDS.items():
        python = _ensure_venv(HERE / venv, packages[side])
        copy = work / side
        shutil.copytree(model, copy, dirs_exist_ok=True)
        try:
            per_s = _encode(side, copy, texts_file, work / f"{side}.npy", threads, str(python))
        except SystemExit as err:
            found[side] = {"error": str(err).strip().splitlines()[-1][:300]}
            continue
        got = np.load(work / f"{side}.npy").astype(np.float64)
        cosine = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
        found[side] = {"texts_per_s": round(per_s, 2), "cosine_min": round(float(cosine.min()), 5)}
        shutil.rmtree(copy, ignore_errors=True)
    return found


def measure(name: str, work: Path, count: int, threads: int, variants: str, backends: bool = False) -> dict:
    import numpy as np

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import held_out_mix

    model = work / "model"
    parameters = build(name, model)
    kiln_cli = [sys.executable, "-m", "kiln"]
    task = TASKS.get(name, "feature-extraction")
    export_s, export_gib, _ = timed([*kiln_cli, "export", str(model), "--task", task, "-o",
                                     str(work / "export"), "--force"])
    encoder = Artifact.open(work / "export").encoder()
    texts = held_out_mix(count, encoder.token_count)
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    if variants:
        optimize_s, optimize_gib, _ = timed([*kiln_cli, "optimize", str(model), "--task", task,
                                             "--variants", variants, "--threads", str(threads), "-o",
                                             str(work / "optimized"), "--force"])
        report, chosen = json.loads((work / "optimized" / "results.json").read_text()), work / "optimized" / "best"
    else:  # the export's onnx-fp32, unjudged: what kiln export alone gives
        optimize_s = optimize_gib = 0.0
        report, chosen = {"best": "onnx-fp32 (kiln export)", "outcomes": []}, work / "export"
    st = _encode("sentence-transformers", model, texts_file, work / "st.npy", threads)
    ours = _encode("kiln", chosen, texts_file, work / "kiln.npy", threads)
    a, b = np.load(work / "st.npy").astype(np.float64), np.load(work / "kiln.npy").astype(np.float64)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    extra = {"st_backends": st_backends(model, work, texts_file, threads, a)} if backends else {}
    return {**extra, "family": name, "parameters_m": round(parameters / 1e6, 1), "export_s": round(export_s, 1),
            "export_peak_gib": round(export_gib, 2), "optimize_s": round(optimize_s, 1),
            "optimize_peak_gib": round(optimize_gib, 2), "best": report.get("best"),
            "variants": _verdicts(report), "st_torch_texts_per_s": round(st, 2),
            "kiln_texts_per_s": round(ours, 2), "speedup": round(ours / st, 2),
            "cosine_mean": round(float(cosine.mean()), 5), "cosine_min": round(float(cosine.min()), 5),
            "tokens": [min(map(encoder.token_count, texts)), max(map(encoder.token_count, texts))]}


def _verdicts(report: dict) -> dict:
    """Each variant's gate status, agreement and ms/seq from kiln optimize's results.json."""
    return {o["name"]: {"status": o["status"], "agreement": round(o["agreement"]["value"], 4) if o.get("agreement")
                        else None, "ms_per_seq": round(o["timing"]["ms_per_sequence"], 2) if o.get("timing") else None}
            for o in report["outcomes"]}


def table(rows: list[dict]) -> str:
    lines = ["| family (random weights) | params M | export s / peak GiB | optimize s | kiln best | "
             "ST PyTorch texts/s | kiln texts/s | kiln / ST | cosine to ST mean / min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['parameters_m']} | {r['export_s']} / {r['export_peak_gib']} | "
                     f"{r['optimize_s']} | {r['best']} | {r['st_torch_texts_per_s']} | {r['kiln_texts_per_s']} | "
                     f"{r['speedup']}x | {r['cosine_mean']:.4f} / {r['cosine_min']:.4f} |")
    backends = [r for r in rows if r.get("st_backends")]
    if backends:
        lines += ["", "| family | sentence-transformers backend | texts/s | cosine to ST PyTorch min | kiln / it |",
                  "| --- | --- | --- | --- | --- |"]
        for r in backends:
            for side, got in r["st_backends"].items():
                if "error" in got:
                    lines.append(f"| {r['family']} | {side} | - | - | cannot export: {got['error']} |")
                else:
                    lines.append(f"| {r['family']} | {side} | {got['texts_per_s']} | {got['cosine_min']:.4f} | "
                                 f"{r['kiln_texts_per_s'] / got['texts_per_s']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="kiln optimize's --variants; empty: no optimize, kiln export's onnx-fp32 is timed")
    parser.add_argument("--st-backends", action="store_true",
                        help="also time sentence-transformers' ONNX and OpenVINO backends on the same directory")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.stage:
        target, texts_file, out = rest
        stage_encode(args.stage, target, Path(texts_file), Path(out), args.threads)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise SystemExit(f"--families: unknown {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-families-") as scratch:
        root = args.work or Path(scratch)
        for name in names:
            work = root / name.split(" ")[0]
            work.mkdir(parents=True, exist_ok=True)
            rows.append(measure(name, work, args.texts, args.threads, args.variants, args.st_backends))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
