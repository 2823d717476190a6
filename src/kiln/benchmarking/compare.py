"""`kiln bench --compare OLD NEW`: what got slower or faster beyond noise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ArtifactError, UsageError
from kiln.records.bench import BenchResults, read_results


@dataclass(frozen=True)
class Change:
    target: str
    what: str
    old: float
    new: float
    lower_is_better: bool

    @property
    def ratio(self) -> float:
        return self.new / self.old

    @property
    def better(self) -> bool:
        return (self.ratio < 1) == self.lower_is_better

    def describe(self) -> str:
        word = "faster" if self.better else "slower"
        unit = "ms" if self.lower_is_better else "seq/s"
        return f"{self.target} {self.what}: {self.old:.2f} -> {self.new:.2f} {unit} ({self.ratio:.2f}x, {word})"


def load(path: Path) -> BenchResults:
    """A bench results file (either schema kiln has written), or a UsageError naming the flag."""
    try:
        return read_results(Path(path))
    except ArtifactError as err:
        raise UsageError(f"compare: {err.message}") from err


def compare(old: BenchResults, new: BenchResults, noise: float = 0.10) -> list[Change]:
    """Changes whose ratio exceeds ``noise`` (and the cell's own p90/median spread) in either direction."""
    changes = []
    old_targets = {t.name: t for t in old.targets}
    for target in new.targets:
        before = old_targets.get(target.name)
        if before is None or target.error or before.error:
            continue
        cells = {(c.batch_size, c.seq_len): c for c in before.grid}
        for cell in target.grid:
            prev = cells.get((cell.batch_size, cell.seq_len))
            if prev is None:
                continue
            spread = max(cell.p90_ms / cell.median_ms, prev.p90_ms / prev.median_ms) - 1
            change = Change(target.name, f"batch {cell.batch_size} x {cell.seq_len} tokens", prev.median_ms,
                            cell.median_ms, True)
            if abs(change.ratio - 1) > max(noise, spread):
                changes.append(change)
        generated = {(c.batch_size, c.prompt_tokens): c for c in before.generation}
        for cell in target.generation:  # a decoder's cells: first token and per-token latency
            prev_cell = generated.get((cell.batch_size, cell.prompt_tokens))
            for key, what in (("ttft_ms", "first token"), ("per_token_ms", "per token")) if prev_cell else ():
                change = Change(target.name, f"batch {cell.batch_size} x {cell.prompt_tokens} prompt tokens, {what}",
                                getattr(prev_cell, key), getattr(cell, key), True)
                if abs(change.ratio - 1) > noise:
                    changes.append(change)
        if target.mix and before.mix:
            for key in ("sorted_per_s", "unsorted_per_s"):
                change = Change(target.name, f"length mix {key.split('_')[0]}", getattr(before.mix, key),
                                getattr(target.mix, key), False)
                if abs(change.ratio - 1) > noise:
                    changes.append(change)
    return changes
