"""Load benchmark for `kiln serve`: closed-loop clients on 127.0.0.1 against a real server process.

Measured in one run, on the same texts (single texts of mixed length, 10-200 tokens):
  * offline: the same variant's batched throughput through kiln's predictor (tokenization included, as the
    server must tokenize too), same engine threads, in its own process;
  * kiln serve at each concurrency (default 1, 8, 64): throughput and p50/p90/p99 latency;
  * a one-request-per-forward FastAPI server (benchmarks/naive_server.py) at the same concurrencies;
  * overload: 4x more clients than --max-concurrent (answered / 429 rejected / lost);
  * SIGTERM while 64 clients send (sent / answered / refused at connect / lost after being accepted).
With ``--paired`` (kiln only, the top concurrency): offline passes and kiln serve phases alternate round by round,
the order flipped each round, both processes alive throughout, so that a VM whose speed drifts over minutes moves
both sides of each ratio alike; the figure is the median of the rounds' ratios.
Each kiln serve phase also records the cores the load generator and the server used (``cores_used``): they share
the machine's cores here.

The clients are a small asyncio HTTP/1.1 loop on raw sockets (keep-alive; no client library) so that on a
2-core machine the load generator takes as little CPU from the server as possible. Every phase is bounded
by a request count and a time limit.

    python benchmarks/serve_load.py kiln-out/best [--requests 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.serving.process import ServerStartError, exit_counts, start_server

HERE = Path(__file__).resolve().parent


@dataclass
class Phase:
    """What one closed-loop run saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, answered (200) requests only
    statuses: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def count(self, outcome: str) -> None:
        self.statuses[outcome] = self.statuses.get(outcome, 0) + 1

    def summary(self) -> dict:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.array([np.nan])
        answered = self.statuses.get("200", 0)
        return {"requests": sum(self.statuses.values()), "answered": answered, "statuses": self.statuses,
                "wall_s": round(self.wall_s, 3), "throughput_per_s": answered / self.wall_s if self.wall_s else 0.0,
                "p50_ms": float(np.percentile(lat, 50)), "p90_ms": float(np.percentile(lat, 90)),
                "p99_ms": float(np.percentile(lat, 99))}


def embed_bodies(texts: list[str]) -> list[bytes]:
    """One /kiln/embed body per text, as every load benchmark sends them."""
    return [json.dumps({"inputs": t}).encode() for t in texts]


def serving_bodies(artifact: str, count: int = 512) -> list[bytes]:
    """/kiln/embed bodies of ``count`` texts of the serving mix (kiln.data.workloads), sized by the artifact's
    tokenizer."""
    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix

    return embed_bodies(serving_mix(count, Artifact.open(artifact).encoder().token_count))


def _request(path: str, body: bytes, close: bool) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, float]:
    """(status, server keeps the connection open, Retry-After seconds) after reading one whole response."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("connection closed before a response")
    status = int(status_line.split()[1])
    length, keep, retry_after = 0, True, 0.0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "connection" and value.strip().lower() == "close":
            keep = False
        elif name.lower() == "retry-after":
            retry_after = float(value)
    await reader.readexactly(length)
    return status, keep, retry_after


async def closed_loop(port: int, bodies: list[bytes], clients: int, requests: int, max_s: float,
                      *, fresh_connections: bool = False, stop: asyncio.Event | None = None,
                      honor_retry_after: bool = False, path: str = "/kiln/embed") -> Phase:
    """``clients`` loops each send one request, wait for its answer, send the next; ``requests`` in total.

    ``fresh_connections`` opens a connection per request, so a server that stopped listening refuses at
    connect ("refused") and anything that fails after that was accepted and dropped ("lost").
    ``honor_retry_after`` makes a client told 429 wait as long as the server asks before its next request.
    """
    phase = Phase()
    counter = iter(range(requests))
    deadline = time.perf_counter() + max_s

    async def client() -> None:
        reader = writer = None
        for i in counter:
            if time.perf_counter() > deadline or (stop is not None and stop.is_set()):
                break
            body = bodies[i % len(bodies)]
            start = time.perf_counter()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                phase.count("refused")
                if stop is not None:
                    stop.set()  # the server is gone: every client stops
                break
            try:
                writer.write(_request(path, body, fresh_connections))
                status, keep, retry_after = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as err:
                phase.count(f"lost ({type(err).__name__})")
                writer.close()
                reader = writer = None
                continue
            phase.count(str(status))
            if status == 200:
                phase.latencies.append(time.perf_counter() - start)
            if fresh_connections or not keep:
                writer.close()
                reader = writer = None
            if status == 429 and honor_retry_after:
                await asyncio.sleep(min(retry_after, max(0.0, deadline - time.perf_counter())))
        if writer is not None:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    phase.wall_s = time.perf_counter() - start
    return phase


def kiln_serve(artifact: str, *flags: str) -> list[str]:
    """The command line of ``kiln serve ARTIFACT FLAGS`` in this interpreter (start adds --port)."""
    return [sys.executable, "-m", "kiln", "serve", artifact, *flags]


def start(command: list[str]) -> tuple[subprocess.Popen, int]:
    try:
        return start_server(command)
    except ServerStartError as err:
        sys.exit(str(err))


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120)


def offline_predictor(artifact: str, texts: list[str], threads: int | None):
    """(variant, plan, predictor) as kiln.load runs the artifact, warmed up on ``texts``: serving.json where kiln
    bench wrote it, else its split of the cores (split_cores_plan)."""
    from kiln.artifact.directory import Artifact

    art = Artifact.open(artifact)
    variant = art.variant_name()
    plan = art.serving_plan(variant, threads=threads, split_cores=True)
    predictor = art.predictor(variant, plan)
    predictor.predict(texts[:64])  # warm-up
    return variant, plan, predictor


def offline_worker(conn, artifact: str, texts: list[str], threads: int | None, rounds: int) -> None:
    variant, plan, predictor = offline_predictor(artifact, texts, threads)

    def rate(batch_size: int) -> tuple[float, list[float]]:
        predictor.batch_size = batch_size
        rates = []
        for _ in range(rounds):
            begin = time.perf_counter()
            predictor.predict(texts)
            rates.append(len(texts) / (time.perf_counter() - begin))
        return statistics.median(rates), rates

    batched, rounds_batched = rate(plan.batch_size)
    single, rounds_single = rate(1)  # the most any one-request-per-forward server could reach
    conn.send({"variant": variant, "threads": plan.options.intra_op_threads or "default",
               "sessions": len(predictor.sessions), "batch_size": plan.batch_size, "throughput_per_s": batched,
               "rounds": rounds_batched, "batch1_throughput_per_s": single, "batch1_rounds": rounds_single})


def offline_passes_worker(conn, artifact: str, texts: list[str], threads: int | None) -> None:
    """kiln.load's offline pass over ``texts``, once per message received (None ends it); sends texts/s back."""
    variant, plan, predictor = offline_predictor(artifact, texts, threads)
    conn.send({"variant": variant, "sessions": len(predictor.sessions), "batch_size": plan.batch_size})
    while conn.recv() is not None:
        begin = time.perf_counter()
        predictor.predict(texts)
        conn.send(len(texts) / (time.perf_counter() - begin))


def paired(kiln: list[str], artifact: str, texts: list[str], bodies: list[bytes], threads: int | None,
           clients: int, requests: int, max_s: float, rounds: int) -> dict:
    """Offline passes and kiln serve phases at ``clients``, alternated (see the module doc)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    worker = ctx.Process(target=offline_passes_worker, args=(child, artifact, texts, threads))
    worker.start()
    plan = parent.recv()
    proc, port = start(kiln)
    pairs = []
    try:
        asyncio.run(closed_loop(port, bodies, clients, max(2 * clients, 64), max_s))  # warm-up

        def offline_pass() -> dict:
            idle = cpu_seconds(proc.pid)
            parent.send(True)
            rate = parent.recv()
            return {"texts_per_s": rate, "server_cpu_s_meanwhile": cpu_seconds(proc.pid) - idle}

        def served_phase() -> dict:
            idle = cpu_seconds(worker.pid)
            row = measure(port, bodies, clients, requests, max_s, proc.pid)
            return {**row, "offline_process_cpu_s_meanwhile": cpu_seconds(worker.pid) - idle}

        for k in range(rounds):
            offline_first = k % 2 == 0
            if offline_first:
                off = offline_pass()
                served = served_phase()
            else:
                served = served_phase()
                off = offline_pass()
            ratio = served["throughput_per_s"] / off["texts_per_s"]
            pairs.append({"offline": off, "served": served, "ratio": ratio})
            print(f"  round {k + 1} ({'offline first' if offline_first else 'served first'}): offline "
                  f"{off['texts_per_s']:.1f} texts/s, kiln serve {served['throughput_per_s']:.1f} req/s, p99 "
                  f"{served['p99_ms']:.0f} ms: {ratio:.3f}x", flush=True)
    finally:
        parent.send(None)
        worker.join(timeout=60)
        code = stop(proc)
    ratios = [p["ratio"] for p in pairs]
    return {"plan": plan, "clients": clients, "rounds": pairs, "exit_code": code,
            "median_ratio": statistics.median(ratios),
            "median_offline_texts_per_s": statistics.median(p["offline"]["texts_per_s"] for p in pairs),
            "median_served_req_per_s": statistics.median(p["served"]["throughput_per_s"] for p in pairs),
            "median_p99_ms": statistics.median(p["served"]["p99_ms"] for p in pairs),
            "worst_p99_ms": max(p["served"]["p99_ms"] for p in pairs)}


def offline(artifact: str, texts: list[str], threads: int | None, rounds: int) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=offline_worker, args=(child, artifact, texts, threads, rounds))
    process.start()
    result = parent.recv()
    process.join(timeout=60)
    return result


def batch_metrics(port: int) -> dict[str, float] | None:
    """kiln serve's batch histograms (sums and counts) from /metrics; None for a server without them."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return None
    names = ("kiln_batch_size_sum", "kiln_batch_size_count", "kiln_batch_tokens_sum", "kiln_inference_seconds_sum")
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith(names)}
    return values if len(values) == len(names) else None


def cpu_seconds(pid: int | None = None, thread: int | None = None) -> float:
    """User + system CPU seconds of this process (``pid`` None), of process ``pid`` (Linux /proc), all threads, or
    of its one ``thread`` (a thread id: /proc/TID/stat would give the whole process's)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def measure(port: int, bodies: list[bytes], clients: int, requests: int, max_s: float,
            server_pid: int | None = None) -> dict:
    """One closed-loop phase, with how kiln serve packed its batches during it (when the server says) and how many
    of the machine's cores the load generator and the server used: on one machine they share the cores."""
    before = batch_metrics(port)
    cpu_before = cpu_seconds(), cpu_seconds(server_pid) if server_pid else 0.0
    phase = asyncio.run(closed_loop(port, bodies, clients, requests, max_s))
    cpu_after = cpu_seconds(), cpu_seconds(server_pid) if server_pid else 0.0
    after = batch_metrics(port)
    row = phase.summary()
    if phase.wall_s:
        row["cores_used"] = {"load_generator": (cpu_after[0] - cpu_before[0]) / phase.wall_s}
        if server_pid:
            row["cores_used"]["server"] = (cpu_after[1] - cpu_before[1]) / phase.wall_s
    if before and after:  # how the batcher packed this phase, and how busy it kept the engine
        delta = {k: after[k] - before[k] for k in after}
        batches = delta["kiln_batch_size_count"] or 1
        row["batches"] = {"count": int(batches), "mean_size": delta["kiln_batch_size_sum"] / batches,
                          "mean_padded_tokens": delta["kiln_batch_tokens_sum"] / batches,
                          "engine_busy": delta["kiln_inference_seconds_sum"] / phase.wall_s}
    return row


def sweep(command: list[str], bodies: list[bytes], concurrency: list[int], requests: int, max_s: float,
          rounds: int) -> dict:
    """Each concurrency: a warm-up, then ``rounds`` measured phases; the median-throughput phase is reported."""
    proc, port = start(command)
    rows = {}
    try:
        for clients in concurrency:
            asyncio.run(closed_loop(port, bodies, clients, max(2 * clients, 64), max_s))  # warm-up
            runs = sorted((measure(port, bodies, clients, requests, max_s, proc.pid) for _ in range(rounds)),
                          key=lambda r: r["throughput_per_s"])
            rows[clients] = row = {**runs[len(runs) // 2], "rounds": [r["throughput_per_s"] for r in runs]}
            packing = (f"  batches {row['batches']['count']} of mean {row['batches']['mean_size']:.1f}, engine busy "
                       f"{100 * row['batches']['engine_busy']:.0f}%") if "batches" in row else ""
            cores = row.get("cores_used", {})
            packing += "".join(f", {name.replace('_', ' ')} {used:.2f} cores" for name, used in cores.items())
            print(f"  {clients:>3} clients: {row['throughput_per_s']:7.1f} req/s  p50 {row['p50_ms']:7.1f} ms  "
                  f"p90 {row['p90_ms']:7.1f}  p99 {row['p99_ms']:7.1f}  statuses {row['statuses']}{packing}",
                  flush=True)
    finally:
        rows["exit_code"] = stop(proc)
    return rows


def overload(kiln: list[str], bodies: list[bytes], limit: int, seconds: float) -> dict:
    """4x more closed-loop clients than --max-concurrent for ``seconds``; a client told 429 waits Retry-After."""
    proc, port = start([*kiln, "--max-concurrent", str(limit)])
    try:
        phase = asyncio.run(closed_loop(port, bodies, 4 * limit, 10**6, seconds, honor_retry_after=True))
    finally:
        code = stop(proc)
    server = exit_counts(proc) or {}
    row = phase.summary()
    lost = sum(n for k, n in phase.statuses.items() if k.startswith("lost"))
    result = {"clients": 4 * limit, "max_concurrent": limit, **row, "rejected_429": phase.statuses.get("429", 0),
              "lost": lost, "server_counted": server, "exit_code": code}
    print(f"  4x overload ({4 * limit} clients, --max-concurrent {limit}, {seconds:.0f} s): sent {row['requests']}, "
          f"answered {row['answered']} ({row['throughput_per_s']:.1f}/s, p50 {row['p50_ms']:.0f} ms, p99 "
          f"{row['p99_ms']:.0f} ms), rejected 429 {result['rejected_429']}, lost {lost}; server counted {server}; "
          f"exit {code}", flush=True)
    return result


def sigterm(kiln: list[str], bodies: list[bytes], clients: int, after_s: float, max_s: float) -> dict:
    proc, port = start(kiln)

    async def run() -> tuple[Phase, float]:
        halt = asyncio.Event()
        load = asyncio.create_task(closed_loop(port, bodies, clients, 10**6, max_s, fresh_connections=True,
                                               stop=halt))
        await asyncio.sleep(after_s)
        proc.send_signal(signal.SIGTERM)
        sent_at = time.perf_counter()
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 120)
        halt.set()  # clients still sending after exit would count refusals forever
        return await load, (time.perf_counter() - sent_at, code)

    phase, (drain_s, code) = asyncio.run(run())
    statuses = phase.statuses
    server = exit_counts(proc) or {}
    answered = statuses.get("200", 0)
    reset = sum(n for k, n in statuses.items() if k.startswith("lost"))
    other = sum(n for k, n in statuses.items() if k not in ("200", "refused") and not k.startswith("lost"))
    # A reset right after connect is a connection still in the kernel's accept queue when listening stopped: the
    # server never read it (its own count of requests equals the clients' answered count), so it is "refused".
    # It is "lost" only if the server saw more requests than the clients got answers for.
    lost = sum(server.values()) - answered if server else reset
    result = {"clients": clients, "signal_after_s": after_s, "sent": sum(statuses.values()), "answered": answered,
              "refused_at_connect": statuses.get("refused", 0), "reset_before_read": reset if server else None,
              "error_answers": other, "server_counted": server, "lost": lost, "statuses": statuses,
              "exit_code": code, "exit_after_signal_s": round(drain_s, 3)}
    print(f"  SIGTERM after {after_s:.0f} s under {clients} clients: sent {result['sent']}, answered {answered}, "
          f"refused {result['refused_at_connect']} at connect + {reset} reset before being read, lost {lost}, "
          f"error answers {other}; server counted {server}; exit {code} after {drain_s:.2f} s", flush=True)
    return result


def markdown(result: dict) -> str:
    """The tables for benchmarks/RESULTS.md, from one run's result."""
    base = result["offline"]
    lines = ["| server | clients | req/s | p50 ms | p90 ms | p99 ms | mean batch | vs offline batched |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, key in (("kiln serve", "kiln_serve"), ("one request per forward", "one_request_per_forward")):
        for clients, row in result[key].items():
            if clients == "exit_code":
                continue
            batch = f"{row['batches']['mean_size']:.1f}" if "batches" in row else "1"
            lines.append(f"| {label} | {clients} | {row['throughput_per_s']:.1f} | {row['p50_ms']:.1f} | "
                         f"{row['p90_ms']:.1f} | {row['p99_ms']:.1f} | {batch} | "
                         f"{row['throughput_per_s'] / base['throughput_per_s']:.2f}x |")
    lines.append(f"| offline, kiln.load ({base['sessions']} session(s), batches of {base['batch_size']}, sorted) | - | "
                 f"{base['throughput_per_s']:.1f} | | | | {base['batch_size']} | 1.00x |")
    lines.append(f"| offline, one at a time | - | {base['batch1_throughput_per_s']:.1f} | | | | 1 | "
                 f"{base['batch1_throughput_per_s'] / base['throughput_per_s']:.2f}x |")
    over, term = result["overload"], result["sigterm"]
    lines += ["", "| event | sent | answered | rejected | lost | exit code |", "| --- | --- | --- | --- | --- | --- |",
              f"| 4x overload: {over['clients']} clients, --max-concurrent {over['max_concurrent']}, "
              f"{over['wall_s']:.0f} s | {over['requests']} | {over['answered']} | {over['rejected_429']} (429) | "
              f"{over['lost']} | {over['exit_code']} |",
              f"| SIGTERM after {term['signal_after_s']:.0f} s under {term['clients']} clients | {term['sent']} | "
              f"{term['answered']} | {term['refused_at_connect']} refused at connect + {term['reset_before_read']} "
              f"reset unread | {term['lost']} | {term['exit_code']} |"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--texts", type=int, default=512, help="distinct texts (10-200 tokens), cycled")
    parser.add_argument("--requests", type=int, default=1024, help="requests per measured phase")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--threads", type=int, default=None, help="engine threads (default: the serving default)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time limit per phase")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per phase (the median is reported)")
    parser.add_argument("--serve-args", default="", help="extra `kiln serve` options, e.g. '--max-delay-ms 2'")
    parser.add_argument("--kiln-only", action="store_true",
                        help="offline and kiln serve only: no one-request-per-forward server, overload or SIGTERM")
    parser.add_argument("--paired", action="store_true",
                        help="offline passes and kiln serve phases alternated round by round at the top concurrency "
                             "(implies --kiln-only)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix

    art = Artifact.open(args.artifact)
    from kiln.tasks import task_spec

    if not task_spec(art.task_config.task).embeds:
        sys.exit("this benchmark sends /kiln/embed requests: give it a feature-extraction artifact")
    encoder = art.encoder()
    texts = serving_mix(args.texts, encoder.token_count)
    lengths = [len(e.ids) for e in encoder.encode(texts)]
    bodies = embed_bodies(texts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    threads = ["--threads", str(args.threads)] if args.threads else []
    kiln = kiln_serve(args.artifact, *threads, *args.serve_args.split())
    naive = [sys.executable, str(HERE / "naive_server.py"), args.artifact, *threads]
    # the offline figure covers the same request stream: `requests` texts drawn in the same cycle
    stream = [texts[i % len(texts)] for i in range(args.requests)]

    print(f"texts: {len(texts)} distinct, tokens min/median/max {min(lengths)}/{statistics.median(lengths)}/"
          f"{max(lengths)}; {args.requests} requests per phase", flush=True)
    if args.paired:
        result = paired(kiln, args.artifact, stream, bodies, args.threads, max(concurrency), args.requests,
                        args.max_seconds, args.rounds)
        ratios = ", ".join(f"{pair['ratio']:.3f}" for pair in result["rounds"])
        print(f"at {result['clients']} clients, {args.rounds} alternated rounds: kiln serve = "
              f"{result['median_ratio']:.3f}x offline (median of the rounds' ratios: {ratios}), offline "
              f"{result['median_offline_texts_per_s']:.1f} texts/s, kiln serve "
              f"{result['median_served_req_per_s']:.1f} req/s, p99 median {result['median_p99_ms']:.0f} ms, worst "
              f"{result['worst_p99_ms']:.0f} ms")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"artifact": args.artifact, "serve_args": args.serve_args,
                                                   "paired": result}, indent=2) + "\n")
        return 0
    base = offline(args.artifact, stream, args.threads, args.rounds)
    print(f"offline ({base['variant']}, {base['threads']} threads, tokenization included): "
          f"batched ({base['batch_size']}, sorted) "
          f"{base['throughput_per_s']:.1f} texts/s; one at a time {base['batch1_throughput_per_s']:.1f} texts/s "
          f"(so batching can gain at most {base['throughput_per_s'] / base['batch1_throughput_per_s']:.2f}x over "
          "one forward per request here)", flush=True)
    print("kiln serve:", flush=True)
    served = sweep(kiln, bodies, concurrency, args.requests, args.max_seconds, args.rounds)
    top = max(concurrency)
    if args.kiln_only:
        ratio = served[top]["throughput_per_s"] / base["throughput_per_s"]
        print(f"at {top} clients: kiln serve = {ratio:.2f}x offline batched, p99 {served[top]['p99_ms']:.0f} ms")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"artifact": args.artifact, "variant": base["variant"],
                                                   "serve_args": args.serve_args, "offline": base,
                                                   "kiln_serve": served, f"ratio_vs_offline_at_{top}": ratio},
                                                  indent=2) + "\n")
        return 0
    print("one request per forward (FastAPI):", flush=True)
    plain = sweep(naive, bodies, concurrency, args.requests, args.max_seconds, args.rounds)
    print("overload and shutdown:", flush=True)
    over = overload(kiln, bodies, 64, min(args.max_seconds, 15.0))
    term = sigterm(kiln, bodies, 64, 3.0, args.max_seconds)

    result = {
        "artifact": args.artifact, "variant": base["variant"], "threads": base["threads"],
        "texts": len(texts), "tokens": {"min": min(lengths), "median": statistics.median(lengths),
                                        "max": max(lengths)},
        "requests_per_phase": args.requests, "serve_args": args.serve_args, "offline": base,
        "kiln_serve": served, "one_request_per_forward": plain, "overload": over, "sigterm": term,
        f"ratio_vs_offline_at_{top}": served[top]["throughput_per_s"] / base["throughput_per_s"],
        f"ratio_vs_naive_at_{top}": served[top]["throughput_per_s"] / plain[top]["throughput_per_s"],
    }
    print(f"at {top} clients: kiln serve = {result[f'ratio_vs_offline_at_{top}']:.2f}x offline batched "
          f"(target >= 0.85), {result[f'ratio_vs_naive_at_{top}']:.2f}x one-request-per-forward (target >= 2)")
    print(markdown(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
