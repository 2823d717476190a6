"""How OpenVINO carries a decoder's KV cache between steps: numpy out and back in each step (ArraySteps) against
the request's output memory shared as the next step's inputs (SharedSteps, what kiln uses), timed with kiln bench's
own generation cell (time to first token, per-token latency for 32 new tokens, median of 2 greedy runs).

GPT-2 small's shape with random weights (see decoder_latency.py), exported by ``kiln export``; OpenVINO reads the
ONNX step graph, fp32.

    python benchmarks/openvino_steps.py  ->  benchmarks/openvino_steps.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CELLS = ((1, 4), (1, 128), (4, 128), (4, 512))


def main() -> None:
    import numpy as np
    import transformers
    from benchmarks.decoder_latency import build_model

    from kiln.bench.generation import generation_cell
    from kiln.decoder.graph import CacheShape
    from kiln.decoder.steps import ArraySteps, SharedSteps
    from kiln.engines.openvino import OpenVinoEngine
    from kiln.system.cpu import cpu_info

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_model(Path(scratch) / "gpt2-small-random")
        art = Path(scratch) / "art"
        subprocess.run([sys.executable, "-m", "kiln", "export", str(model_dir), "--task", "text-generation",
                        "--format", "onnx", "-o", str(art)], check=True)
        shape = CacheShape.of(transformers.AutoConfig.from_pretrained(model_dir))
        engine = OpenVinoEngine(art / "onnx-fp32" / "model.onnx")
        rng = np.random.default_rng(0)
        for batch, length in CELLS:
            prompts = rng.integers(10, 50_000, size=(batch, length))
            row: dict = {"batch_size": batch, "prompt_tokens": length}
            for name, kind in (("numpy", ArraySteps), ("shared", SharedSteps)):
                cell = generation_cell(kind(engine, shape), 0, prompts, new_tokens=32, runs=2, decode=lambda ids: "")
                row[name] = {"ttft_ms": round(cell.ttft_ms, 1), "per_token_ms": round(cell.per_token_ms, 1)}
            row["per_token_speedup"] = round(row["numpy"]["per_token_ms"] / row["shared"]["per_token_ms"], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = Path(__file__).resolve().parent / "openvino_steps.json"
    out.write_text(json.dumps({"command": "python benchmarks/openvino_steps.py", "cpu": cpu_info().to_dict(),
                               "rows": rows}, indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
