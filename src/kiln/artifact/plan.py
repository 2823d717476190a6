"""How a variant runs: engine options, sessions side by side, batch size and padding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln.engines import EngineOptions
from kiln.errors import UsageError

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class ServingPlan:
    """How a variant runs: engine options (threads per session), sessions side by side, batch size, padding."""

    options: EngineOptions
    sessions: int | None = 1  # None: as many as the runtime's throughput hint picks (OpenVINO streams)
    batch_size: int = 32
    pad_multiple: int | None = None  # None: the engine's own
    # With several sessions: a call that makes one batch runs it on one more session of this many threads
    solo_threads: int | None = None

    def __post_init__(self) -> None:
        sessions = 1 if self.sessions is None else self.sessions
        for flag, value in (("sessions", sessions), ("batch size", self.batch_size),
                            ("pad multiple", self.pad_multiple or 1)):
            if value < 1:
                raise UsageError(f"{flag} must be at least 1 (got {value})")
