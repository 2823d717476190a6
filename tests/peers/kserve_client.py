"""Run in KServe's own venv (.venv-kserve): KServe's Python clients (REST v2 and gRPC) against a v2 server.

Usage: python kserve_client.py BASE_URL GRPC_HOST:PORT MODEL TEXT [TEXT ...]
Prints one JSON object: {"rest": [[...], ...], "grpc": [[...], ...], "rest_live": bool, "grpc_ready": bool}.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(base: str, grpc_address: str, model: str, texts: list[str]) -> dict:
    rest = InferenceRESTClient(RESTConfig(protocol="v2"))
    request = InferRequest(model_name=model, infer_inputs=[
        InferInput(name="TEXT", shape=[len(texts), 1], datatype="BYTES", data=texts)])
    answer = await rest.infer(base, request, model_name=model)
    live = await rest.is_server_live(base)
    grpc = InferenceGRPCClient(grpc_address)
    tensor = InferInput(name="TEXT", shape=[len(texts), 1], datatype="BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object), binary_data=True)
    over_grpc = await grpc.infer(InferRequest(model_name=model, infer_inputs=[tensor]))
    ready = await grpc.is_server_ready()
    await rest.close()
    await grpc.close()
    return {"rest": answer.outputs[0].as_numpy().tolist(), "grpc": over_grpc.outputs[0].as_numpy().tolist(),
            "rest_live": bool(live), "grpc_ready": bool(ready)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))))
