"""Packages that are also functions: ``kiln.optimize(...)``, ``kiln.export(...)`` and ``kiln.bench(...)``.

``kiln.optimize`` names both a package (kiln/optimize/) and the function that runs it. Once any of the package's
modules is imported, Python binds the package to that attribute of ``kiln``, so the function would be reachable
only until then. Each such package therefore makes its own module object callable (module ``__class__``
assignment, supported since Python 3.5): calling it imports the function on first use (torch and all) and calls
it, so ``kiln.optimize(...)`` works however the attribute was reached, and ``import kiln`` stays light.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def make_callable(package: str, module: str, function: str) -> None:
    """Make the already-imported ``package`` callable as ``module.function``."""

    class CallablePackage(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            try:
                target = getattr(importlib.import_module(module), function)
            except ModuleNotFoundError as missing:  # kiln.optimize(...) in a serving install
                from kiln.errors import build_dependency

                error = build_dependency(missing)
                if error is None:
                    raise
                raise error from missing
            return target(*args, **kwargs)

    CallablePackage.__call__.__doc__ = f"Call {module}.{function} (see its docstring)."
    sys.modules[package].__class__ = CallablePackage
