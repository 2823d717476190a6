"""Where kiln serve spends the CPU that the same texts embedded offline do not (issue 27), three ways:

  * ``--mode perf``: ``perf record`` of the whole server process under 64 closed-loop clients, and of a process
    running ``kiln.load``'s offline pass over the same texts; samples by shared object and by thread role (the
    engine's stream threads, the event loop, the tokenizer pool, the rest of Python's threads), each as a share
    of the engine's own JIT-kernel samples: what each side spends per unit of model work. (perf's absolute sample
    counts run short in this VM; the shares compare.)
  * ``--mode calls``: every OpenVINO engine call timed from Python against OpenVINO's own latency for it, served
    and offline: the difference is the call's binding work plus the wait for the GIL when it returns; and the
    calling thread's CPU a call (a tree from before kiln's own call path: its InferRequest.infer instead);
  * ``--mode tokenize``: one text's tokenization right after 16 MiB of other memory traffic (as on a core the
    engine shares) against texts tokenized back to back, in bursts of 1-16;
  * ``--mode turns``: the tokenizer pool's turns in the server (kiln.serve.coalesce): jobs a turn and the pool
    thread's CPU a job.

    python benchmarks/experiments/serve_overhead/run.py kiln-out/best --mode perf|calls|tokenize|turns [--symbols N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import closed_loop, measure, serving_bodies, start, stop  # noqa: E402

OFFLINE = """
import sys, time
from kiln.artifact.directory import Artifact
from kiln.data.workloads import serving_mix
artifact = Artifact.open(sys.argv[1])
variant = artifact.variant_name()
predictor = artifact.predictor(variant, artifact.serving_plan(variant, split_cores=True))
texts = serving_mix(1024, artifact.encoder().token_count)
predictor.predict(texts)
print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    began = time.perf_counter()
    predictor.predict(texts)
    print(f"offline {len(texts) / (time.perf_counter() - began):.1f} texts/s", flush=True)
"""

# Runs a script or kiln's CLI with every OpenVINO engine call timed (wall, OpenVINO's latency, the calling thread's
# CPU) into a file: kiln's call (kiln.engines.openvino._call: inputs in, infer, outputs out), or on a tree from
# before it (PYTHONPATH=an older src) InferRequest.infer, which kiln called then.
TIMED = """
import atexit, sys, time
import openvino as ov
from kiln.engines import openvino as engine
out = sys.argv.pop(1)
rows = []
def timing(call, request_of):
    def timed(*args, **kwargs):
        began, cpu = time.perf_counter(), time.thread_time()
        result = call(*args, **kwargs)
        rows.append((time.perf_counter() - began, request_of(args).latency / 1000.0, time.thread_time() - cpu))
        return result
    return timed
if hasattr(engine, "_call"):
    engine._call = timing(engine._call, lambda args: args[0])
else:
    ov.InferRequest.infer = timing(ov.InferRequest.infer, lambda args: args[0])
atexit.register(lambda: open(out, "w").write("".join(f"{w} {l} {c}\\n" for w, l, c in rows)))
if sys.argv[1] == "serve":
    from kiln.cli.app import main
    sys.argv[0] = "kiln"
    main()
else:
    script = sys.argv.pop(1)
    exec(compile(script, "offline", "exec"))
"""


# kiln serve with the tokenizer pool's turns counted (jobs, and the pool thread's CPU for them) into a file.
TURNS = """
import atexit, sys, time
from kiln.serve import coalesce
out, sizes, cpu = sys.argv.pop(1), [], [0.0]
turn = coalesce.CoalescingPool._turn
def counted(self, loop, jobs):
    began = time.thread_time()
    turn(self, loop, jobs)
    cpu[0] += time.thread_time() - began
    sizes.append(len(jobs))
coalesce.CoalescingPool._turn = counted
atexit.register(lambda: open(out, "w").write(f"{cpu[0]} " + " ".join(map(str, sizes))))
from kiln.cli.app import main
sys.argv[0] = "kiln"
main()
"""


def perf_record(pid: int, seconds: float, data: Path) -> subprocess.Popen:
    return subprocess.Popen(["perf", "record", "-F", "999", "-p", str(pid), "-o", str(data), "--", "sleep",
                             str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def samples(data: Path) -> list[tuple[int, str, str]]:
    """(thread id, shared object, symbol) per sample."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso"], capture_output=True,
                            text=True, check=True).stdout
    rows = []
    for line in script.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            dso = parts[-1].strip("()").rsplit("/", 1)[-1]
            symbol = " ".join(parts[2:-1]) or "?"
            rows.append((int(parts[0]), "[JIT]" if dso.startswith("perf-") else dso, symbol))
    return rows


def roles(rows: list[tuple[int, str, str]], main_tid: int) -> dict[int, str]:
    """Each thread's role, read from where its samples fall."""
    by_thread: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for tid, dso, _ in rows:
        by_thread[tid][dso] += 1
    named = {}
    for tid, counts in by_thread.items():
        top = counts.most_common(1)[0][0]
        if tid == main_tid:
            named[tid] = "event loop / caller"
        elif top == "[JIT]":
            named[tid] = "engine streams"
        elif top.startswith("tokenizers") or counts["tokenizers.abi3.so"] > sum(
                n for dso, n in counts.items() if dso.startswith("libpython")):
            named[tid] = "tokenizer"
        else:
            named[tid] = "other Python threads (sessions, former)"
    return named


def report(name: str, rows: list[tuple[int, str, str]], main_tid: int, symbols: int = 0) -> None:
    jit = sum(1 for _, dso, _ in rows if dso == "[JIT]") or 1
    print(f"\n{name}: {len(rows)} samples, JIT kernels {100 * jit / len(rows):.1f}%; per 100 JIT samples:")
    dsos = collections.Counter(dso for _, dso, _ in rows if dso != "[JIT]")
    for dso, count in dsos.most_common(10):
        print(f"  {100 * count / jit:6.2f}  {dso}")
    named = roles(rows, main_tid)
    threads = collections.Counter(named[tid] for tid, dso, _ in rows
                                  if dso != "[JIT]" or named[tid] != "engine streams")
    print("  by thread (the engine streams' own non-JIT samples included):")
    for role, count in threads.most_common():
        print(f"  {100 * count / jit:6.2f}  {role}")
    if symbols:
        print(f"  the engine streams' non-JIT samples, top {symbols} symbols:")
        where = collections.Counter(f"{dso}: {symbol}" for tid, dso, symbol in rows
                                    if dso != "[JIT]" and named[tid] == "engine streams")
        for place, count in where.most_common(symbols):
            print(f"  {100 * count / jit:6.2f}  {place[:110]}")


def mode_perf(artifact: str, seconds: float, symbols: int = 0) -> None:
    bodies = serving_bodies(artifact)
    with tempfile.TemporaryDirectory() as tmp:
        served, offline = Path(tmp) / "served.data", Path(tmp) / "offline.data"
        proc, port = start([sys.executable, "-m", "kiln", "serve", artifact])
        try:
            asyncio.run(closed_loop(port, bodies, 64, 1024, 60))
            record = perf_record(proc.pid, seconds, served)
            phase = asyncio.run(closed_loop(port, bodies, 64, 1_000_000, seconds + 1))
            record.wait()
            served_pid = proc.pid
        finally:
            stop(proc)
        print(f"served: {phase.summary()['throughput_per_s']:.1f} req/s while recorded")
        rounds = max(2, int(seconds / 4) + 2)
        worker = subprocess.Popen([sys.executable, "-c", OFFLINE, artifact, str(rounds)], stdout=subprocess.PIPE,
                                  text=True)
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            sys.exit("the offline worker did not start")
        perf_record(worker.pid, seconds, offline).wait()
        worker.kill()
        print(worker.stdout.read().strip().splitlines()[0])
        report("served", samples(served), served_pid, symbols)
        report("offline", samples(offline), worker.pid, symbols)


def served_under_load(script: str, out: Path, artifact: str) -> dict:
    """Run ``script`` (an instrumented kiln CLI writing to ``out`` at exit) as ``serve ARTIFACT``, warm it, then
    2,048 requests from 64 closed-loop clients; the phase's row once the server has exited."""
    bodies = serving_bodies(artifact)
    proc, port = start([sys.executable, "-c", script, str(out), "serve", artifact])
    try:
        asyncio.run(closed_loop(port, bodies, 64, 256, 60))
        return measure(port, bodies, 64, 2048, 60, proc.pid)
    finally:
        stop(proc)


def mode_calls(artifact: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        served, offline = Path(tmp) / "served.txt", Path(tmp) / "offline.txt"
        row = served_under_load(TIMED, served, artifact)
        print(f"served: {row['throughput_per_s']:.1f} req/s")
        subprocess.run([sys.executable, "-c", TIMED, str(offline), OFFLINE, artifact, "3"], check=True,
                       stdout=subprocess.DEVNULL)
        for name, path in (("served", served), ("offline", offline)):
            calls = np.loadtxt(path)
            calls = calls[len(calls) // 4:]  # past the warm-up's calls
            wall, latency, cpu = calls[:, 0], calls[:, 1], calls[:, 2]
            over = 1000 * (wall - latency)
            print(f"{name}: {len(calls)} calls of {1000 * wall.mean():.1f} ms; a call beyond OpenVINO's latency: "
                  f"mean {over.mean():.2f} ms, median {np.median(over):.2f}, p90 {np.percentile(over, 90):.2f}, "
                  f"p99 {np.percentile(over, 99):.2f}; {100 * (wall - latency).sum() / wall.sum():.2f}% of the calls' "
                  f"time; the calling thread's CPU a call: median {1e6 * np.median(cpu):.0f} us")


def mode_tokenize(artifact: str) -> None:
    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import serving_mix

    encoder = Artifact.open(artifact).encoder()
    texts = serving_mix(512, encoder.token_count)
    tokenizer = encoder.tokenizer
    other = np.ones(16 * 1024 * 1024 // 4, dtype=np.float32)
    for burst in (1, 2, 4, 8, 16):
        cold = 0.0
        for first in range(0, len(texts), burst):
            other += 1.0  # 16 MiB of other memory traffic between bursts
            began = time.thread_time()
            for text in texts[first:first + burst]:
                tokenizer.encode_batch_fast([text])
            cold += time.thread_time() - began
        began = time.thread_time()
        for text in texts:
            tokenizer.encode_batch_fast([text])
        warm = time.thread_time() - began
        print(f"bursts of {burst:2d}: {1e6 * cold / len(texts):.0f} us a text after other traffic; "
              f"{1e6 * warm / len(texts):.0f} us back to back")


def mode_turns(artifact: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "turns.txt"
        row = served_under_load(TURNS, counts, artifact)
        cpu, *sizes = counts.read_text().split()
        jobs = [int(n) for n in sizes]
        print(f"served: {row['throughput_per_s']:.1f} req/s; {len(jobs)} turns of {sum(jobs)} jobs (warm-up included): "
              f"{sum(jobs) / len(jobs):.2f} jobs a turn, {collections.Counter(jobs)[1]} turns of one job; the pool "
              f"thread {1e6 * float(cpu) / sum(jobs):.0f} us of CPU a job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--mode", choices=("perf", "calls", "tokenize", "turns"), required=True)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--symbols", type=int, default=0, help="perf: also the top N symbols of the engine streams' "
                        "non-JIT samples")
    args = parser.parse_args()
    {"perf": lambda: mode_perf(args.artifact, args.seconds, args.symbols), "calls": lambda: mode_calls(args.artifact),
     "tokenize": lambda: mode_tokenize(args.artifact), "turns": lambda: mode_turns(args.artifact)}[args.mode]()


if __name__ == "__main__":
    main()
