"""kiln's Python API: one function per command of the CLI, which is made of them (kiln.cli). ``import kiln``
exports each (``kiln.optimize``, ``kiln.serve``, ...); the modules group them by what they do."""
