"""Soak test for `kiln serve`: a long, mixed, shape-changing workload, and whether the server's memory stays flat.

One real server process (``kiln serve ARTIFACT``) and ``--clients`` closed-loop clients for ``--minutes``:
  * an embedding artifact: POST /embed and the OpenAI /v1/embeddings, batches of 1-32 texts of 1-400 words
    (log-uniform, so short and long shapes both recur), Matryoshka sizes where the model has them;
  * a text-generation artifact: POST /v1/completions of 1-200-word prompts for 1-48 tokens, streamed and not,
    greedy and sampled;
  * both: a few malformed requests (each must get its 4xx) and clients that hang up mid-request or mid-stream.
Every ``--sample-s`` seconds it records the server's resident memory (its children included), open file
descriptors, threads, Prometheus series (lines of /metrics) and the latency percentiles of the requests answered
since the last sample. After ``--warmup-minutes`` it fits a line to resident memory against time and against
requests served: MiB per hour and per 10,000 requests. It exits 1 when that slope exceeds ``--bound-mib-per-hour``,
or when a request was lost (a 5xx, or a connection the server dropped).

    python benchmarks/soak.py ARTIFACT [--minutes 60] [--clients 4] [--json soak.json] [--html soak.html]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path

import httpx
import numpy as np
import psutil

from kiln.artifact.directory import Artifact
from kiln.data import corpus
from kiln.report.html import page
from kiln.report.svg import line_chart
from kiln.serving.process import ServerStartError, start_server

EMBEDDING_TASKS = ("feature-extraction",)
GENERATION_TASKS = ("text-generation",)
BAD_SHARE, DROP_SHARE = 0.02, 0.02  # of requests: malformed ones, and ones the client abandons part-way


@dataclass
class Counts:
    """What the clients saw, cumulative, and the latencies answered since the sampler last took them."""

    statuses: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    served: int = 0  # answered 200

    def add(self, outcome: str, seconds: float | None = None) -> None:
        self.statuses[outcome] = self.statuses.get(outcome, 0) + 1
        if seconds is not None:
            self.served += 1
            self.latencies.append(seconds)


@dataclass(frozen=True)
class Sample:
    minutes: float
    served: int
    rss_mib: float
    fds: int
    threads: int
    series: int
    p50_ms: float | None
    p99_ms: float | None


class Texts:
    """Texts of a chosen word count, cut from Python's held-out documentation (no download)."""

    def __init__(self, rng: random.Random) -> None:
        self.words = [w for s in corpus.sentences("held-out") for w in s.split()]
        self.rng = rng

    def one(self, longest: int) -> str:
        count = max(1, int(math.exp(self.rng.uniform(0, math.log(longest)))))
        start = self.rng.randrange(0, len(self.words) - count)
        return " ".join(self.words[start : start + count])


# -- the workloads: one request each, returning the outcome's name ----------------------------------------------
async def embed_request(http: httpx.AsyncClient, texts: Texts, rng: random.Random, dims: list[int], window: int
                        ) -> str:
    batch = [texts.one(400) for _ in range(rng.choice((1, 1, 1, 2, 4, 8, 16, 32)))]
    if rng.random() < 0.5:
        body: dict = {"inputs": batch, "truncate": True}  # TEI refuses an input over the window without it
        if dims and rng.random() < 0.3:
            body["dimensions"] = rng.choice(dims)
        response = await http.post("/embed", json=body)
    else:
        response = await http.post("/v1/embeddings", json={"input": batch, "model": "soak"})
    return str(response.status_code)


async def generate_request(http: httpx.AsyncClient, texts: Texts, rng: random.Random, dims: list[int], window: int
                           ) -> str:
    # prompt and continuation within the model's window (up to 2 tokens a word), else the server answers 422
    prompt = texts.one(max(1, min(200, (window - 48) // 2)))
    body = {"model": "soak", "prompt": prompt, "max_tokens": rng.randint(1, 48), "temperature": rng.choice((0.0, 0.8)),
            "stream": rng.random() < 0.5}
    if not body["stream"]:
        return str((await http.post("/v1/completions", json=body)).status_code)
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return str(response.status_code)
        async for line in response.aiter_lines():
            if line.strip() == "data: [DONE]":
                return str(response.status_code)
    return "stream ended without [DONE]"


BAD_BODIES = {
    "embed": [("/embed", {"inputs": []}), ("/embed", {"inputs": 5}), ("/v1/embeddings", {"model": "soak"}),
              ("/embed", {"inputs": "x", "dimensions": 0})],
    "generate": [("/v1/completions", {"model": "soak", "prompt": ""}),
                 ("/v1/completions", {"model": "soak", "prompt": "x", "max_tokens": 0}),
                 ("/v1/completions", {"model": "soak", "prompt": "x", "temperature": 9})],
}


async def bad_request(http: httpx.AsyncClient, kind: str, rng: random.Random) -> str:
    path, body = rng.choice(BAD_BODIES[kind])
    status = (await http.post(path, json=body)).status_code
    return "bad: refused" if 400 <= status < 500 else f"bad: answered {status}"


async def dropped_request(http: httpx.AsyncClient, kind: str, texts: Texts, window: int) -> str:
    """A client that hangs up: after 20 ms of a large batch, or after the first streamed chunk."""
    if kind == "embed":
        try:
            body = {"inputs": [texts.one(400) for _ in range(32)], "truncate": True}
            await asyncio.wait_for(http.post("/embed", json=body), 0.02)
        except asyncio.TimeoutError:
            return "dropped by the client"
        return "200"  # answered within 20 ms
    body = {"model": "soak", "prompt": texts.one(max(1, min(100, (window - 48) // 2))), "max_tokens": 48,
            "stream": True}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        async for _ in response.aiter_lines():
            break  # closing the response here closes the connection mid-stream
    return "dropped by the client"


async def client(base: str, kind: str, seed: int, deadline: float, counts: Counts, dims: list[int], window: int
                 ) -> None:
    rng = random.Random(seed)
    texts = Texts(rng)
    good = embed_request if kind == "embed" else generate_request
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        while time.monotonic() < deadline:
            start, draw = time.perf_counter(), rng.random()
            try:
                if draw < BAD_SHARE:
                    counts.add(await bad_request(http, kind, rng))
                elif draw < BAD_SHARE + DROP_SHARE:
                    counts.add(await dropped_request(http, kind, texts, window))
                else:
                    outcome = await good(http, texts, rng, dims, window)
                    counts.add(outcome, time.perf_counter() - start if outcome == "200" else None)
            except httpx.HTTPError as err:  # the server dropped a connection the client kept: lost
                counts.add(f"lost: {type(err).__name__}")


# -- the sampler ---------------------------------------------------------------------------------------------
def resident_mib(process: psutil.Process) -> float:
    rss = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            rss += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return rss / 2**20


async def sampler(base: str, pid: int, started: float, deadline: float, every_s: float, counts: Counts,
                  samples: list[Sample]) -> None:
    process = psutil.Process(pid)
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        while True:
            metrics = (await http.get("/metrics")).text
            latencies, counts.latencies = np.array(counts.latencies) * 1000, []
            samples.append(Sample(
                minutes=(time.monotonic() - started) / 60, served=counts.served, rss_mib=resident_mib(process),
                fds=process.num_fds(), threads=process.num_threads(),
                series=sum(1 for line in metrics.splitlines() if line and not line.startswith("#")),
                p50_ms=float(np.percentile(latencies, 50)) if latencies.size else None,
                p99_ms=float(np.percentile(latencies, 99)) if latencies.size else None))
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(every_s, max(0.0, deadline - time.monotonic())))


# -- analysis and output -------------------------------------------------------------------------------------
def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys on xs; None with fewer than 3 points or no spread in xs."""
    if len(xs) < 3 or max(xs) == min(xs):
        return None
    return float(np.polyfit(np.asarray(xs, np.float64), np.asarray(ys, np.float64), 1)[0])


def _median_p99(after: list[Sample], first: bool, minutes: float = 5.0) -> float | None:
    """The median of the sampled p99s over the first (or last) ``minutes`` after the warm-up: one sample's p99 is
    that of ~10 s of requests, which moves 2x from one sample to the next under mixed shapes."""
    if not after:
        return None
    edge = after[0].minutes + minutes if first else after[-1].minutes - minutes
    window = [s.p99_ms for s in after if s.p99_ms is not None and (s.minutes <= edge if first else s.minutes >= edge)]
    return float(np.median(window)) if window else None


def summarize(samples: list[Sample], counts: Counts, warmup_minutes: float, bound: float) -> dict:
    after = [s for s in samples if s.minutes >= warmup_minutes]
    per_hour = slope([s.minutes / 60 for s in after], [s.rss_mib for s in after])
    per_request = slope([float(s.served) for s in after], [s.rss_mib for s in after])
    lost = {k: v for k, v in counts.statuses.items()
            if k.startswith("lost") or k.startswith("5") or k.startswith("bad: answered") or "without" in k}
    verdict = ("no samples after the warm-up" if per_hour is None else
               f"memory grows {per_hour:.1f} MiB/h > {bound:g}" if per_hour > bound else
               f"lost or mis-answered requests: {lost}" if lost else "ok")
    series = [s.series for s in after]
    return {
        "verdict": verdict, "requests": sum(counts.statuses.values()), "statuses": counts.statuses,
        "rss_mib_per_hour": per_hour, "rss_mib_per_10k_requests": per_request * 10_000 if per_request else None,
        "rss_mib_after_warmup": after[0].rss_mib if after else None, "rss_mib_end": samples[-1].rss_mib,
        "rss_mib_max": max(s.rss_mib for s in samples), "fds": [min(s.fds for s in samples), samples[-1].fds],
        "threads": [min(s.threads for s in samples), samples[-1].threads],
        "metric_series": [min(series), max(series)] if series else None,
        "p99_ms_first_last": [_median_p99(after, first=True), _median_p99(after, first=False)],
    }


def table(data: dict) -> list[str]:
    """RESULTS.md's lines for one run (its --json)."""
    s = data["summary"]

    def f(x: float | None, digits: int = 1) -> str:
        return "-" if x is None else f"{x:,.{digits}f}"

    served = s["statuses"].get("200", 0)
    others = ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()) if k != "200")
    return ["| task | minutes (warm-up) | requests (200; others) | RSS MiB after warm-up / end / max | MiB per hour | "
            "MiB per 10k requests | fds, threads (least / end) | metric series | p99 ms first / last 5 min (median) "
            "| verdict |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {data['task']} | {data['minutes']:g} ({data['warmup_minutes']:g}) | {s['requests']:,} ({served:,}; "
            f"{others or 'none'}) | {f(s['rss_mib_after_warmup'])} / {f(s['rss_mib_end'])} / {f(s['rss_mib_max'])} | "
            f"{f(s['rss_mib_per_hour'], 2)} | {f(s['rss_mib_per_10k_requests'], 2)} | {s['fds'][0]}/{s['fds'][1]}, "
            f"{s['threads'][0]}/{s['threads'][1]} | {s['metric_series']} | "
            f"{f(s['p99_ms_first_last'][0])} / {f(s['p99_ms_first_last'][1])} | {s['verdict']} |"]


def html(title: str, samples: list[Sample], summary: dict) -> str:
    def curve(name: str) -> list[tuple[float, float]]:
        return [(s.minutes, getattr(s, name)) for s in samples if getattr(s, name) is not None]

    charts = [
        line_chart({"resident memory": curve("rss_mib")}, title="Resident memory", x_label="minutes",
                   y_label="MiB", log_x=False),
        line_chart({"p50": curve("p50_ms"), "p99": curve("p99_ms")}, title="Latency of the requests answered "
                   "between samples", x_label="minutes", y_label="ms", log_x=False),
        line_chart({"file descriptors": curve("fds"), "threads": curve("threads"), "metric series": curve("series")},
                   title="Descriptors, threads and Prometheus series", x_label="minutes", y_label="count",
                   log_x=False),
    ]
    def shown(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.1f}"
        if isinstance(value, list):
            return " / ".join(shown(v) for v in value)
        return escape(str(value))

    rows = "".join(f"<tr><td>{escape(k)}</td><td>{shown(v)}</td></tr>" for k, v in summary.items())
    return page(title, [f"<h1>{escape(title)}</h1>", f"<table>{rows}</table>", *charts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", help="a kiln optimize output (its best/) or an artifact directory")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--bound-mib-per-hour", type=float, default=10.0,
                        help="the most resident memory may grow after the warm-up (240 MiB a day at 10)")
    parser.add_argument("--serve-flag", action="append", default=[],
                        help="a flag for kiln serve, repeatable (e.g. --serve-flag=--threads=2)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--html", type=Path)
    args = parser.parse_args()
    if args.minutes <= args.warmup_minutes:
        parser.error("--minutes must be longer than --warmup-minutes")

    artifact = Artifact.open(Path(args.artifact))
    task = artifact.task_config.task
    if task not in EMBEDDING_TASKS + GENERATION_TASKS:
        parser.error(f"artifact: the soak knows {', '.join(EMBEDDING_TASKS + GENERATION_TASKS)} artifacts; "
                     f"this one is {task}")
    kind = "embed" if task in EMBEDDING_TASKS else "generate"
    dims = list(artifact.task_config.matryoshka_dims or ()) if kind == "embed" else []
    window = artifact.task_config.max_length
    try:
        proc, port = start_server([sys.executable, "-m", "kiln", "serve", str(args.artifact), *args.serve_flag])
    except ServerStartError as err:
        sys.exit(str(err))
    base = f"http://127.0.0.1:{port}"
    counts, samples = Counts(), []
    started = time.monotonic()
    deadline = started + args.minutes * 60

    async def run() -> None:
        await asyncio.gather(sampler(base, proc.pid, started, deadline, args.sample_s, counts, samples),
                             *(client(base, kind, k, deadline, counts, dims, window) for k in range(args.clients)))

    try:
        asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    summary = summarize(samples, counts, args.warmup_minutes, args.bound_mib_per_hour)
    meta = {"artifact": str(args.artifact), "task": task, "minutes": args.minutes, "clients": args.clients,
            "warmup_minutes": args.warmup_minutes, "bound_mib_per_hour": args.bound_mib_per_hour}
    print(json.dumps({**meta, **summary}, indent=2))
    if args.json:
        args.json.write_text(json.dumps({**meta, "summary": summary, "samples": [asdict(s) for s in samples]},
                                        indent=1))
    if args.html:
        args.html.write_text(html(f"kiln serve soak: {args.artifact} ({task}, {args.minutes:g} min)", samples,
                                  summary))
    sys.exit(0 if summary["verdict"] == "ok" else 1)


if __name__ == "__main__":
    main()
