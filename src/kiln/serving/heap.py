"""The server's garbage collector, settled once every model is loaded: what is alive then stays alive.

Measured on `kiln serve` under 64 closed-loop clients (a tiny random BERT, so the server's own Python dominates;
2-core EPYC, 2026-11-27): with CPython's default thresholds (700, 10, 10) the collector ran ~1,060 young
collections, ~96 middle and 8 full ones over ~6,400 requests, 0.69 s in all (~95 us per request, ~15% of the event
loop thread's samples in py-spy), each full collection ~47 ms with every request waiting on it. A request makes
hundreds of short-lived objects, nearly all freed by reference counting; the collector's passes mostly re-walk the
~64 requests in flight and the loaded server. Freezing what exists after warm-up (``gc.freeze``: the models,
tokenizers, modules) takes it out of every later pass, and a young threshold of ``YOUNG_THRESHOLD`` runs the young
pass far less often over the same live set: 17 young, 1 middle and no full collections, 0.06 s, in the same run.

Called by the server process (kiln.serving.server) once uvicorn's startup has run the app's lifespan: it changes the
whole interpreter's collector, so an app served in-process (tests, an embedding program) keeps its own.
"""

from __future__ import annotations

import gc

from kiln.log import get_logger

# Cyclic garbage still gets collected, only in larger steps: a young pass now waits for this many net
# allocations of container objects (a request's few hundred, tens of requests) instead of 700.
YOUNG_THRESHOLD = 10_000
log = get_logger("serve.heap")


def settle_heap() -> None:
    """Collect once, freeze every surviving object, and raise the young generation's threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    log.debug("garbage collector: %d objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold())
