"""The baseline kiln serve is measured against: a plain FastAPI endpoint, one request per forward pass.

This is the server most tutorials write: a synchronous route (FastAPI runs it on its thread pool) that
tokenizes the request's text and runs the model on it alone. It serves the same kiln variant with the
same engine threads as `kiln serve`, under the same uvicorn, so the difference measured is batching.
The engine is not re-entrant, so forwards are serialized with a lock (tokenization still overlaps).

    python benchmarks/naive_server.py ARTIFACT [--port 8001] [--threads N]
"""

from __future__ import annotations

import argparse
import threading

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from kiln.artifact.directory import Artifact


class EmbedBody(BaseModel):
    inputs: str


def create_app(artifact: str, threads: int | None) -> FastAPI:
    art = Artifact.open(artifact)
    variant = art.variant_name()
    predictor = art.predictor(variant, art.serving_plan(variant, threads=threads, sessions=1, batch_size=1))
    predictor.engine.warmup()
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/kiln/embed")  # kiln serve's own body and path (its bare /embed answers TEI's)
    def embed(body: EmbedBody) -> dict:
        prepared = predictor.prepare([body.inputs])
        with lock:
            reduced = predictor.run_features(prepared.encodings)
        vectors = predictor.handler.finalize(prepared, reduced, predictor.handler.options(), predictor.encoder)
        return {"embeddings": [v.tolist() for v in vectors]}

    @app.get("/ready")
    def ready() -> dict:
        return {"ready": True}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=None, help="default: the artifact's serving default")
    args = parser.parse_args()
    app = create_app(args.artifact, args.threads)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)


if __name__ == "__main__":
    main()
