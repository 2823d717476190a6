"""Terminal output: results on stdout, progress and errors on stderr, quiet when not a TTY."""

from __future__ import annotations

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)  # long result lines stay whole in logs and pipes
err = Console(stderr=True, highlight=False, soft_wrap=True)


def progress(message: str) -> None:
    """One progress line on stderr (shown on a terminal; kept out of pipes and logs of CI)."""
    if err.is_terminal:
        err.print(f"[dim]…[/dim] {message}")
    else:
        err.print(f"... {message}", markup=False)
