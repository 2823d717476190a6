"""Decoder latency like the published ONNX Runtime GPT-2 study, with kiln's own commands: ``kiln optimize`` builds and
gates the variants, ``kiln bench`` times each one (time to first token and per-token latency for 32 new tokens, batch
1 and 4, prompt lengths 4 to 512, fp32 against int8, beside the PyTorch step graph) and writes the report; then kiln
serve's continuous-batching throughput at 1, 8 and 32 concurrent streams.

The model is GPT-2 small's shape (12 layers, 768 wide, 12 heads, 1,024 positions, 50,257-token vocabulary) with
random weights: no GPT-2 checkpoint can be downloaded here, and latency does not depend on the weights' values
(agreement figures on random weights say little; they are recorded, not quoted as fidelity).

    python benchmarks/decoder_latency.py [--lengths 4,16,64,128,256,512] [--batches 1,4] [--streams 1,8,32]

-> benchmarks/decoder_bench/ (kiln bench's results.json, report.html, report.md; kiln optimize's summary.md) and
benchmarks/decoder_latency.json (the serving rows and where the rest is).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

NEW_TOKENS = 32
KILN = [sys.executable, "-m", "kiln"]


def build_model(directory: Path) -> Path:
    import torch
    import transformers

    from kiln.testing.factory import GPT_BPE, train_tokenizer

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=1024)  # GPT-2 small
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tok = train_tokenizer(GPT_BPE)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                         unk_token="<|endoftext|>", model_max_length=1024).save_pretrained(directory)
    return directory


def serve_throughput(artifact: Path, concurrency: list[int], prompt: str) -> list[dict[str, float]]:
    import httpx

    from kiln.serving import process
    from kiln.serving.app import ServeConfig, create_app

    app = create_app(ServeConfig(models={"gpt2": artifact}, max_concurrent=1024))
    rows = []
    with process.serve_in_thread(app) as base:
        for streams in concurrency:
            loop = app.state.models["gpt2"].scheduler
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


def kiln(*args: object) -> None:
    command = [*KILN, *map(str, args)]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4,16,64,128,256,512")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--streams", default="1,8,32")
    here = Path(__file__).resolve().parent
    parser.add_argument("--report", type=Path, default=OUT / "decoder_bench")
    parser.add_argument("--json", "--output", dest="output", type=Path, default=OUT / "decoder_latency.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model_dir = build_model(work / "gpt2-small-random")
        opt = work / "opt"
        # openvino-fp32 is left out: the published comparison is fp32 against int8, and each variant's validation
        # on GPT-2 small takes minutes here.
        kiln("optimize", model_dir, "--task", "text-generation", "-o", opt, "--variants",
             "onnx-fp32,onnx-int8-dynamic,openvino-int8-weights")
        kiln("bench", opt, "-o", args.report, "--batch-sizes", args.batches, "--seq-lens", args.lengths)
        shutil.copy(opt / "summary.md", args.report / "optimize-summary.md")
        from kiln.artifact.directory import Artifact

        best = Artifact.open(opt).variant_name()
        prompt = "Return the number of items in a container, and the size of each of them in bytes"
        throughput = serve_throughput(opt, [int(s) for s in args.streams.split(",")], prompt)
    result = {"command": "python " + " ".join(sys.argv), "model": "GPT-2 small shape, random weights (124M)",
              "bench": str(args.report.relative_to(here.parent) / "results.json"),
              "serve": {"variant": best, "max_new_tokens": NEW_TOKENS, "rows": throughput}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {args.output}, {args.report / 'report.html'}")


if __name__ == "__main__":
    main()
