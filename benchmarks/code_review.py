"""The code review's numbers for src/kiln, from the source alone: `python benchmarks/code_review.py [--json]`.

- public signatures that take or return ``dict[str, Any]`` (parameters or return annotation);
- reads of manifest variant records by string key (``record["..."]`` / ``record.get("...")`` on names that hold
  variant records: record, rec, variant_record);
- checks of what kind a task is outside ``kiln/tasks/`` (``.generates``, or comparing ``.scheduling`` instead of
  looking it up in a registry);
- import cycles between kiln modules (every import, function-level ones included, and module-level only);
- the largest modules (lines) and functions (lines).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kiln"
RECORD_NAMES = ("record", "rec", "variant_record")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def dict_signatures(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        name = getattr(node, "name", None) or "_"
        private = name.startswith("_") and not name.startswith("__")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not private:
            annotations = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation]
            annotations += [node.returns] if node.returns else []
            if any("dict[str, Any]" in ast.unparse(a) for a in annotations):
                found.append(node.name)
    return found


def record_key_reads(text: str) -> int:
    names = "|".join(RECORD_NAMES)
    return len(re.findall(rf"\b(?:{names})(?:\[\"[a-z_]+\"\]|\.get\(\"[a-z_]+\")", text))


def imports(tree: ast.AST, module: str, known: set[str], top_level_only: bool) -> set[str]:
    """kiln modules ``module`` imports: at module level only, or anywhere (inside functions too). Imports under
    ``if TYPE_CHECKING:`` never run and are not counted."""
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) == "TYPE_CHECKING" for n in ast.walk(block)}
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if id(node) in typing_only or (isinstance(node, ast.If) and top_level_only):
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + [node.module])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("kiln"):
                out.add(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    mods = modules()
    known = set(mods)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    dicts = {m: dict_signatures(t) for m, t in trees.items()}
    kind_check = re.compile(r"\.generates\b|\.scheduling\s*(?:is|==|!=)")
    generates = {m: len(kind_check.findall(p.read_text())) for m, p in mods.items() if not m.startswith("kiln.tasks")}
    functions = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{m}.{node.name}"))
    report = {
        "public_dict_signatures": sum(map(len, dicts.values())),
        "variant_record_key_reads": sum(record_key_reads(p.read_text()) for p in mods.values()),
        "generates_checks_outside_tasks": sum(generates.values()),
        "generates_checks_by_module": {m: n for m, n in generates.items() if n},
        "import_cycles_all_imports": cycles({m: imports(t, m, known, False) for m, t in trees.items()}),
        "import_cycles_module_level": cycles({m: imports(t, m, known, True) for m, t in trees.items()}),
        "largest_modules": sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)[:5],
        "largest_functions": sorted(functions, reverse=True)[:5],
        "modules": len(mods),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        if isinstance(value, list) and value and isinstance(value[0], (list, tuple)):
            print(f"{key}:")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
