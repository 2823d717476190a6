"""The report's tables as rows of strings, shared by the HTML page and the Markdown file."""

from __future__ import annotations

from typing import Any

Table = tuple[list[str], list[list[str]]]
PYTORCH = "pytorch-fp32"


def _targets(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in data.get("targets") or [] if not t.get("error")}


def summary(data: dict[str, Any]) -> Table:
    """variant | size MB | agreement | task metric | ms/seq | speed-up vs PyTorch fp32 | status."""
    opt = data.get("optimize")
    metric_label = f"task metric ({next(iter((opt or {}).get('reference_metric') or {}), 'none')})"
    header = ["variant", "size MB", "agreement", metric_label, "ms/seq", "speed-up vs PyTorch fp32", "status"]
    rows = []
    if opt:
        ref = opt.get("reference_timing") or {}
        base = ref.get("ms_per_sequence")
        metric_name = next(iter(opt.get("reference_metric") or {}), None)
        rows.append([f"PyTorch fp32 ({ref.get('attention', 'eager')} attention)", "-", "1.0000",
                     _num((opt.get("reference_metric") or {}).get(metric_name)), _num(base, 2), "1.00x", "baseline"])
        for name, v in opt["variants"].items():
            ms = (v.get("timing") or {}).get("ms_per_sequence")
            agreement = v.get("agreement") or {}
            status = (v.get("status") or "accepted") + (" (best)" if name == opt.get("best") else "")
            if v.get("status") == "rejected":
                status += f": {v.get('reason')}"
            rows.append([name, _num((v.get("size_bytes") or 0) / 1e6, 1),
                         f"{agreement.get('primary', '')} {_num(agreement.get('value'))}".strip(),
                         _num((v.get("task_metric") or {}).get(metric_name)), _num(ms, 2),
                         f"{base / ms:.2f}x" if ms and base else "-", status])
        for name, reason in (opt.get("skipped") or {}).items():
            rows.append([name, "-", "-", "-", "-", "-", f"skipped/failed: {reason}"])
    return header, rows


def latency_grid(data: dict[str, Any], name: str) -> Table:
    target = _targets(data)[name]
    lens = sorted({c["seq_len"] for c in target["grid"]})
    sizes = sorted({c["batch_size"] for c in target["grid"]})
    cells = {(c["batch_size"], c["seq_len"]): c for c in target["grid"]}
    header = ["batch \\ tokens", *map(str, lens)]
    rows = [[str(b), *[f"{cells[(b, n)]['ms_per_sequence']:.2f}" if (b, n) in cells else "-" for n in lens]]
            for b in sizes]
    return header, rows


def speedup_grid(data: dict[str, Any], name: str) -> Table | None:
    targets = _targets(data)
    if PYTORCH not in targets or name == PYTORCH:
        return None
    base = {(c["batch_size"], c["seq_len"]): c["median_ms"] for c in targets[PYTORCH]["grid"]}
    mine = {(c["batch_size"], c["seq_len"]): c["median_ms"] for c in targets[name]["grid"]}
    lens = sorted({k[1] for k in mine})
    sizes = sorted({k[0] for k in mine})
    header = ["batch \\ tokens", *map(str, lens)]
    rows = [[str(b), *[f"{base[(b, n)] / mine[(b, n)]:.2f}x" if (b, n) in base and (b, n) in mine else "-"
                       for n in lens]] for b in sizes]
    return header, rows


def targets_table(data: dict[str, Any]) -> Table:
    header = ["engine", "load s", "peak RSS MB", "mix sorted seq/s", "mix unsorted seq/s", "padding eff. sorted",
              "padding eff. unsorted", "speed-up sorted vs PyTorch"]
    targets = data.get("targets") or []
    base = next((t["mix"]["sorted_per_s"] for t in targets if t["name"] == PYTORCH and t.get("mix")), None)
    rows = []
    for t in targets:
        if t.get("error"):
            rows.append([t["name"], *["-"] * 6, f"failed: {t['error']}"])
            continue
        mix = t["mix"]
        rows.append([t["name"], f"{t['load_seconds']:.2f}", f"{t['peak_rss_mb']:.0f}", f"{mix['sorted_per_s']:.1f}",
                     f"{mix['unsorted_per_s']:.1f}", f"{mix['sorted_padding_efficiency']:.2f}",
                     f"{mix['unsorted_padding_efficiency']:.2f}",
                     f"{mix['sorted_per_s'] / base:.2f}x" if base else "-"])
    return header, rows


def sweep_table(data: dict[str, Any]) -> Table | None:
    rows = [[t["name"], str(p["sessions"]), str(p["threads"]), str(p.get("batch_size", "-")),
             str(p.get("pad_multiple", "-")), f"{p['sorted_per_s']:.1f}", f"{p['b1_128_ms']:.2f}"]
            for t in data.get("targets") or [] for p in t.get("sweep") or []]
    if not rows:
        return None
    return ["engine", "sessions (OpenVINO: streams)", "threads each", "batch size", "padded to a multiple of",
            "mix sorted seq/s", "batch-1 ms @128"], rows


def gemm_table(data: dict[str, Any]) -> Table | None:
    """Each variant at 32 x 128 tokens against its weight GEMMs timed alone (kiln/bench/gemm.py)."""
    rows = [[t["name"], f"{g['int8_gemms']}/{g['gemms']}", f"{g['gop_per_sequence']:.2f}",
             f"{g['int8_gops']:.0f}", f"{g['fp32_gops']:.0f}", f"{g['int8_bound_per_s']:.1f}",
             f"{g['own_bound_per_s']:.1f}", f"{g['reached_per_s']:.1f}", f"{100 * g['of_int8_bound']:.0f}%",
             f"{100 * g['of_own_bound']:.0f}%"]
            for t in data.get("targets") or [] if (g := t.get("gemm"))]
    if not rows:
        return None
    return ["engine", "int8 weight GEMMs", "GOP per sequence", "int8 GOP/s", "fp32 GOP/s", "int8 bound seq/s",
            "own bound seq/s", "reached seq/s", "of int8 bound", "of own bound"], rows


GEMM_NOTE = ("The weight GEMMs of each variant's graph, timed alone with ONNX Runtime on the same threads at 32 x "
             "128 tokens: the int8 bound runs every one in int8, the own bound each in the precision the variant "
             "runs it in. Attention scores, LayerNorm and the rest are left out, so a bound is a ceiling; the "
             "fraction reached says what the other work costs.")


def serving_sentence(default: dict[str, Any]) -> str:
    """What the sweep wrote into the artifact, in one sentence (plain text)."""
    return (f"Serving default written to the artifact: {default['sessions']} session(s) x {default['threads']} "
            f"thread(s), batches of {default.get('batch_size', '-')} padded to a multiple of "
            f"{default.get('pad_multiple', '-')} for {default['variant']}; kiln.load and kiln serve use it.")


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
