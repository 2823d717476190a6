"""`python server.py VARIANT[+VARIANT...] serve ARTIFACT ...`: kiln's CLI with one of the serving variants tried in
issue 27 applied first (run.py compares them; "base" applies none):

  outer      kiln's ASGI middlewares (request ids, the guard, the fast lane) around the FastAPI app instead of
             inside its middleware stack, so the fast lane's requests skip FastAPI's and Starlette's own layers;
  noproxy    uvicorn's proxy-headers middleware off;
  nopin      OpenVINO's ENABLE_CPU_PINNING off (kiln leaves the CPU plugin's default: on);
  notokpar   TOKENIZERS_PARALLELISM=false (the tokenizers library's Rust thread pool unused);
  bigcache   OpenVINO's CPU_RUNTIME_CACHE_CAPACITY 100,000 (default 5,000 kernels);
  queued     one infer request (and session thread) more than OpenVINO's streams, so that a formed batch waits
             inside the runtime and a stream starts it the moment it frees, not after its session's Python work;
  callN      the batcher's partition costs an engine call N padded tokens (kiln's call_overhead_tokens, default 64):
             larger N makes fewer, wider-spread batches, smaller N more batches of closer widths;
  switchN    the interpreter's GIL switch interval N microseconds (sys.setswitchinterval; Python's default 5000): how
             long a thread back from C code (an engine call, the tokenizer) may wait for the GIL the loop holds;
  spinN      N microseconds of busy Python on the event loop per inference request (in the guard): what the loop's
             CPU per request is worth in throughput;
  models     a compiled model per session (one stream each; the weights once per session) instead of one model
             with a stream per session: the prerequisite for routing a batch to the session that last ran its shape
             (OpenVINO picks the stream of a shared model per call). Pair it with nopin: single-stream models each
             pin their thread, and may pick the same core;
  bare       POST /embed answered by a minimal ASGI handler ahead of every kiln layer (no request id, guard, fast
             lane, validation, metrics, trace or latency header): parse, tokenize in a pool turn, batch, finalize,
             render. Not a server to ship: the upper bound of what a leaner event-loop path could buy;
  widths     OpenVINO: one more compile per padded width 16-256 (the batch left dynamic; each ~60 MiB on MiniLM int8)
             beside kiln's dynamic one, and a call runs on its width's compile where there is one
             (benchmarks/experiments/openvino_width_static measured +3.8% on shuffled shapes, +2.4% grouped);
  granian    the app served by granian (a Rust HTTP server: hyper on tokio threads; PyPI's granian, installed by
             hand: not a kiln dependency) embedded in kiln's process instead of uvicorn: HTTP parsing and socket I/O
             leave the Python event loop, which only runs the app. No drain, no signals beyond SIGTERM's stop;
  affine     the event loop, the tokenizer pool and the batch former held on core 0 (sched_setaffinity of their
             threads, re-applied each second as pool threads appear); the engine sessions left to OpenVINO's pinning,
             so one core's stream runs with no Python beside it and the other shares its core with all of it;
  niceN      the same threads as affine at nice N (setpriority of each thread, re-applied each second), the engine
             sessions at kiln's 0: the scheduler gives an engine call longer stretches before Python preempts it;
  bigheap    (set by run.py, before the process starts) glibc's malloc keeps freed memory rather than returning it:
             GLIBC_TUNABLES mmap_threshold 256 MiB, trim_threshold 1 GiB, top_pad 64 MiB.
"""

from __future__ import annotations

import os
import sys

VARIANTS = {"base", "outer", "noproxy", "nopin", "notokpar", "bigcache", "queued", "bigheap", "models", "bare",
            "widths", "granian", "affine"}
chosen = set(sys.argv.pop(1).split("+"))


def numbered(prefix: str) -> list[int]:
    """The N of a chosen PREFIXN variant (at most one is meant), taken out of ``chosen``."""
    values = [int(v[len(prefix):]) for v in chosen if v.startswith(prefix) and v[len(prefix):].isdigit()]
    chosen.difference_update(f"{prefix}{n}" for n in values)
    return values


call_tokens, switch_us, spin_us, nice = numbered("call"), numbered("switch"), numbered("spin"), numbered("nice")
if switch_us:
    sys.setswitchinterval(switch_us[0] / 1e6)
if spin_us:
    import time

    from kiln.serve.guard import Guard

    guarded, spin_s = Guard.__call__, spin_us[0] / 1e6

    async def spinning(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and self.route_of(scope["path"]) is not None:
            began = time.thread_time()
            while time.thread_time() - began < spin_s:
                pass
        await guarded(self, scope, receive, send)

    Guard.__call__ = spinning
if chosen - VARIANTS:
    sys.exit(f"unknown variant(s) {', '.join(sorted(chosen - VARIANTS))}; choose from {', '.join(sorted(VARIANTS))}")
if "notokpar" in chosen:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

openvino_config = {}
if "nopin" in chosen:
    openvino_config["ENABLE_CPU_PINNING"] = False
if "bigcache" in chosen:
    openvino_config["CPU_RUNTIME_CACHE_CAPACITY"] = 100000
if openvino_config:
    import openvino as ov

    compile_model = ov.Core.compile_model

    def configured(self, model, device=None, config=None, *args, **kwargs):
        config = dict(config or {})
        for key, value in openvino_config.items():
            if config.get(key) != 0:  # kiln turns the kernel cache off for decoders: left so
                config[key] = value
        return compile_model(self, model, device, config, *args, **kwargs)

    ov.Core.compile_model = configured

if chosen & {"outer", "noproxy", "bare"}:
    from fastapi import FastAPI

    from kiln.serve import server

    held: list = []

    class Bare:
        """/embed without kiln's layers (see the module doc); anything else goes to the app."""

        def __init__(self, app, fastapi) -> None:
            self.app, self.fastapi = app, fastapi  # app: FastAPI, or kiln's middlewares around it (outer)

        async def __call__(self, scope, receive, send) -> None:
            if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/embed":
                await self.app(scope, receive, send)
                return
            import orjson

            chunks, more = [], True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            inputs = orjson.loads(b"".join(chunks))["inputs"]
            items = [inputs] if isinstance(inputs, str) else inputs
            state = self.fastapi.state
            served = next(iter(state.models.values()))
            handler = served.predictor.handler
            options = handler.options(truncate=True)
            prepared = await state.pool.coalesced(served.predictor.prepare, items, options)
            reduced = await served.scheduler.submit(prepared.encodings)
            results = handler.finalize(prepared, reduced, options, served.predictor.encoder)
            body = orjson.dumps({"model": served.name, "embeddings": results, "truncated": list(prepared.truncated)},
                                option=orjson.OPT_SERIALIZE_NUMPY)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
    if "outer" in chosen:
        FastAPI.add_middleware = lambda self, cls, **options: held.append((cls, options))
    uvicorn_config = server.uvicorn.Config

    def config(app, **options):
        fastapi = app
        for cls, kwargs in held:  # in the order added: the last (request ids) outermost, as Starlette stacks them
            app = cls(app, **kwargs)
        if "noproxy" in chosen:
            options["proxy_headers"] = False
        if "bare" in chosen:
            app = Bare(app, fastapi)
        return uvicorn_config(app, **options)

    server.uvicorn.Config = config

if "queued" in chosen:
    from kiln import engines
    from kiln.artifact import directory

    open_sessions = directory.open_sessions  # the one kiln's artifacts call (another variant may wrap it too)

    def queued_sessions(name, path, options, count):
        sessions = open_sessions(name, path, options, count)
        if name in engines.STREAMING_ENGINES and len(sessions) > 1:
            sessions += sessions[0].requests(2)[1:]
        return sessions

    directory.open_sessions = queued_sessions

if "models" in chosen:
    from dataclasses import replace as with_options

    from kiln import engines
    from kiln.artifact import directory

    shared_model_sessions = directory.open_sessions

    def model_per_session(name, path, options, count):
        if name not in engines.STREAMING_ENGINES or count is None or count < 2:
            return shared_model_sessions(name, path, options, count)
        return [engines.create_engine(name, path, with_options(options, streams=1)) for _ in range(count)]

    directory.open_sessions = model_per_session

if "widths" in chosen:
    import openvino as ov

    from kiln.engines import openvino as engine

    configs: list[dict] = []
    plain_compile = ov.Core.compile_model

    def recorded(self, model, device=None, config=None, *args, **kwargs):
        configs.append(dict(config or {}))
        return plain_compile(self, model, device, config, *args, **kwargs)

    ov.Core.compile_model = recorded
    dynamic_init, dynamic_run, dynamic_requests = (engine.OpenVinoEngine.__init__, engine.OpenVinoEngine.run,
                                                   engine.OpenVinoEngine.requests)

    def width_init(self, path, *args, **kwargs):
        dynamic_init(self, path, *args, **kwargs)
        core, config = ov.Core(), configs[-1]
        self.width_models = {}
        for width in range(16, 272, 16):
            model = core.read_model(str(path))
            model.reshape({i.get_any_name(): ov.PartialShape([-1, width]) for i in model.inputs})
            self.width_models[width] = plain_compile(core, model, "CPU", config)
        self.width_requests = {w: m.create_infer_request() for w, m in self.width_models.items()}

    def width_run(self, inputs):
        self._check(inputs)  # as kiln's own run: rank, shapes, vocabulary
        request = self.width_requests.get(inputs[self.input_names[0]].shape[1])
        if request is None:
            return dynamic_run(self, inputs)
        return engine._call(request, inputs, self.input_names, self.output_names)

    def width_requests(self, count):
        views = dynamic_requests(self, count)
        for view in views[1:]:
            view.width_requests = {w: m.create_infer_request() for w, m in self.width_models.items()}
        return views

    engine.OpenVinoEngine.__init__, engine.OpenVinoEngine.run = width_init, width_run
    engine.OpenVinoEngine.requests = width_requests

if call_tokens:
    from dataclasses import replace

    from kiln.serve import batcher

    costed = batcher.partition
    batcher.partition = lambda lengths, limits: costed(lengths, replace(limits, call_overhead_tokens=call_tokens[0]))

if "granian" in chosen:
    import asyncio
    import signal

    import uvloop
    from granian.constants import Interfaces
    from granian.server.embed import Server

    from kiln.serve import server as kiln_server
    from kiln.serve.process import LISTENING

    def granian_run(app, host, port, **_):
        async def ready() -> None:  # the app's lifespan (model loading) runs inside serve(): poll until it answers
            while True:
                try:
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    line = await reader.readline()
                    writer.close()
                    if b" 200 " in line:
                        print(f"{LISTENING} http://{host}:{port} (granian)", file=sys.stderr, flush=True)
                        return
                except OSError:
                    pass
                await asyncio.sleep(0.2)

        async def run() -> None:
            server = Server(app, address=host, port=port, interface=Interfaces.ASGI, runtime_threads=1,
                            log_enabled=False)
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
            waiter = asyncio.create_task(ready())
            await server.serve()
            waiter.cancel()

        uvloop.run(run())
        return True

    kiln_server.run_server = granian_run

if "affine" in chosen or nice:
    import threading
    import time

    HELD = ("MainThread", "kiln-tokenize", "kiln-batch-former")

    def hold_python_threads() -> None:
        # Not before the engine sessions exist: OpenVINO reads the CPUs it may use when it compiles, and the model
        # compiles on the main thread (not checked whether it would then see one core; waiting avoids the question).
        while not any(t.name.startswith("kiln-engine-") for t in threading.enumerate()):
            time.sleep(0.2)
        while True:
            for thread in threading.enumerate():
                if thread.name.startswith(HELD) and thread.native_id is not None:
                    try:
                        if "affine" in chosen:
                            os.sched_setaffinity(thread.native_id, {0})
                        if nice:  # Linux: a thread's id as the "process" sets that thread's nice value alone
                            os.setpriority(os.PRIO_PROCESS, thread.native_id, nice[0])
                    except OSError:  # the thread ended meanwhile
                        pass
            time.sleep(1.0)

    threading.Thread(target=hold_python_threads, name="held", daemon=True).start()

from kiln.cli.app import main  # noqa: E402  (after the patches)

sys.argv[0] = "kiln"
main()
