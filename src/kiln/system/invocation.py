"""The command line a report or summary records, written as a user would type it again."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def invocation(argv: list[str] | None = None) -> str:
    """``python -m kiln bench x`` leaves ``.../kiln/__main__.py`` in argv[0]; a reader wants ``kiln bench x``.
    Any other program (a user's script, pytest) is recorded as it ran."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        program = Path(argv[0])
        if program.name == "kiln" or (program.name == "__main__.py" and program.parent.name == "kiln"):
            argv[0] = "kiln"
    return shlex.join(argv)
