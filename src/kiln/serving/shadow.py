"""Live agreement: a sample of served inputs rerun through the artifact's fp32 reference while the engine idles.

``kiln serve --shadow-rate R`` marks each request for shadowing with probability R. When its batch has been
answered, the batcher hands the request's encodings and the served outputs to :class:`Shadow`, which keeps at most
``queue`` of them (older ones are dropped and counted: memory stays bounded). Its loop takes a few at a time while
the batcher has nothing queued or running, or, under load that never lets it idle, while it has had less than
``min_share`` of wall time; runs them through the fp32 reference on its own single thread, and compares each
input's served output with the reference's by the task's own per-input figure
(``TaskValidation.live_agreement``: cosine for embeddings, the top label kept for classifiers, the share of tags kept
for token classification, how close a pair's relevance score stays for rerankers). It keeps to ``max_share`` of
wall time: past it, it waits.

A shadow run that has started cannot be pre-empted: a request arriving meanwhile shares the CPU with up to
``BATCH`` reference rows on one thread. ``max_share`` bounds how often that can happen; the load benchmark measures
what it costs.

The rolling window's minimum and mean go to /metrics (``kiln_shadow_agreement{figure="min_<figure>"|"mean_..."}``,
every input's figure to the ``kiln_shadow_input_agreement`` histogram) and /info; for cosines, so does the gate's
bound in its words (``figure="cosine_bound"``, /info's ``bound``: the cosine a log-normal fit puts 99.9% of inputs
like the window's, of each length, at, 95% confidence; reported, not judged: the window's minimum is what the floor
holds live). The
task says which of the two its gate holds (``live_judged``: the least cosine, the mean share of labels kept).
Falling below the artifact's gate floor (1 - its tolerance) is logged, and with ``--shadow-policy unready`` /ready
answers 503 until the window recovers (the inference routes keep answering what still arrives, so the recovery can
be seen).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding

from kiln.choices import ShadowPolicy
from kiln.errors import UsageError
from kiln.log import get_logger
from kiln.runtime.predictor import Predictor
from kiln.serving.metrics import Metrics
from kiln.serving.supervision import OwnedLoop
from kiln.tasks.validation import length_bound

log = get_logger("serve.shadow")
BATCH = 8  # reference rows per shadow run: small, so a live request never waits long behind one
# The span min_share is held over: the share since the server started would let an idle hour's runs (up to
# max_share) starve the next hour of sustained load.
RECENT_S = 60.0


@dataclass(frozen=True)
class ShadowConfig:
    rate: float  # share of requests shadowed, 0 < rate <= 1
    max_share: float = 0.10  # most wall time the reference may run
    policy: ShadowPolicy = ShadowPolicy.LOG
    window: int = 256  # inputs the rolling agreement is taken over
    queue: int = 512  # sampled inputs waiting for an idle engine, at most
    # Wall time the reference runs even while the engine never idles, so the live figure still refreshes under
    # sustained load (a run then shares the CPU with live batches: its cost is in benchmarks/shadow_cost.py).
    min_share: float = 0.02

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1:
            raise UsageError(f"shadow_rate must be in (0, 1] (got {self.rate:g})")
        if not 0 < self.max_share <= 1:
            raise UsageError(f"shadow_max_share must be in (0, 1] (got {self.max_share:g})")
        if not 0 <= self.min_share <= self.max_share:
            raise UsageError(f"shadow_min_share must be between 0 and shadow_max_share {self.max_share:g} (got "
                             f"{self.min_share:g})")
        object.__setattr__(self, "policy", ShadowPolicy(self.policy))

    def sample(self) -> bool:
        return random.random() < self.rate


class Shadow(OwnedLoop):
    kind = "shadow"

    def __init__(self, model: str, reference: Predictor, agreement: Callable[[Any, Any], float],
                 config: ShadowConfig, metrics: Metrics, floor: float, idle: asyncio.Event,
                 on_health: Callable[[bool, str], None] = lambda healthy, reason: None, *, figure: str = "cosine",
                 judged: str = "min") -> None:
        """``agreement(served, reference)``: one input's figure (named ``figure``); ``judged``: which statistic of
        the window the ``floor`` holds, "min" or "mean"."""
        super().__init__()
        self.model, self.reference, self.agreement, self.config = model, reference, agreement, config
        self.figure, self.judged = figure, judged
        self.metrics, self.floor, self.idle, self.on_health = metrics, floor, idle, on_health
        self._waiting: deque[tuple[Encoding, Any]] = deque()
        self._window: deque[float] = deque(maxlen=config.window)
        self._lengths: deque[int] = deque(maxlen=config.window)  # each window item's tokens, for the bound
        self._arrived = asyncio.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-shadow")
        self._started = time.perf_counter()
        self._busy_s = 0.0
        self._last_run_s = 0.0  # the previous reference run's time: the next one is expected to cost as much
        self._recent: deque[tuple[float, float]] = deque()  # (end, seconds) of the runs of the last RECENT_S
        self.items = 0
        self.below = False

    def offer(self, served: Sequence[tuple[Encoding, Any]]) -> None:
        """Served inputs of a sampled request: (encoding, the served reduced output)."""
        for pair in served:
            if len(self._waiting) >= self.config.queue:
                self._waiting.popleft()
                self.metrics.shadow_dropped.labels(self.model, "queue_full").inc()
            self._waiting.append(pair)
        self._arrived.set()

    def summary(self) -> dict[str, Any]:
        """What /info shows."""
        window = list(self._window)
        return {"rate": self.config.rate, "items": self.items, "window": len(window), "figure": self.figure,
                "judged": self.judged, "min": min(window) if window else None,
                "mean": float(np.mean(window)) if window else None, "bound": self._bound(), "floor": self.floor,
                "below_floor": self.below, "cpu_share": self.share(), "policy": self.config.policy.value}

    def share(self) -> float:
        return self._busy_s / max(time.perf_counter() - self._started, 1e-9)

    def recent_share(self) -> float:
        """The share of the last RECENT_S seconds (of the time since start, before that much has passed) the
        reference ran: what min_share is held over."""
        now = time.perf_counter()
        while self._recent and self._recent[0][0] < now - RECENT_S:
            self._recent.popleft()
        return sum(seconds for _, seconds in self._recent) / max(min(RECENT_S, now - self._started), 1e-9)

    async def close(self) -> None:
        self._closing = True
        self._arrived.set()
        self.idle.set()
        await self._join()
        self._thread.shutdown(wait=True)

    def fail_pending(self, err: Exception) -> None:
        self._waiting.clear()  # no request waits on the shadow: its samples are simply not measured

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            if not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if not await self._turn():
                continue
            over = (self._busy_s + self._last_run_s) / self.config.max_share - (time.perf_counter() - self._started)
            if over > 0:  # the next run would take it past its share of wall time: wait until it would not
                await asyncio.sleep(min(over, 1.0))
                continue
            if self._closing:
                return
            taken = [self._waiting.popleft() for _ in range(min(BATCH, len(self._waiting)))]
            start = time.perf_counter()
            reference = await loop.run_in_executor(self._thread, self.reference.run_features,
                                                   [e for e, _ in taken])
            self._last_run_s = time.perf_counter() - start
            self._busy_s += self._last_run_s
            self._recent.append((time.perf_counter(), self._last_run_s))
            self._record([self.agreement(s, r) for (_, s), r in zip(taken, reference)], [len(e.ids) for e, _ in taken])

    async def _turn(self) -> bool:
        """Whether the reference may run now: the engine idles, or the reference has had less than its guaranteed
        ``min_share`` of the recent wall time (which falls while it waits, so a loop that never idles still gets its
        share, whatever it ran while idle before)."""
        if self.idle.is_set() or self.recent_share() < self.config.min_share:
            return True
        try:
            await asyncio.wait_for(self.idle.wait(), timeout=0.25)
        except TimeoutError:
            return False
        return True

    def _bound(self) -> float | None:
        """The gate's bound over the window (cosines only; None until a length has enough inputs)."""
        if self.figure != "cosine":
            return None
        return length_bound(np.array(self._window), list(self._lengths))

    def _record(self, values: list[float], lengths: list[int]) -> None:
        for value in values:
            self.metrics.shadow_input.labels(self.model, self.figure).observe(value)
        self._window.extend(values)
        self._lengths.extend(lengths)
        self.items += len(values)
        self.metrics.shadow_items.labels(self.model).inc(len(values))
        low, mean = min(self._window), float(np.mean(self._window))
        self.metrics.shadow_agreement.labels(self.model, f"min_{self.figure}").set(low)
        self.metrics.shadow_agreement.labels(self.model, f"mean_{self.figure}").set(mean)
        bound = self._bound()
        if bound is not None:
            self.metrics.shadow_agreement.labels(self.model, "cosine_bound").set(bound)
        self.metrics.shadow_share.labels(self.model).set(self.share())
        judged = low if self.judged == "min" else mean
        below = judged < self.floor
        if below != self.below:
            self.below = below
            measured = f"{self.judged} {self.figure} {judged:.4f}"
            reason = (f"live agreement of model {self.model!r} fell below its gate: {measured} < {self.floor:.4f} "
                      f"over the last {len(self._window)} shadowed inputs")
            if below:
                log.warning("%s", reason)
            else:
                log.info("live agreement of model %r is back within its gate (%s >= %.4f)", self.model, measured,
                         self.floor)
            self.on_health(not below, reason)
