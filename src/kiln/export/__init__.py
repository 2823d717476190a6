"""kiln export: a model to ONNX or TorchScript with parity checked against PyTorch.

The package is also the function: ``kiln.export(model, format=...)`` is :func:`kiln.export.job.export`.
"""

from kiln.system.modules import make_callable

make_callable(__name__, "kiln.export.job", "export")
