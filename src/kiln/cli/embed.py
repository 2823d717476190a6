"""`kiln embed`: a whole corpus through an embedding artifact into Parquet parts (kiln/bulk)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.cli import console
from kiln.cli.options import ForceOpt


def embed(
    artifact: Annotated[Path, typer.Argument(help="An embedding artifact (kiln optimize / kiln export output).")],
    input: Annotated[Path, typer.Argument(help="The corpus: .jsonl, .csv or .parquet with a text column.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory of Parquet parts part-00000.parquet, … "
                                         "with columns id and vector, in input order.")],
    text_field: Annotated[str, typer.Option(help="The column that holds the texts.")] = "text",
    id_field: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="The column whose values become the id column (default: the row number, from 0).",
        show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Keep the finished parts of an interrupted run of the "
                                         "same job and make the rest.")] = False,
    rows_per_part: Annotated[int, typer.Option(help="Rows per Parquet part: a killed job loses at most one part's "
                                               "work; smaller parts mean more files.", min=1)] = 10_000,
    window: Annotated[int, typer.Option(help="Texts sorted by length together before batching: bigger windows "
                                        "pad less; each window is one unit of work on Ray.", min=1)] = 1024,
    variant: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Which variant of the artifact (default: its best).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Threads per engine session (per Ray actor). Default: serving.json from kiln bench, else all cores.",
        show_default=False, min=1)] = None,
    ray: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--ray", help="Run on Ray Data: a cluster address (auto, ray://host:10001) or local to start Ray here. "
        "Needs pip install 'kiln[ray]'.", show_default=False)] = None,
    actors: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Ray actors, one predictor each (default: the cluster's CPUs / --threads).", show_default=False,
        min=1)] = None,
    precision: Annotated[str, typer.Option(
        help="The stored vectors' precision: float32, int8, uint8 (per-dimension buckets from the artifact's "
        "calibration, kiln optimize stores it), binary, ubinary (one bit per dimension, packed): sentence-"
        "transformers' quantize_embeddings. Parquet columns of float32, int8 or uint8.")] = "float32",
    force: ForceOpt = False,
) -> None:
    """Embed every text of INPUT into ordered Parquet parts; --resume finishes a killed run, --ray scales out."""
    from kiln.api.deploy import embed as run_embed

    report = _Progress()
    try:
        summary = run_embed(artifact, input, output=output, text_field=text_field, id_field=id_field, resume=resume,
                            rows_per_part=rows_per_part, window=window, variant=variant, threads=threads, ray=ray,
                            actors=actors, precision=precision, overwrite=force, progress=report)
    finally:
        report.close()
    kept = f", {summary.parts_kept} kept from the interrupted run" if summary.parts_kept else ""
    console.out.print(f"{summary.rows} texts in {summary.parts} parts{kept}: {summary.rows_embedded} embedded in "
                      f"{summary.seconds:.1f} s ({summary.texts_per_second:.1f} texts/s) -> "
                      f"{output.expanduser().resolve()}")


class _Progress:
    """A bar with texts/s and ETA on a terminal; a line per tenth of the corpus in pipes and CI logs."""

    def __init__(self) -> None:
        self._bar = None
        self._task = None
        self._start = time.perf_counter()
        self._first: int | None = None
        self._next_line = 0.0

    def __call__(self, done: int, total: int) -> None:
        if self._first is None:
            self._first, self._start = done, time.perf_counter()  # rate counts this run's texts only
        rate = (done - self._first) / max(time.perf_counter() - self._start, 1e-9)
        if console.err.is_terminal:
            if self._bar is None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self._bar = Progress(TextColumn("embedding"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                     console=console.err)
                self._task = self._bar.add_task("embed", total=total, rate="")
                self._bar.start()
            self._bar.update(self._task, completed=done, rate=f"{rate:.1f} texts/s")
        elif done >= self._next_line * total or done == total:
            remaining = (total - done) / rate if rate > 0 else float("nan")
            console.progress(f"embedded {done}/{total} ({rate:.1f} texts/s, ETA {remaining:.0f} s)")
            self._next_line = done / total + 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
