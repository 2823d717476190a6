"""Prometheus metrics of one server (its own registry, so several apps in one process stay apart)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The exit line logged after a drain: + "%d inference requests, by status: {json}" (read by kiln.serving.process).
STOPPED = "kiln: stopped after"
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kiln_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.rejections = Counter("kiln_rejections", "Requests refused before inference", ["reason"], registry=r)
        self.inflight = Gauge("kiln_inflight_requests", "Inference requests being handled", registry=r)
        self.queue_seconds = Histogram("kiln_queue_seconds", "Wait of a batch's oldest input", buckets=_LATENCY,
                                       registry=r)
        self.tokenize_seconds = Histogram("kiln_tokenize_seconds", "Tokenization time per request",
                                          buckets=_LATENCY, registry=r)
        self.inference_seconds = Histogram("kiln_inference_seconds", "Engine time per batch", buckets=_LATENCY,
                                           registry=r)
        self.batch_size = Histogram("kiln_batch_size", "Inputs per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                                    registry=r)
        self.loop_deaths = Counter("kiln_loop_deaths", "Batcher or decode loops that died (their queued requests "
                                   "got a 500)", ["model", "loop"], registry=r)
        self.loop_restarts = Counter("kiln_loop_restarts", "Dead loops restarted (--restart-loops)", ["model", "loop"],
                                     registry=r)
        self.model_ready = Gauge("kiln_model_ready", "1 while the model answers requests, 0 while loading or after "
                                 "its loop died", ["model"], registry=r)
        self.shadow_input = Histogram("kiln_shadow_input_agreement", "A shadowed input's figure against the fp32 "
                                      "reference (the task's: cosine, label or tag agreement, score agreement)",
                                      ["model", "figure"], registry=r,
                                      buckets=(0.0, 0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 0.999999, 1.0))
        self.shadow_agreement = Gauge("kiln_shadow_agreement", "Live agreement with the fp32 reference over the "
                                      "rolling window of shadowed inputs", ["model", "figure"], registry=r)
        self.shadow_items = Counter("kiln_shadow_items", "Inputs rerun through the fp32 reference", ["model"],
                                    registry=r)
        self.shadow_dropped = Counter("kiln_shadow_dropped", "Sampled inputs not measured", ["model", "reason"],
                                      registry=r)
        self.shadow_share = Gauge("kiln_shadow_cpu_share", "Share of wall time the reference has run", ["model"],
                                  registry=r)
        self.batch_tokens = Histogram("kiln_batch_tokens", "Padded tokens per batch (longest x count)",
                                      buckets=(64, 256, 1024, 4096, 8192, 16384, 32768), registry=r)

    def status_counts(self) -> dict[str, int]:
        """Inference-route requests by HTTP status since start (every route summed)."""
        counts: dict[str, int] = {}
        for metric in self.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    status = sample.labels["status"]
                    counts[status] = counts.get(status, 0) + int(sample.value)
        return counts
