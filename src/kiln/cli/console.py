"""Terminal output: results on stdout, progress and errors on stderr, quiet when not a TTY."""

from __future__ import annotations

import sys

from rich.console import Console

# Off a terminal rich assumes 80 columns; tables and long result lines stay whole in logs and pipes instead.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def progress(message: str) -> None:
    """One progress line on stderr (shown on a terminal; kept out of pipes and logs of CI)."""
    if err.is_terminal:
        err.print(f"[dim]…[/dim] {message}")
    else:
        err.print(f"... {message}", markup=False)


def print_table(summary) -> None:
    """The optimize result table: variant | size MB | agreement | task metric | ms/seq | speed-up | status."""
    from rich.table import Table

    from kiln.optimizing.outcome import HEADER

    table = Table(title=f"{summary.model} ({summary.task})", title_justify="left")
    for name in HEADER:
        table.add_column(name, overflow="fold")
    for row in summary.rows():
        table.add_row(*row)
    out.print(table)


class _Bar:
    def __init__(self, total: int, label: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[status]}"),
                                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err)
        self._task = self._progress.add_task(label, total=total, status="")
        self._progress.start()

    def advance(self, status: str | None = None) -> None:
        if status is None:
            self._progress.advance(self._task)
        else:
            self._progress.update(self._task, advance=1, status=status)

    def reset(self, label: str, total: int) -> None:
        self._progress.reset(self._task, total=total, description=label)

    def close(self) -> None:
        self._progress.stop()


def progress_bar(total: int, label: str = "benchmark"):
    """A progress bar with ETA on a terminal; nothing (plain progress lines only) in pipes and CI logs."""
    return _Bar(total, label) if err.is_terminal else None
