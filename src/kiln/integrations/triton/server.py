"""Start a real ``tritonserver`` on a kiln repository, on free loopback ports (tests and the load benchmark).

The binary comes from PyPI's nvidia-pytriton in its own virtual environment (``make triton-server``); its Python
backend finds kiln and its packages through that environment's ``bin/`` first on PATH (PYTHONPATH alone did not).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.serving.process import free_port

TRITON_VENV_ENV = "KILN_TRITON_VENV"  # where `make triton-server` built the environment (default .venv-triton)


@dataclass(frozen=True)
class TritonInstall:
    venv: Path
    binary: Path
    backends: Path


def find_install(venv: str | Path | None = None) -> TritonInstall | str:
    """The tritonserver install, or the reason there is none (for a test's skip message)."""
    root = Path(venv or os.environ.get(TRITON_VENV_ENV) or Path.cwd() / ".venv-triton")
    base = root / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    binary, stub = base / "bin" / "tritonserver", base / "backends" / "python" / "triton_python_backend_stub"
    if not binary.is_file():
        return f"no tritonserver at {binary} (run `make triton-server`)"
    if not stub.is_file():
        return f"the Python backend stub is not in {stub.parent} (run `make triton-server`)"
    return TritonInstall(root, binary, base / "backends")


@dataclass
class RunningTriton:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_triton(install: TritonInstall, repository: Path, log: Path, timeout_s: float = 180,
                 exit_timeout_s: int = 5) -> RunningTriton:
    """Run tritonserver on 127.0.0.1 and return once every model is ready (or raise with the log's tail).
    ``exit_timeout_s``: how long it may wait for in-flight requests once stopped. Its own default, 30 s, was every
    stop's wall time with nothing in flight (the suite's teardown: 30.06 s, tests/e2e/test_triton.py)."""
    import tritonclient.http as http

    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PATH": f"{install.venv / 'bin'}:{os.environ.get('PATH', '')}"}
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(install.binary), f"--model-repository={repository}", f"--backend-directory={install.backends}",
             "--http-address=127.0.0.1", f"--http-port={http_port}", "--grpc-address=127.0.0.1",
             f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--allow-metrics=false",
             f"--exit-timeout-secs={exit_timeout_s}"],
            stdout=sink, stderr=subprocess.STDOUT, env=env)
    running = RunningTriton(process, http_port, grpc_port, log)
    deadline = time.monotonic() + timeout_s
    client = http.InferenceServerClient(f"127.0.0.1:{http_port}")
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if client.is_server_ready():
                return running
        except Exception:  # connection refused while it starts: keep waiting until the deadline
            pass
        time.sleep(0.25)
    running.stop()
    raise RuntimeError(f"tritonserver did not become ready: {''.join(log.read_text().splitlines(True)[-25:])}")
