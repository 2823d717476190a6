"""When a sequence stops, and the text it streams: whole characters only, never part of a stop string."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.errors import UsageError

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes half a UTF-8 character to


def eos_ids(eos: int | Sequence[int] | None) -> tuple[int, ...]:
    """A config's ``eos_token_id`` (one id, a list of them, or none) as the ids that end a sequence."""
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


@dataclass(frozen=True)
class Stops:
    max_new_tokens: int = 32
    eos_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be at least 1 (got {self.max_new_tokens})")
        if any(not s for s in self.stop):
            raise UsageError("stop strings must not be empty")


@dataclass
class Detokenizer:
    """The generated text so far, and how much of it may be shown: held back while it ends in half a character
    or in the start of a stop string."""

    decode: Callable[[Sequence[int]], str]
    stops: Stops
    ids: list[int] = field(default_factory=list)
    text: str = ""
    shown: int = 0  # characters of ``text`` already handed out
    finish_reason: str | None = None  # "length" | "stop" (EOS or a stop string)
    eos: int | None = None  # the end-of-sequence token it stopped at (not part of ``ids`` or the text)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The generated ids, the EOS it stopped at included (the text leaves it out)."""
        return (*self.ids, self.eos) if self.eos is not None else tuple(self.ids)

    def add(self, token: int) -> str:
        """Take one generated token; returns the new text that can be shown (may be empty)."""
        if self.finish_reason:
            raise RuntimeError("the sequence has finished")
        if token in self.stops.eos_ids:
            self.finish_reason, self.eos = "stop", token
            return self._release(len(self.text))
        self.ids.append(token)
        self.text = self.decode(self.ids)
        for stop in self.stops.stop:
            at = self.text.find(stop, max(0, self.shown - len(stop)))
            if at >= 0:
                self.text, self.finish_reason = self.text[:at], "stop"
                return self._release(at)
        if len(self.ids) >= self.stops.max_new_tokens:
            self.finish_reason = "length"
            return self._release(len(self.text))
        return self._release(self._safe_end())

    def _safe_end(self) -> int:
        end = len(self.text)
        if self.text.endswith(REPLACEMENT):
            end = len(self.text.rstrip(REPLACEMENT))
        for stop in self.stops.stop:  # the text's end may be where a stop string starts
            for k in range(min(len(stop) - 1, end), 0, -1):
                if self.text[end - k:end] == stop[:k]:
                    end -= k
                    break
        return max(end, self.shown)

    def _release(self, end: int) -> str:
        out = self.text[self.shown:end]
        self.shown = max(self.shown, end)
        return out
