"""A large real-English corpus that ships with Python: the docstrings of its standard library.

Distilling a student needs far more text than the reference manual's topics hold (about 2,200 sentences): the
standard library's docstrings are tens of thousands of sentences of real technical prose, written by many
people, on the disk of every Python installation. They are read with ``ast`` from the source files, so no
module is imported (some run code on import). Which sentences come out depends on the Python version; the
fingerprint says which.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

from kiln.data.corpus import is_prose, split_sentences

# Test suites and vendored third-party code are not the library's own prose.
_SKIP = {"test", "tests", "site-packages", "dist-packages", "__pycache__", "idle_test", "_vendor"}


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []  # a file this Python cannot parse holds no docstrings it could use
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, kinds) and (doc := ast.get_docstring(node))]


def _roots(packages: tuple[str, ...]) -> list[Path]:
    """The standard library, then each named installed package's directory (found without importing it)."""
    import importlib.util

    roots = [Path(sysconfig.get_paths()["stdlib"])]
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"no installed package named {name!r} to read docstrings from")
        roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


@lru_cache(maxsize=4)
def docstring_sentences(packages: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Sentences of the prose paragraphs of every standard-library docstring, each once, in file order; with
    ``packages`` (import names of installed packages, e.g. kiln's own dependencies numpy, scipy, torch) theirs
    after them: several times more text, still nothing downloaded at run time."""
    seen: dict[str, None] = {}
    for root in _roots(packages):
        files = sorted(p for p in root.rglob("*.py") if not _SKIP & set(p.relative_to(root).parts))
        for path in files:
            for doc in _docstrings(path):
                for block in re.split(r"\n\s*\n", doc):
                    text = " ".join(block.split())
                    if is_prose(text):
                        seen.update((s, None) for s in split_sentences(text) if len(s.split()) >= 4)
    return tuple(seen)


def fingerprint() -> str:
    return hashlib.sha256("\n".join(docstring_sentences()).encode()).hexdigest()[:16]
