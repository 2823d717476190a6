"""kiln serve: a dynamic-batching HTTP server for a kiln artifact (no torch needed for ONNX/OpenVINO)."""
