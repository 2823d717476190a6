"""The report's input built from an artifact manifest (what kiln optimize recorded per variant)."""

from __future__ import annotations

from typing import Any


def optimize_section(manifest) -> dict[str, Any]:
    """What kiln optimize recorded per variant, for the report's summary table."""
    extra = manifest.extra
    return {
        "best": extra.get("best"), "tolerance": extra.get("tolerance"), "reference_timing":
        extra.get("reference_timing"), "reference_metric": extra.get("reference_metric"),
        "skipped": extra.get("skipped", {}),
        "variants": {name: {k: r.get(k) for k in ("status", "reason", "agreement", "task_metric", "timing",
                                                  "size_bytes")} for name, r in manifest.variants.items()},
    }
