"""One in-flight budget for every protocol the server speaks (--max-concurrent), and a memory budget
(--max-memory): past it new work is refused with 503 before the kernel's OOM killer ends the process.

HTTP's guard (kiln.serving.guard) and the gRPC service (kiln.serving.v2.grpc) take their slots from the same
``Admission``, so together they admit at most the budget: each with its own count of --max-concurrent admitted
twice the budget when both were busy. Both run on the server's one event loop (uvicorn's, where the gRPC server is
started), so the count needs no lock.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.serving.metrics import Metrics
from kiln.system.memory import cgroup_memory_limit, parse_bytes, resident_bytes

GIB = 1024**3
# --max-memory auto: this share of the container's limit, so the refusal comes before the kernel's OOM killer does
# (the batches in flight when the budget is crossed still allocate their outputs).
AUTO_SHARE = 0.9


def memory_budget(value: str | int | None) -> int | None:
    """``max_memory`` as bytes: "auto" (90% of the container's cgroup limit, none without one), "none", a size
    ("8GiB") or bytes."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, int):
        return value
    if value.strip().lower() == "auto":
        limit = cgroup_memory_limit()
        return int(limit * AUTO_SHARE) if limit is not None else None
    return parse_bytes(value, "max_memory")


class Admission:
    """Slots for inference requests in flight, counted in the ``kiln_inflight_requests`` gauge."""

    def __init__(self, limit: int, metrics: Metrics, memory: int | None = None,
                 resident: Callable[[], int] = resident_bytes) -> None:
        """``memory``: the most resident bytes at which new work is admitted (None: no budget); ``resident``: how
        the process's resident memory is read."""
        self.limit, self.inflight, self._gauge = limit, 0, metrics.inflight
        self.memory, self._resident = memory, resident
        self.status, self.refusal = 429, ""

    def enter(self) -> bool:
        """Take a slot; False (nothing taken) when every slot is in use (``status`` 429) or the process is over its
        memory budget (503); ``refusal`` says which, with the figures."""
        if self.inflight >= self.limit:
            self.status, self.refusal = 429, f"more than {self.limit} requests in flight; retry shortly"
            return False
        if self.memory is not None and (used := self._resident()) > self.memory:
            self.status, self.refusal = 503, (
                f"memory: the server holds {used / GIB:.2f} GiB, over its --max-memory budget of "
                f"{self.memory / GIB:.2f} GiB; new work waits until what is in flight drains (retry shortly)")
            return False
        self.inflight += 1
        self._gauge.inc()
        return True

    def leave(self) -> None:
        """Give back a slot ``enter`` took."""
        self.inflight -= 1
        self._gauge.dec()

