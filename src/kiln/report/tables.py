"""The report's tables as rows of strings, shared by the HTML page and the Markdown file."""

from __future__ import annotations

import math

from kiln.records.artifact import Status
from kiln.records.bench import BenchResults, ServingRecord, TargetResult

Table = tuple[list[str], list[list[str]]]
PYTORCH = "pytorch-fp32"


def _targets(data: BenchResults) -> dict[str, TargetResult]:
    return {t.name: t for t in data.targets if not t.error}


def summary(data: BenchResults) -> Table:
    """variant | size MB | agreement | task metric | ms/seq | speed-up vs PyTorch fp32 | status."""
    opt = data.optimize
    metric_name = next(iter(opt.reference_metric or {}), None) if opt else None
    header = ["variant", "size MB", "agreement (worst batching)", "batch drift",
              f"task metric ({metric_name or 'none'})", "ms/seq", "speed-up vs PyTorch fp32", "status"]
    rows: list[list[str]] = []
    if opt is None:
        return header, rows
    ref = opt.reference_timing
    base = ref.ms_per_sequence if ref else None
    rows.append([f"PyTorch fp32 ({ref.attention if ref else 'eager'} attention)", "-", "1.0000", "-",
                 _num((opt.reference_metric or {}).get(metric_name)), _num(base, 2), "1.00x", "baseline"])
    for name, v in opt.variants.items():
        ms = v.timing.ms_per_sequence if v.timing else None
        status = v.status.value + (" (best)" if name == opt.best else "")
        if v.status is Status.REJECTED:
            status += f": {v.reason}"
        agreement = f"{v.agreement.primary} {_num(v.agreement.value)}" if v.agreement else ""
        if v.batched and v.batched.worst != "sorted":
            agreement += f" ({v.batched.worst})"
        drift = v.batched.drift.describe() if v.batched else "-"
        rows.append([name, _num(v.size_bytes / 1e6, 1), agreement, drift, _num((v.task_metric or {}).get(metric_name)),
                     _num(ms, 2), f"{base / ms:.2f}x" if ms and base else "-", status])
    for name, reason in opt.skipped.items():
        rows.append([name, "-", "-", "-", "-", "-", "-", f"skipped/failed: {reason}"])
    return header, rows


DRIFT_NOTE = ("Agreement is measured with the agreement inputs in length-sorted batches, in mixed-length batches in "
              "arrival order, one at a time, and spread over two one-thread sessions side by side, as a server may "
              "run them; the gate judges the worst of these (named when it is not the sorted one). Batch drift: how "
              "far one input's output moves between those batchings; batch-invariant variants answer bit-identically "
              "whatever shares their batch (kiln serve --deterministic serves only those).")


def invariant_sentence(data: BenchResults) -> str:
    """Which variants answer the same whatever the batch (plain text; empty without kiln optimize's figures)."""
    opt = data.optimize
    if opt is None or not any(v.batched for v in opt.variants.values()):
        return ""
    invariant = [n for n, v in opt.variants.items() if v.batched and v.batched.drift.invariant]
    drifting = [n for n, v in opt.variants.items() if v.batched and not v.batched.drift.invariant]
    return (f"Batch-invariant: {', '.join(invariant) or 'none'}. Drifting with the batch: "
            f"{', '.join(drifting) or 'none'}.")


def latency_grid(data: BenchResults, name: str) -> Table:
    target = _targets(data)[name]
    lens = sorted({c.seq_len for c in target.grid})
    sizes = sorted({c.batch_size for c in target.grid})
    cells = {(c.batch_size, c.seq_len): c for c in target.grid}
    header = ["batch \\ tokens", *map(str, lens)]
    rows = [[str(b), *[f"{cells[(b, n)].ms_per_sequence:.2f}" if (b, n) in cells else "-" for n in lens]]
            for b in sizes]
    return header, rows


def speedup_grid(data: BenchResults, name: str) -> Table | None:
    targets = _targets(data)
    if PYTORCH not in targets or name == PYTORCH:
        return None
    base = {(c.batch_size, c.seq_len): c.median_ms for c in targets[PYTORCH].grid}
    mine = {(c.batch_size, c.seq_len): c.median_ms for c in targets[name].grid}
    lens = sorted({k[1] for k in mine})
    sizes = sorted({k[0] for k in mine})
    header = ["batch \\ tokens", *map(str, lens)]
    rows = [[str(b), *[f"{base[(b, n)] / mine[(b, n)]:.2f}x" if (b, n) in base and (b, n) in mine else "-"
                       for n in lens]] for b in sizes]
    return header, rows


def targets_title(data: BenchResults) -> str:
    return "Engines on the length mix" if any(t.mix for t in data.targets) else "Engines"


def targets_table(data: BenchResults) -> Table:
    """Load time and memory per engine, then its length-mix figures (a decoder's bench has no mix: status)."""
    has_mix = any(t.mix for t in data.targets)
    header = ["engine", "load s", "peak RSS MB"]
    header += ["mix sorted seq/s", "mix unsorted seq/s", "padding eff. sorted", "padding eff. unsorted",
               "speed-up sorted vs PyTorch"] if has_mix else ["status"]
    base = next((t.mix.sorted_per_s for t in data.targets if t.name == PYTORCH and t.mix), None)
    rows = []
    for t in data.targets:
        if t.error:
            rows.append([t.name, *["-"] * (len(header) - 2), f"failed: {t.error}"])
            continue
        mix = t.mix
        figures = [f"{mix.sorted_per_s:.1f}", f"{mix.unsorted_per_s:.1f}", f"{mix.sorted_padding_efficiency:.2f}",
                   f"{mix.unsorted_padding_efficiency:.2f}",
                   f"{mix.sorted_per_s / base:.2f}x" if base else "-"] if mix else ["-"] * 5
        rows.append([t.name, f"{t.load_seconds:.2f}", f"{t.peak_rss_mb:.0f}", *(figures if has_mix else ["timed"])])
    return header, rows


def sweep_table(data: BenchResults) -> Table | None:
    rows = [[t.name, str(p.sessions), str(p.threads), str(p.batch_size), str(p.pad_multiple), f"{p.sorted_per_s:.1f}",
             f"{p.b1_128_ms:.2f}"] for t in data.targets for p in t.sweep]
    if not rows:
        return None
    return ["engine", "sessions (OpenVINO: streams)", "threads each", "batch size", "padded to a multiple of",
            "mix sorted seq/s", "batch-1 ms @128"], rows


def gemm_table(data: BenchResults) -> Table | None:
    """Each variant at 32 x 128 tokens against its weight GEMMs timed alone (kiln/benchmarking/gemm.py)."""
    gemms = [(t.name, g) for t in data.targets if (g := t.gemm)]
    if not gemms:
        return None
    bf16 = any(g.bf16_gops is not None for _, g in gemms)  # a column only where the CPU has native bf16

    def rate(value: float | None) -> list[str]:
        return [f"{value:.0f}" if value is not None else "-"] if bf16 else []

    rows = [[name, f"{g.int8_gemms}/{g.gemms}", f"{g.gop_per_sequence:.2f}", f"{g.int8_gops:.0f}",
             f"{g.fp32_gops:.0f}", *rate(g.bf16_gops), f"{g.int8_bound_per_s:.1f}",
             *([f"{g.best_bound_per_s:.1f} ({g.best_precision})"] if bf16 else []), f"{g.own_bound_per_s:.1f}",
             f"{g.reached_per_s:.1f}" + (f" ({g.reached_as})" if g.reached_as else ""), f"{100 * g.of_int8_bound:.0f}%",
             *([f"{100 * g.of_best_bound:.0f}%"] if bf16 else []), f"{100 * g.of_own_bound:.0f}%"]
            for name, g in gemms]
    return ["engine", "int8 weight GEMMs", "GOP per sequence", "int8 GOP/s", "fp32 GOP/s",
            *(["bf16 GOP/s"] if bf16 else []), "int8 bound seq/s", *(["best bound seq/s"] if bf16 else []),
            "own bound seq/s", "reached seq/s", "of int8 bound", *(["of best bound"] if bf16 else []),
            "of own bound"], rows


GEMM_NOTE = ("The weight GEMMs of each variant's graph, timed alone on the same threads at 32 x 128 tokens (ONNX "
             "Runtime for int8 and fp32; OpenVINO for bf16, where the CPU has native bf16): the int8 bound runs every "
             "one in int8, the best bound in whichever of int8 and bf16 is faster on this CPU (bf16 on AMX), the own "
             "bound each in the precision the variant runs it in. Attention scores, LayerNorm and the rest are left "
             "out, so a bound is a ceiling; the fraction reached says what the other work costs. Both sides are "
             "fastest runs: the variant is timed before and after its GEMMs, as one session of all threads and, "
             "where kiln.load splits the cores (OpenVINO), as the streams its throughput hint picks, each on its "
             "own batch (sessions x threads in brackets: the faster); the GEMMs are timed both ways too, and the "
             "faster bounds.")


def serving_sentence(default: ServingRecord) -> str:
    """What the sweep wrote into the artifact, in one sentence (plain text)."""
    return (f"Serving default written to the artifact: {default.sessions} session(s) x {default.threads} "
            f"thread(s), batches of {default.batch_size} padded to a multiple of {default.pad_multiple} for "
            f"{default.variant}; kiln.load and kiln serve use it.")


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _generation_targets(data: BenchResults) -> dict[str, TargetResult]:
    return {name: t for name, t in _targets(data).items() if t.generation}


def _gated_name(data: BenchResults, name: str) -> str:
    """A variant's name with its gate status from kiln optimize (a decoder's bench times rejected ones too)."""
    variant = data.optimize.variants.get(name) if data.optimize else None
    return f"{name} ({variant.status.value})" if variant else name


def generation_table(data: BenchResults) -> Table | None:
    """Per batch size x prompt length, each target's "time to first token / per-token" latency in ms."""
    targets = _generation_targets(data)
    if not targets:
        return None
    cells = {name: {(c.batch_size, c.prompt_tokens): c for c in t.generation} for name, t in targets.items()}
    keys = sorted({k for by_key in cells.values() for k in by_key})
    rows = [[str(b), str(n), *[f"{_ms(c.ttft_ms)} / {_ms(c.per_token_ms)}" if (c := cells[name].get((b, n)))
                               else "-" for name in targets]] for b, n in keys]
    return ["batch", "prompt tokens", *[_gated_name(data, name) for name in targets]], rows


def generation_speedup(data: BenchResults) -> Table | None:
    """Each variant's "first token / per token" speed-up over the PyTorch fp32 step graph, cell by cell."""
    targets = _generation_targets(data)
    if PYTORCH not in targets or len(targets) < 2:
        return None
    cells = {name: {(c.batch_size, c.prompt_tokens): c for c in t.generation} for name, t in targets.items()}
    base = cells.pop(PYTORCH)
    rows = [[str(b), str(n), *[f"{ref.ttft_ms / c.ttft_ms:.2f}x / {ref.per_token_ms / c.per_token_ms:.2f}x"
                               if (c := cells[name].get((b, n))) else "-" for name in cells]]
            for (b, n), ref in sorted(base.items())]
    return ["batch", "prompt tokens", *[_gated_name(data, name) for name in cells]], rows


def generation_note(data: BenchResults) -> str:
    """How the decoder cells were measured, and which int8 kernels this CPU has (plain text)."""
    new_tokens = data.settings.new_tokens if data.settings else 32
    runs = data.settings.generation_runs if data.settings else "?"
    skipped = sorted({(s.seq_len, s.reason) for t in data.targets for s in t.skipped_cells})
    return " ".join(filter(None, [
        f"Each cell: time to first token (the prefill of the whole batch and its first token) / per-token latency "
        f"(the mean of the next {new_tokens - 1} single-token steps), ms, median of {runs} greedy runs making "
        f"{new_tokens} new tokens per row (EOS ignored) on prompts of real text; kiln's own decoding loop, the KV "
        "cache kept in the runtime (ONNX Runtime IOBinding; OpenVINO shares each step's output memory with the "
        "next). PyTorch fp32 runs the same step graph eagerly.",
        "Skipped: " + "; ".join(reason for _, reason in skipped) + "." if skipped else ""]))


def _ms(value: float) -> str:
    """Three significant figures, trailing zeros kept: 0.300, 22.3, 836 (whole milliseconds from 100 on)."""
    digits = max(0, 2 - math.floor(math.log10(value))) if value > 0 else 2
    return f"{value:.{digits}f}"


STORED_NOTE = ("Recall@10 of the full-size float32 neighbours of 100 held-out documentation sentences among "
               "~980 others, exact search in numpy on the building machine. int8/uint8 are searched decoded with the "
               "artifact's per-dimension ranges; their raw inner product is shown as the easy mistake. Binary "
               "rescoring reads the candidates' int8 vectors from disk (memory counts the binary index only). NDCG@10, "
               "where shown, ranks all texts of the --eval judgements (query, text, relevance) for each query. kiln "
               "serve refuses a rejected size and precision with a 422.")
TOKEN_NOTE = ("Late interaction: recall@10 of the float32 MaxSim neighbours of 100 held-out documentation sentences "
              "(encoded as queries, kept float32 as ColBERT keeps its queries) among ~980 others stored as token "
              "vectors at each precision, exact MaxSim in numpy on the building machine; bytes are per token vector. "
              "int8/uint8 are decoded with the artifact's per-dimension ranges, binary/ubinary read as -1/+1 per bit. "
              "NDCG@10, where shown, ranks all texts of the --eval judgements for each query. kiln serve refuses a "
              "rejected precision with a 422.")


def stored_note(rows: tuple) -> str:
    """What the stored-vectors table measured: single vectors, or a late-interaction model's token vectors."""
    return TOKEN_NOTE if rows and rows[0].search.startswith("maxsim") else STORED_NOTE


def stored_vectors_table(rows: tuple, tolerance: float | None) -> Table | None:
    """The retrieval cost of each stored (size, precision), from kiln optimize --precisions."""
    if not rows:
        return None
    floor = f" (>= {1 - tolerance:.2f})" if tolerance is not None else ""
    judged = any(r.ndcg_at_10 is not None for r in rows)  # the user's --eval judgements: one more column
    header = ["dimensions", "precision", "search", f"recall@10{floor}",
              *([f"NDCG@10 (within {tolerance:g} of float32)" if tolerance is not None else "NDCG@10"]
                if judged else []),
              "bytes/vector", "MiB per million", "queries/s", "status"]
    return header, [[str(r.dimensions), r.precision, r.search, f"{r.recall_at_10:.3f}",
                     *([f"{r.ndcg_at_10:.3f}" if r.ndcg_at_10 is not None else "-"] if judged else []),
                     str(r.bytes_per_vector), f"{r.mib_per_million:,.0f}", f"{r.queries_per_s:,.0f}",
                     "accepted" if r.accepted else "rejected"] for r in rows]
