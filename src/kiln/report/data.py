"""The report's input built from an artifact manifest (what kiln optimize recorded per variant)."""

from __future__ import annotations

from typing import Any


def optimize_section(manifest) -> dict[str, Any] | None:
    """What kiln optimize recorded per variant, for the report's summary table (None for a plain export)."""
    if not any("status" in record for record in manifest.variants.values()):
        return None
    extra = manifest.extra
    return {
        "best": extra.get("best"), "tolerance": extra.get("tolerance"), "reference_timing":
        extra.get("reference_timing"), "reference_metric": extra.get("reference_metric"),
        "skipped": extra.get("skipped", {}), "calibration": extra.get("calibration"),
        "reference": (extra.get("reference") or {}).get("model"),
        "variants": {name: {k: r.get(k) for k in ("status", "reason", "agreement", "task_metric", "timing",
                                                  "size_bytes")} for name, r in manifest.variants.items()},
    }
