"""kiln's GPU paths on a real CUDA machine, in one short run: the figures a GPU user asks for.

What it does, in order (each step's figures go into the JSON; a failed step is recorded, not hidden):
  1. builds a BERT-base-shaped encoder (12 x 768, random weights from its config; MiniLM's tokenizer and
     mean pooling: nothing downloads) in ``--work``;
  2. ``kiln optimize --target cuda`` on it: every CUDA variant (ONNX fp32/fused/fp16, TorchScript, torch fp16)
     exported, validated and timed on the GPU through ONNX Runtime's CUDA provider with IOBinding;
  3. end to end on 1,024 held-out texts of 10-200 tokens (``kiln.load(..., device="cuda").predict``) for each
     accepted variant, against sentence-transformers on the same GPU in fp32 and fp16 (``model.half()``), two
     rounds each, with each one's min cosine to sentence-transformers fp32;
  4. batch invariance on the GPU: 32 texts alone and in one padded batch, per accepted variant;
  5. IOBinding against plain ``session.run`` (numpy in, numpy out) on the same sorted batches.

    python benchmarks/gpu_check.py --work /tmp/gpu --json gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

ROUNDS = 2
BATCH = 32


SHAPES = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
          "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)}


def build_model(dest: Path, minilm: Path, shape: str) -> Path:
    """BERT-base shape, random weights; MiniLM's (bert-base-uncased's) tokenizer and pooling files beside it."""
    import torch
    import transformers

    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **SHAPES[shape])
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling"):
        src = minilm / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    return dest


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def optimize(model: Path, out: Path) -> dict:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "kiln", "optimize", str(model), "--task", "feature-extraction",
                          "--target", "cuda", "-o", str(out), "--force"], capture_output=True, text=True)
    took = time.perf_counter() - start
    print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
    if run.returncode:
        raise RuntimeError(f"kiln optimize --target cuda exited {run.returncode}: {run.stderr[-400:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"seconds": round(took, 1), "accepted": sorted(manifest["variants"]),
            "summary": (out / "summary.md").read_text()}


def _texts(out: Path) -> list[str]:
    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import held_out_mix

    encoder = Artifact.open(out).encoder()
    return held_out_mix(1024, encoder.token_count)


def _timed(fn, texts: list[str]) -> tuple[float, object]:
    """Texts/s over ROUNDS runs (best), after one warm-up on a slice; and the last run's output."""
    fn(texts[:64])
    best, result = float("inf"), None
    for _ in range(ROUNDS):
        _sync()
        start = time.perf_counter()
        result = fn(texts)
        _sync()
        best = min(best, time.perf_counter() - start)
    return len(texts) / best, result


def _min_cosine(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


def end_to_end(model: Path, out: Path, accepted: list[str], device: str) -> dict:
    from sentence_transformers import SentenceTransformer

    import kiln

    texts = _texts(out)
    st = SentenceTransformer(str(model), device=device)
    rows = {}
    speed, reference = _timed(lambda t: st.encode(t, batch_size=BATCH, convert_to_numpy=True), texts)
    rows["sentence-transformers fp32"] = {"texts_per_s": round(speed, 1), "min_cosine": 1.0}
    st.half()
    speed, half = _timed(lambda t: st.encode(t, batch_size=BATCH, convert_to_numpy=True), texts)
    rows["sentence-transformers fp16"] = {"texts_per_s": round(speed, 1), "min_cosine": _min_cosine(half, reference)}
    for variant in accepted:
        try:
            predictor = kiln.load(out, variant, device=device, batch_size=BATCH)
            speed, got = _timed(predictor.predict, texts)
            rows[f"kiln {variant}"] = {"texts_per_s": round(speed, 1), "min_cosine": _min_cosine(got, reference)}
        except Exception as err:  # one variant's failure is its row, the others still run
            rows[f"kiln {variant}"] = {"error": f"{type(err).__name__}: {err}"}
    return rows


def batch_invariance(out: Path, accepted: list[str], device: str) -> dict:
    """Max |alone - in a padded batch| over 32 texts of mixed length, per variant, on the GPU."""
    import numpy as np

    import kiln

    texts = _texts(out)[:32]
    rows = {}
    for variant in accepted:
        try:
            predictor = kiln.load(out, variant, device=device, batch_size=BATCH)
            batched = np.asarray(predictor.predict(texts))
            alone = np.asarray([predictor.predict([t])[0] for t in texts])
            rows[variant] = {"max_abs": float(np.abs(batched - alone).max()),
                             "min_cosine": _min_cosine(batched, alone)}
        except Exception as err:
            rows[variant] = {"error": f"{type(err).__name__}: {err}"}
    return rows


def iobinding(out: Path, accepted: list[str], device: str) -> dict:
    """Engine-only seconds over the sorted batches: kiln's IOBinding path against plain session.run."""
    from kiln.artifact.directory import Artifact
    from kiln.engines.base import EngineOptions

    art = Artifact.open(out)
    encoder = art.encoder()
    encodings = encoder.encode(_texts(out))
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    batches = [encoder.collate([encodings[i] for i in order[b:b + BATCH]]) for b in range(0, len(order), BATCH)]
    rows = {}
    if device == "cpu":
        return {"skipped": "IOBinding binds CUDA memory; --device cpu has none"}
    for variant in [v for v in accepted if v.startswith("onnx")]:
        engine = art.engine(variant, options=EngineOptions.for_variant(art.variant(variant), None, device))
        modes = {"iobinding": True, "session.run": False}
        for bound in modes.values():  # every batch shape once per path first: first-shape costs stay out
            engine._on_gpu = bound  # the one switch between the two paths (kiln's engine reads it per run)
            for batch in batches:
                engine.run(batch)
        timings = {mode: float("inf") for mode in modes}
        for _ in range(ROUNDS):  # alternated, best of ROUNDS each
            for mode, bound in modes.items():
                engine._on_gpu = bound
                start = time.perf_counter()
                for batch in batches:
                    engine.run(batch)
                timings[mode] = min(timings[mode], round(time.perf_counter() - start, 4))
        rows[variant] = timings
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kiln-gpu"))
    parser.add_argument("--json", type=Path, default=OUT / "gpu_check.json")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base", help="tiny: a dry run of the script")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script where no GPU is")
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="a directory with MiniLM's tokenizer and pooling files (default: the bundled model)")
    args = parser.parse_args()
    if args.tokenizer_from is None:
        from kiln.source.loading import bundled_model_dir

        args.tokenizer_from = bundled_model_dir()
    import onnxruntime
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    report: dict = {"gpu": gpu, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                    "providers": onnxruntime.get_available_providers()}
    args.work.mkdir(parents=True, exist_ok=True)
    model, out = args.work / "bert-base-random", args.work / "opt"
    steps = [("model", lambda: str(build_model(model, args.tokenizer_from, args.shape))),
             ("optimize", lambda: optimize(model, out)),
             ("end_to_end", lambda: end_to_end(model, out, report["optimize"]["accepted"], args.device)),
             ("batch_invariance", lambda: batch_invariance(out, report["optimize"]["accepted"], args.device)),
             ("iobinding", lambda: iobinding(out, report["optimize"]["accepted"], args.device))]
    for name, step in steps:
        try:
            report[name] = step()
        except Exception:  # the steps after still run where they can; the failure is in the record
            report[name] = {"error": traceback.format_exc()[-2000:]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"== {name}\n{json.dumps(report[name], indent=1)[:3000]}", flush=True)


if __name__ == "__main__":
    main()
