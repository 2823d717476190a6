"""What live agreement costs a loaded server, and whether its figure matches offline agreement.

    python benchmarks/shadow_cost.py kiln-out/best [--rate 0.05] [--clients 64] [--requests 1024] [--rounds 3]

`kiln serve` on the artifact, plain and with ``--shadow-rate RATE``, one server at a time (a shadow works while
its own server idles, which would be while the other one is measured if both ran), alternating round by round
(plain, shadowed, plain, ...), each loaded by the closed-loop client of benchmarks/serve_load.py after a warm-up;
the median of ``rounds`` is compared. Afterwards the shadowed server's /metrics live agreement (min and mean cosine over
what it shadowed) is read next to the same figure computed offline: each of the texts run through the served
variant and through the artifact's fp32 reference, compared one by one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import closed_loop, embed_bodies, measure, start, stop  # noqa: E402


def scrape(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("kiln_shadow_agreement{", "kiln_shadow_items_total{", "kiln_shadow_cpu_share{")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def offline_agreement(artifact: str, texts: list[str]) -> tuple[float, float]:
    from kiln.artifact.directory import Artifact
    from kiln.artifact.plan import ServingPlan
    from kiln.engines import EngineOptions
    from kiln.scoring import cosine

    art = Artifact.open(artifact)
    served = art.predictor()
    reference = art.predictor_of(art.reference_variant(), ServingPlan(EngineOptions(), 1, 32))
    values = [cosine(a, b) for a, b in zip(served.predict(texts), reference.predict(texts))]
    return min(values), float(np.mean(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix

    encoder = Artifact.open(args.artifact).encoder()
    texts = serving_mix(512, encoder.token_count)
    bodies = embed_bodies(texts)
    base = [sys.executable, "-m", "kiln", "serve", args.artifact]
    commands = {"plain": base, "shadowed": [*base, "--shadow-rate", str(args.rate)]}
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    codes: dict[str, list[int]] = {name: [] for name in commands}
    live: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, command in commands.items():
            proc, port = start(command)
            try:
                asyncio.run(closed_loop(port, bodies, args.clients, 2 * args.clients, args.max_seconds))  # warm-up
                runs[name].append(measure(port, bodies, args.clients, args.requests, args.max_seconds))
                if name == "shadowed":
                    live = scrape(port)  # the last round's server: what it shadowed of its load
            finally:
                codes[name].append(stop(proc))
    shadowed_texts = texts  # every text was sent (cycled); the shadow sampled some of them
    low, mean = offline_agreement(args.artifact, shadowed_texts)
    median = {n: statistics.median(r["throughput_per_s"] for r in rs) for n, rs in runs.items()}
    p99 = {n: statistics.median(r["p99_ms"] for r in rs) for n, rs in runs.items()}
    result = {"artifact": args.artifact, "rate": args.rate, "clients": args.clients, "requests": args.requests,
              "rounds": {n: [r["throughput_per_s"] for r in rs] for n, rs in runs.items()},
              "median_throughput_per_s": median, "median_p99_ms": p99,
              "ratio": median["shadowed"] / median["plain"], "live": live,
              "offline_min_cosine": low, "offline_mean_cosine": mean, "exit_codes": codes}
    print(f"{args.clients} clients, {args.requests} requests x {args.rounds} rounds each, alternating:")
    for name in commands:
        print(f"  {name:<9} {median[name]:7.1f} req/s (rounds {[round(x, 1) for x in result['rounds'][name]]}), "
              f"p99 {p99[name]:.0f} ms")
    print(f"  shadowed / plain = {result['ratio']:.3f}")
    print(f"  live agreement: {live}")
    print(f"  offline on the same {len(texts)} texts: min cosine {low:.6f}, mean {mean:.6f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
