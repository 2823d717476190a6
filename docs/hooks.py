"""mkdocs hooks: the pages made from the code and the suite rather than written by hand.

- ``<!-- cli -->`` in cli.md becomes the reference of every ``kiln`` command, read from the typer app itself (each
  option's flag, default and help), so the page cannot drift from the commands.
- ``<!-- tasks -->`` in tasks.md becomes a table of the registered tasks, read from their specs (what loads the
  model, what the gate checks and its default tolerance, the task metric and its eval-file fields, the routes).
- ``<!-- results -->`` in performance.md becomes benchmarks/RESULTS.md, the suite's current figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cli_reference() -> str:
    import typer

    from kiln.cli.app import app

    group = typer.main.get_command(app)
    lines: list[str] = []
    for name, command in group.commands.items():
        lines += [f"## kiln {name}", "", (command.help or "").strip(), "", "| option | default | what it does |",
                  "| --- | --- | --- |"]
        for param in command.params:
            flag = " / ".join(f"`{o}`" for o in param.opts) if param.param_type_name == "option" \
                else f"`{param.name.upper()}` (argument)"
            default = param.default
            shown = "" if default is None or param.required else f"`{getattr(default, 'value', default)}`"
            what = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
            lines.append(f"| {flag} | {shown} | {what} |")
        lines.append("")
    return "\n".join(lines)


def _task_table() -> str:
    from kiln.tasks import TASKS
    from kiln.tasks.wire import task_wire

    lines = ["| task | loads | the gate checks (default tolerance t) | task metric | eval-file fields | routes |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, spec in TASKS.items():
        routes = ", ".join(sorted({f"`POST {r.path}`" for r in task_wire(name).routes}))
        lines.append(f"| `{name}` | `{spec.export.auto_class}` | {spec.validation.tolerance_help} "
                     f"(t = {spec.validation.default_tolerance:g}) | "
                     f"{spec.validation.metric} | {', '.join(spec.validation.eval_fields)} | {routes} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if "<!-- cli -->" in markdown:
        markdown = markdown.replace("<!-- cli -->", _cli_reference())
    if "<!-- tasks -->" in markdown:
        markdown = markdown.replace("<!-- tasks -->", _task_table())
    if "<!-- results -->" in markdown:
        results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
        body = results.split("\n", 1)[1]  # its own title is the page's
        markdown = markdown.replace("<!-- results -->", body)
    return markdown
