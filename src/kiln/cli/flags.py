"""The one table from kiln's parameter names to the command line's flags.

kiln's library errors name the parameter they are about, first (``batch_size must be at least 1``), as a Python
caller wrote it. On the command line the same error names the flag (``--batch-size must be at least 1``): the table
is read from the running command's own options, so a flag and its parameter cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Library names whose option is spelled differently on the command line (the CLI's own parameter name, which typer
# turns into the flag).
ALIASES = {"overwrite": "force"}
_FIRST_WORD = re.compile(r"[a-z][a-z0-9_]*")


def flags_of(command: Any) -> dict[str, str]:
    """Parameter name -> flag, for every option of ``command`` (arguments have no flag)."""
    return {p.name: p.opts[0] for p in command.params if p.param_type_name == "option" and p.name}


def running_command(group: Any, argv: Sequence[str]) -> Any:
    """The subcommand of ``group`` (typer's click group) that ``argv`` runs: the first word that is not an option;
    None when there is none."""
    name = next((a for a in argv if not a.startswith("-")), None)
    return group.commands.get(name) if name else None


def for_command_line(message: str, flags: dict[str, str]) -> str:
    """``message`` with its leading parameter name, when it is one of the command's options, spelled as the flag."""
    found = _FIRST_WORD.match(message)
    if not found:
        return message
    name = ALIASES.get(found.group(), found.group())
    return flags[name] + message[found.end():] if name in flags else message
