"""One in-flight budget for every protocol the server speaks (--max-concurrent).

HTTP's guard (kiln.serving.guard) and the gRPC service (kiln.serving.v2.grpc) take their slots from the same
``Admission``, so together they admit at most the budget: each with its own count of --max-concurrent admitted
twice the budget when both were busy. Both run on the server's one event loop (uvicorn's, where the gRPC server is
started), so the count needs no lock.
"""

from __future__ import annotations

from kiln.serving.metrics import Metrics


class Admission:
    """Slots for inference requests in flight, counted in the ``kiln_inflight_requests`` gauge."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit, self.inflight, self._gauge = limit, 0, metrics.inflight

    def enter(self) -> bool:
        """Take a slot; False (nothing taken) when every slot is in use."""
        if self.inflight >= self.limit:
            return False
        self.inflight += 1
        self._gauge.inc()
        return True

    def leave(self) -> None:
        """Give back a slot ``enter`` took."""
        self.inflight -= 1
        self._gauge.dec()

    @property
    def refusal(self) -> str:
        """Why a request was not admitted (the 429's message, and gRPC's RESOURCE_EXHAUSTED details)."""
        return f"more than {self.limit} requests in flight; retry shortly"
