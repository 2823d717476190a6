"""`kiln serve`: an artifact over HTTP with dynamic batching, probes, metrics and loud failures (kiln/serving)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.choices import Device, LogFormatName, ShadowPolicy


def serve(
    artifact: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Artifact directory to serve (e.g. kiln-out/best). Use --model for several.", show_default=False)] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    model: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--model", help="NAME=ARTIFACT to serve several models; requests pick one with their 'model' field.",
        show_default=False)] = None,
    max_batch_tokens: Annotated[int, typer.Option(
        help="Cap on a batch's padded tokens (longest x count). Below it, kiln groups waiting inputs of similar "
        "length, cutting where padding would cost more than another engine call.", min=16)] = 16384,
    max_batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Most inputs per batch (default: the batch size kiln bench found fastest, from serving.json, else "
        "64).", show_default=False, min=1)] = None,
    max_delay_ms: Annotated[float, typer.Option(
        help="While every engine session is busy, how long the first waiting input may wait for others before the "
        "next batch closes. A request reaching an idle engine runs at once.", min=0)] = 5.0,
    batch_window: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="How many of the oldest waiting requests have their inputs sorted by length and grouped when the next "
        "batch is chosen (the batch always holds the oldest input; default: 32). A wider window pads less; a "
        "narrower one lets fewer later requests overtake an earlier one, which bounds tail latency.",
        show_default=False, min=1)] = None,
    max_memory: Annotated[str, typer.Option(help="Resident memory past which new requests get 503 + Retry-After "
                                            "(before the kernel's OOM killer acts): a size (8GiB, 512MB), auto (90% "
                                            "of the container's cgroup memory limit; none without one) or none.")]
    = "auto",
    max_concurrent: Annotated[int, typer.Option(help="In-flight requests before new ones get 429 + Retry-After.",
                                                min=1)] = 512,
    api_key: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Require 'Authorization: Bearer KEY' (or X-API-Key) on inference routes.", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Engine threads per session (default: the artifact's serving.json from kiln bench, else 1 per "
        "session for one-pass tasks, all usable cores for a decoder).", show_default=False, min=1)] = None,
    device: Annotated[Device, typer.Option(help="Where the engine runs: cpu; cuda: ONNX Runtime's CUDA provider "
                                           "with IOBinding (torch variants on cuda), one session; tensorrt: "
                                           "ONNX Runtime's TensorRT provider. GPUs need onnxruntime-gpu; build "
                                           "GPU variants with kiln optimize --target cuda.")] = Device.CPU,
    sessions: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Engine instances running batches side by side, each on its own thread (default: serving.json, else "
        "one per usable core for one-pass tasks: most throughput under concurrent load, while one request alone "
        "runs on one core; --sessions 1 gives a lone request every core).", show_default=False, min=1)] = None,
    max_inputs_per_request: Annotated[int, typer.Option(
        help="Inputs one request may carry (413 above it): bounds the work and memory a single client can ask "
        "for at once; raise it for bulk clients, lower it to protect latency.", min=1)] = 64,
    access_log: Annotated[bool, typer.Option(help="Log every request (uvicorn's access log, in --log-format). "
                                             "Costs event-loop time at hundreds of requests a second.")] = False,
    log_format: Annotated[LogFormatName, typer.Option(help="text: one readable line per record; json: one JSON "
                                                      "object per line (time, level, logger, message, request_id) "
                                                      "for log collectors.")] = LogFormatName.TEXT,
    restart_loops: Annotated[bool, typer.Option(help="Restart a model's batching (or decoding) loop if it dies. "
                                                "Either way its queued requests get a 500 and the death is logged "
                                                "and counted (kiln_loop_deaths_total); without it /ready stays 503 "
                                                "so an orchestrator replaces the process.")] = False,
    deterministic: Annotated[bool, typer.Option(help="Serve only a variant whose answers kiln optimize measured to be "
                                                "bit-identical whatever shares its batch (alone, sorted or mixed "
                                                "batches): the best one if it is, else the fastest that is; refuse "
                                                "with the measured drift when none is. Dynamic int8 is not.")] = False,
    shadow_rate: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Rerun this share of requests (0 < R <= 1) through the artifact's fp32 reference while the engine "
        "would otherwise idle, and export the live agreement (kiln_shadow_agreement, /kiln/info). Costs CPU when idle, "
        "within --shadow-max-share, and under load that never idles --shadow-min-share.", show_default=False)] = None,
    shadow_max_share: Annotated[float, typer.Option(help="Most of the wall time the shadow reference may run "
                                                    "(it waits past it).")] = 0.10,
    shadow_min_share: Annotated[float, typer.Option(help="Share of the last minute's wall time the shadow reference "
                                                    "runs even when the engine never idles, so the live figure "
                                                    "refreshes under sustained load "
                                                    "(it then shares the CPU with live batches); 0: only when idle.",
                                                    min=0.0, max=1.0)] = 0.02,
    shadow_policy: Annotated[ShadowPolicy, typer.Option(help="log: log when the live agreement falls below the "
                                                        "artifact's gate and when it recovers; unready: also turn "
                                                        "/ready to 503 until it recovers (requests that still "
                                                        "arrive are answered).")] = ShadowPolicy.LOG,
    otlp_endpoint: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="OpenTelemetry collector (OTLP/HTTP, e.g. http://localhost:4318): each request becomes a span with "
        "tokenize, queue, batch, engine and postprocess children (a request's traceparent header joins the "
        "caller's trace). Without it, a global tracer provider (opentelemetry-instrument) gets the spans. Needs pip "
        "install 'kiln[otel]'.",
        show_default=False)] = None,
    protocols: Annotated[str, typer.Option(
        help="The APIs to serve, comma-separated: kiln (its own routes), openai (/v1/embeddings, /v1/completions), "
        "v2 (KServe's Open Inference Protocol: /v2/..., and gRPC with --grpc-port), tei (text-embeddings-inference's "
        "routes), cohere (a reranker's /v1/rerank and /v2/rerank). kiln's own routes are under /kiln/ (/kiln/embed, "
        "/kiln/info, ...) and at their bare path where TEI has none: /embed, /rerank, /embed_sparse and /info answer "
        "TEI's bodies while tei is served.")
    ] = "kiln,openai,v2,tei,cohere",
    grpc_port: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Also serve the v2 protocol over gRPC (inference.GRPCInferenceService) on this port, through the same "
        "batcher and limits. Needs pip install 'kiln[grpc]'.", min=1, max=65535, show_default=False)] = None,
    variant: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        help="Serve this accepted variant of the artifact instead of its best (e.g. onnx-int8-dynamic; kiln info "
        "lists them); with several --model, MODEL=VARIANT for each model it applies to.", show_default=False)] = None,
) -> None:
    """Serve an artifact over HTTP with dynamic batching, Prometheus metrics and backpressure (uvicorn)."""
    from kiln.api.deploy import serve as run_server

    started = run_server(artifact, host=host, port=port, model=model or (), max_batch_tokens=max_batch_tokens,
                         max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, batch_window=batch_window,
                         max_concurrent=max_concurrent, max_memory=max_memory, api_key=api_key, threads=threads,
                         device=device,
                         sessions=sessions, max_inputs_per_request=max_inputs_per_request, access_log=access_log,
                         log_format=log_format, restart_loops=restart_loops, deterministic=deterministic,
                         shadow_rate=shadow_rate, shadow_max_share=shadow_max_share,
                         shadow_min_share=shadow_min_share, shadow_policy=shadow_policy,
                         otlp_endpoint=otlp_endpoint, protocols=protocols, grpc_port=grpc_port,
                         variant=variant)
    if not started:
        raise typer.Exit(1)  # uvicorn has logged why (port in use, a model that failed to load)
