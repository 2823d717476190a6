"""The Open Inference Protocol (KServe v2) on kiln serve: HTTP (kiln.serving.v2.http) and gRPC (kiln.serving.v2.grpc).

Both transports parse their tensors into one :class:`InferCall` and answer through :func:`run_infer`, which uses
the same batcher, limits and metrics as kiln's own routes. A model's tensors come from its task spec: the same
names ``kiln triton`` gives its ensemble (TEXT in, EMBEDDING / SCORE / RESULT out), so a Triton client moves
between Triton and kiln serve by changing the URL.
"""
