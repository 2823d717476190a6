"""kiln export: a model to ONNX or TorchScript with parity checked against PyTorch. The function users call is
``kiln.exporting`` (kiln.api.build)."""
