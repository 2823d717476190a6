"""Decoder latency like the published ONNX Runtime GPT-2 study: time to first token and per-token latency for 32
new tokens, batch 1 and 4, prompt lengths 4 to 512, fp32 against int8; then kiln serve's continuous-batching
throughput at 1, 8 and 32 concurrent streams.

The model is GPT-2 small's shape (12 layers, 768 wide, 12 heads, 1,024 positions, 50,257-token vocabulary) with
random weights: no GPT-2 checkpoint can be downloaded here, and latency does not depend on the weights' values
(agreement figures on random weights say little; they are recorded, not quoted as fidelity). Variants are built
with kiln's own passes (export with the KV cache, ONNX Runtime dynamic int8 per channel, NNCF int8 weight
compression) and timed through kiln's decoding loop (IOBinding on ONNX Runtime). Greedy decoding,
``max_new_tokens`` 32, EOS ignored (random weights). Results -> benchmarks/decoder_latency.json.

    python benchmarks/decoder_latency.py [--lengths 4,16,64,128,256,512] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NEW_TOKENS = 32


def build_model(directory: Path) -> Path:
    import torch
    import transformers
    from tests.factory import GPT_BPE, train_tokenizer

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=1024)  # GPT-2 small
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tok = train_tokenizer(GPT_BPE)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                         unk_token="<|endoftext|>", model_max_length=1024).save_pretrained(directory)
    return directory


def build_variants(model_dir: Path, out: Path) -> dict[str, tuple[str, Path]]:
    from kiln.choices import ExportFormat
    from kiln.export.job import ExportConfig, run_export
    from kiln.optimize import onnx_passes, openvino_passes
    from kiln.system.cpu import cpu_info, int8_scheme

    artifact = out / "artifact"
    run_export(ExportConfig(model=str(model_dir), task="text-generation", format=ExportFormat.ONNX, output=artifact))
    fp32 = artifact / "onnx-fp32" / "model.onnx"
    int8 = out / "int8" / "model.onnx"
    int8.parent.mkdir()
    onnx_passes.quantize_dynamic_int8(fp32, int8, int8_scheme(cpu_info()), per_channel=True)
    ir, weights = out / "ov" / "model.xml", out / "ov-int8" / "model.xml"
    ir.parent.mkdir(), weights.parent.mkdir()
    openvino_passes.convert(fp32, ir)
    openvino_passes.compress_weights_int8(ir, weights)
    return {"onnx-fp32": ("onnxruntime", fp32), "onnx-int8-dynamic": ("onnxruntime", int8),
            "openvino-int8-weights": ("openvino", weights)}, artifact


def time_generation(steps, batch: int, length: int, repeats: int) -> dict[str, float]:
    """Median over ``repeats`` of: prefill + first token (TTFT), then the mean of 31 single-token steps."""
    from kiln.decoder.batch import DecodeBatch, new_sequence
    from kiln.decoder.sampling import Sampling
    from kiln.decoder.stopping import Stops

    rng = np.random.default_rng(length)
    ttft, per_token = [], []
    for _ in range(repeats):
        batcher = DecodeBatch(steps, pad_id=50256)
        prompts = [rng.integers(0, 50000, length).tolist() for _ in range(batch)]
        sequences = [new_sequence(p, Sampling(), Stops(NEW_TOKENS, frozenset(), ()), lambda ids: "")
                     for p in prompts]
        start = time.perf_counter()
        batcher.add(sequences)
        first = time.perf_counter()
        for _ in range(NEW_TOKENS - 1):
            batcher.step()
        end = time.perf_counter()
        ttft.append(1000 * (first - start))
        per_token.append(1000 * (end - first) / (NEW_TOKENS - 1))
    return {"ttft_ms": statistics.median(ttft), "per_token_ms": statistics.median(per_token)}


def agreement(variants, artifact: Path) -> dict[str, dict[str, float]]:
    """Teacher-forced next-token agreement and logit cosine against PyTorch on 16 held-out texts (random weights:
    recorded for completeness, not as a fidelity claim)."""
    from kiln.artifact.directory import Artifact
    from kiln.engines import EngineOptions, create_engine
    from kiln.model.reference import reference_predictor
    from kiln.model.source import load_source
    from kiln.runtime.predictor import Predictor
    from kiln.tasks import task_spec
    from kiln.validation.agreement import agreement_inputs, measure_agreement

    source = load_source(Artifact.open(artifact).manifest.source["path"], "text-generation")
    reference = reference_predictor(source, batch_size=8)
    data = agreement_inputs(reference, task_spec("text-generation").agreement_inputs(reference.encoder, 16))
    out = {}
    for name, (engine, path) in variants.items():
        predictor = Predictor(source.task_config, reference.encoder, create_engine(engine, path, EngineOptions()),
                              batch_size=8)
        figures = measure_agreement(data, predictor).figures
        out[name] = {k: round(float(v), 4) for k, v in figures.items()}
    return out


def serve_throughput(artifact: Path, concurrency: list[int], prompt: str) -> list[dict[str, float]]:
    import httpx

    from kiln.serve import process
    from kiln.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(models={"gpt2": artifact}, max_concurrent=1024))
    rows = []
    with process.serve_in_thread(app) as base:
        for streams in concurrency:
            loop = app.state.models["gpt2"].batcher
            loop.widest = 0
            tokens = [0] * streams

            def client(k: int, tokens: list[int] = tokens) -> None:
                for _ in range(2):
                    body = {"inputs": prompt, "max_new_tokens": NEW_TOKENS, "temperature": 1.0, "seed": k}
                    r = httpx.post(f"{base}/generate", json=body, timeout=600).json()
                    tokens[k] += r["usage"]["completion_tokens"]

            threads = [threading.Thread(target=client, args=(k,)) for k in range(streams)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            rows.append({"streams": streams, "requests": 2 * streams, "tokens": sum(tokens), "seconds": round(wall, 2),
                         "tokens_per_s": round(sum(tokens) / wall, 1), "widest_step": loop.widest})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4,16,64,128,256,512")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("decoder_latency.json"))
    args = parser.parse_args()

    from kiln.decoder.steps import stepper
    from kiln.engines import EngineOptions, create_engine
    from kiln.system.cpu import cpu_info
    from kiln.tasks.text_generation import cache_shape

    cpu = cpu_info()
    kernels = ("VNNI (u8s8 dot products)" if cpu.has_vnni else "AVX2 (no VNNI: int8 via vpmaddubsw)"
               if "avx2" in cpu.features else "no x86 int8 dot products")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model_dir = build_model(work / "gpt2-small-random")
        variants, artifact = build_variants(model_dir, work)
        from kiln.artifact.directory import Artifact

        shape = cache_shape(Artifact.open(artifact).task_config)
        grid = []
        for name, (engine_name, path) in variants.items():
            steps = stepper(create_engine(engine_name, path, EngineOptions()), shape)
            time_generation(steps, 1, 8, 1)  # warm-up
            for batch in map(int, args.batches.split(",")):
                for length in map(int, args.lengths.split(",")):
                    row = {"variant": name, "batch": batch, "prompt_tokens": length,
                           **{k: round(v, 2) for k, v in time_generation(steps, batch, length, args.repeats).items()}}
                    grid.append(row)
                    print(row, flush=True)
        sizes = {name: sum(f.stat().st_size for f in path.parent.iterdir()) for name, (_, path) in variants.items()}
        fidelity = agreement(variants, artifact)
        print(fidelity, flush=True)
        prompt = "Return the number of items in a container, and the size of each of them in bytes"
        throughput = serve_throughput(artifact, [int(s) for s in args.streams.split(",")], prompt)
    result = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
              "cpu": cpu.to_dict(), "int8_kernels": kernels, "new_tokens": NEW_TOKENS,
              "model": "GPT-2 small shape, random weights (124M parameters)", "sizes_bytes": sizes,
              "latency": grid, "agreement_random_weights": fidelity,
              "serve": {"variant": "onnx-fp32 (kiln export)", "max_new_tokens": NEW_TOKENS, "rows": throughput}}
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
