"""The task settings an artifact carries, so serving needs neither torch nor transformers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kiln.choices import Pooling, TaskName


@dataclass(frozen=True)
class TaskConfig:
    task: TaskName
    max_length: int
    pooling: Pooling = Pooling.MEAN
    normalize: bool = False
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["task"] = self.task.value
        raw["pooling"] = self.pooling.value
        raw["id2label"] = {str(k): v for k, v in self.id2label.items()}
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TaskConfig:
        return cls(
            task=TaskName(raw["task"]),
            max_length=int(raw["max_length"]),
            pooling=Pooling(raw.get("pooling", "mean")),
            normalize=bool(raw.get("normalize", False)),
            id2label={int(k): v for k, v in raw.get("id2label", {}).items()},
            problem_type=raw.get("problem_type"),
        )
