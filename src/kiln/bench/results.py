"""The benchmark's results file: versioned schema, environment, settings, per-target measurements."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kiln.records import to_jsonable

SCHEMA = "kiln.bench/1"


def build(command: str, environment: dict[str, Any], settings: Any, targets: list[Any], *,
          artifact: str | None, model: str | None, task: str, optimize: dict[str, Any] | None,
          serving_default: dict[str, Any] | None) -> dict[str, Any]:
    settings_dict = to_jsonable(settings)
    settings_dict["mix"] = {"texts": len(settings.mix)}
    return {
        "schema": SCHEMA, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command, "environment": environment, "artifact": artifact, "model": model, "task": task,
        "settings": settings_dict, "baseline": "pytorch-fp32",
        "targets": to_jsonable(targets), "optimize": optimize, "serving_default": serving_default,
    }
