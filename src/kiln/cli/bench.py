"""`kiln bench`: latency grid, length mix, memory, load time and the serving sweep, each engine in its own process
(kiln/benchmarking)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.cli import console
from kiln.cli.options import DEFAULT_TASK_OPT, int_list, name_list
from kiln.tasks import TaskName


def bench(
    target: Annotated[Optional[str], typer.Argument(  # noqa: UP045
        help="Artifact directory (from kiln optimize/export), or a model directory to time PyTorch alone. "
        "Omit it for the bundled MiniLM.", show_default=False)] = None,
    task: Annotated[TaskName, typer.Option("--task", "-t", help="For a model directory: the task to time it for "
                                           "(an artifact knows its own).")] = DEFAULT_TASK_OPT,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where results.json, report.html and report.md "
                                         "go.")] = Path("kiln-bench"),
    variants: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Comma-separated variants of the artifact to time, or 'all' (every accepted one). Default: best; "
        "for a decoder every variant built (fp32 against int8, accepted or not).", show_default=False)] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Batch sizes of the latency grid [default: 1,2,4,8,16,32,64; decoders: 1,4].",
        show_default=False)] = None,
    seq_lens: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Sequence lengths of the grid [default: 16,32,64,128,256,512]; longer than the model's maximum "
        "are skipped. Decoders: prompt lengths [default: 4,16,64,128,256,512], each generating 32 tokens; "
        "a prompt that leaves no room for them in the window is skipped.", show_default=False)] = None,
    texts: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Your texts, one per line, for the length-mix throughput (sorted and unsorted).",
        show_default=False)] = None,
    lengths: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Token lengths, one per line, to build the length mix from (when texts are private).",
        show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Intra-op threads for the grid and mix (default: usable cores). The thread sweep tries others.",
        show_default=False)] = None,
    quick: Annotated[bool, typer.Option(help="A small grid (1,8,32 x 16,128), 128 texts, no sweep: under a "
                                        "minute on MiniLM; for a first look, not for decisions.")] = False,
    sweep: Annotated[bool, typer.Option(help="Sweep intra-op threads, sessions x threads (OpenVINO: streams) and "
                                        "batch size (16, 32), then padding multiples (1, 8, 16, 32) at the best "
                                        "point; the best is written into the artifact as its serving default, "
                                        "which kiln.load and kiln serve use.")] = True,
    compare: Annotated[Optional[tuple[Path, Path]], typer.Option(  # noqa: UP045
        help="OLD.json NEW.json: print what got slower or faster beyond noise (10% or the cell's p90 spread), "
        "then exit.", show_default=False)] = None,
) -> None:
    """Latency grid (batch sizes x lengths), length-mix throughput, memory, load time and a thread sweep,
    for the chosen variants and the PyTorch fp32 baseline, each in its own process, in one run. For a decoder:
    time to first token and per-token latency (32 new tokens) per batch size x prompt length."""
    from kiln.api.measure import bench as run_bench
    from kiln.api.measure import compare_results

    if compare is not None:
        changes = compare_results(*compare)
        for change in changes:
            console.out.print(change.describe(), markup=False)
        if not changes:
            console.out.print("no change beyond noise")
        return
    results = run_bench(target, task=task.value, output=output, variants=name_list(variants) or None,
                        batch_sizes=int_list(batch_sizes, "--batch-sizes"), seq_lens=int_list(seq_lens, "--seq-lens"),
                        texts=texts, lengths=lengths, threads=threads, quick=quick, sweep=sweep,
                        progress=console.progress, progress_bar=console.progress_bar)
    out = output.expanduser().resolve()
    for t in results.targets:
        loaded = f"{t.name:<28} load {t.load_seconds:.2f}s  peak RSS {t.peak_rss_mb:.0f} MB  "
        if t.generation:
            first = t.generation[0]
            console.out.print(f"{loaded}batch {first.batch_size} x {first.prompt_tokens} prompt tokens: first token "
                              f"{first.ttft_ms:.1f} ms, then {first.per_token_ms:.1f} ms per token")
        elif t.mix:
            console.out.print(f"{loaded}mix sorted {t.mix.sorted_per_s:.1f} seq/s, unsorted "
                              f"{t.mix.unsorted_per_s:.1f} seq/s")
        else:
            console.out.print(f"{t.name:<28} FAILED: {t.error}")
    console.out.print(f"report: {out / 'report.html'} (report.md, results.json beside it)")
