"""Triton (PyPI's tritonserver, kiln's Python-backend ensemble) against `kiln serve`, same artifact, same clients.

Both servers get the same closed-loop load on 127.0.0.1 (64 clients by default, single texts of 10-200 tokens,
raw asyncio HTTP/1.1 keep-alive clients from serve_load.py): Triton's KServe v2 JSON at
/v2/models/NAME/infer, kiln's /kiln/embed. Each server runs alone; the median of --rounds rounds is reported, with
Triton's own statistics (inferences per model-step execution = its mean batch).

    make triton-server && python benchmarks/triton_load.py kiln-out/best [--clients 64] [--requests 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_load import closed_loop, embed_bodies, start, stop  # noqa: E402


def median_phase(port: int, bodies: list[bytes], clients: int, requests: int, rounds: int, path: str) -> dict:
    asyncio.run(closed_loop(port, bodies, clients, min(requests, 128), 60.0, path=path))  # warm-up
    phases = [asyncio.run(closed_loop(port, bodies, clients, requests, 120.0, path=path)).summary()
              for _ in range(rounds)]
    return sorted(phases, key=lambda p: p["throughput_per_s"])[len(phases) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buckets", default=None, help="kiln triton --buckets (default: kiln's choice)")
    parser.add_argument("--skip-kiln", action="store_true", help="measure Triton only")
    parser.add_argument("--triton-venv", default=str(HERE.parent / ".venv-triton"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix
    from kiln.integrations.triton.repository import TritonConfig, write_repository
    from kiln.integrations.triton.server import find_install, start_triton

    install = find_install(args.triton_venv)
    if isinstance(install, str):
        sys.exit(install)
    art = Artifact.open(args.artifact)
    encoder = art.encoder()
    texts = serving_mix(args.texts, encoder.token_count)
    lengths = [len(e.ids) for e in encoder.encode(texts)]
    result: dict = {"artifact": args.artifact, "variant": art.variant_name(), "clients": args.clients,
                    "requests": args.requests, "tokens_median": statistics.median(lengths)}
    with tempfile.TemporaryDirectory(prefix="kiln-triton-load-") as scratch:
        repo = write_repository(TritonConfig(artifact=Path(args.artifact), output=Path(scratch) / "repo",
                                             python_model=True, name="kiln",
                                             buckets=tuple(int(b) for b in args.buckets.split(","))
                                             if args.buckets else None))
        result["buckets"] = json.loads((repo / "kiln_tokenizer" / "1" / "kiln_step.json").read_text())["buckets"]
        running = start_triton(install, repo, Path(scratch) / "tritonserver.log")
        try:
            bodies = [json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [t]}],
                                  "outputs": [{"name": "EMBEDDING"}]}).encode() for t in texts]
            result["triton"] = median_phase(running.http_port, bodies, args.clients, args.requests, args.rounds,
                                            "/v2/models/kiln/infer")
            import tritonclient.http as http

            stats = http.InferenceServerClient(f"127.0.0.1:{running.http_port}").get_inference_statistics(
                "kiln_model")["model_stats"][0]
            result["triton"]["model_step_mean_batch"] = stats["inference_count"] / max(1, stats["execution_count"])
        finally:
            running.stop()
    if not args.skip_kiln:
        proc, port = start([sys.executable, "-m", "kiln", "serve", args.artifact])
        try:
            result["kiln_serve"] = median_phase(port, embed_bodies(texts),
                                                args.clients, args.requests, args.rounds, "/kiln/embed")
        finally:
            stop(proc)
    print("| server | clients | req/s | p50 ms | p90 ms | p99 ms | notes |")
    print("|---|---|---|---|---|---|---|")
    t = result["triton"]
    print(f"| Triton (tritonserver 2.51, Python-backend ensemble) | {args.clients} | {t['throughput_per_s']:.1f} | "
          f"{t['p50_ms']:.1f} | {t['p90_ms']:.1f} | {t['p99_ms']:.1f} | model step mean batch "
          f"{t['model_step_mean_batch']:.2f}; buckets {result['buckets']} |")
    if "kiln_serve" in result:
        k = result["kiln_serve"]
        print(f"| kiln serve | {args.clients} | {k['throughput_per_s']:.1f} | {k['p50_ms']:.1f} | "
              f"{k['p90_ms']:.1f} | {k['p99_ms']:.1f} | |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
