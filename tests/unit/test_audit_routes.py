"""kiln audit's requests: a route found at its fallback path is remembered for the rest of the audit."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kiln.auditing.protocols import Endpoint, embed


def test_a_route_answered_at_its_fallback_is_asked_there_directly_afterwards():
    """Infinity serves OpenAI's embeddings at /embeddings: the first request finds it after a 404 at
    /v1/embeddings, the next ones go straight there (one round trip each, not two)."""
    paths: list[str] = []

    class Infinityish(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            paths.append(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/embeddings":
                self.send_response(404)
                self.end_headers()
                return
            answer = json.dumps({"data": [{"index": i, "embedding": [1.0, float(i)]}
                                          for i in range(len(body["input"]))]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Infinityish)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}", "openai", "m")
        for _ in range(3):
            assert embed(endpoint, ["a", "b"]).tolist() == [[1.0, 0.0], [1.0, 1.0]]
        assert paths == ["/v1/embeddings", "/embeddings", "/embeddings", "/embeddings"]
        fresh = Endpoint(endpoint.url, "openai", "m")  # another audit finds the route again
        assert fresh == endpoint and not fresh.moved
    finally:
        server.shutdown()
