# kiln serve in a container: serving dependencies only (the slim install: onnxruntime, tokenizers, FastAPI,
# uvicorn, Prometheus; no torch or transformers), run as a non-root user, with the v2 gRPC service.
#
#   docker build -t kiln-serve .
#   docker run -p 8000:8000 -p 8001:8001 -v "$PWD/kiln-out/best:/models/model:ro" kiln-serve
#
# The artifact is mounted at /models/model, or baked into an image of its own:
#   FROM kiln-serve
#   COPY --chown=kiln:kiln kiln-out/best /models/model
# Probes: /health (the process answers) and /ready (every model loaded and its batching loop alive).

ARG PYTHON=python:3.11-slim-bookworm

FROM ${PYTHON} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
# A virtual environment, so the runtime stage copies one directory; grpc: the v2 gRPC service (--grpc-port).
RUN python -m venv /opt/kiln \
    && /opt/kiln/bin/pip install -c constraints.txt '.[serve,grpc]'

FROM ${PYTHON}
RUN useradd --create-home --uid 10001 kiln && mkdir /models && chown kiln:kiln /models
COPY --from=build /opt/kiln /opt/kiln
ENV PATH=/opt/kiln/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
USER 10001
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4).status != 200)"]
# exec form: kiln serve is PID 1 and gets SIGTERM, so it drains (finishes accepted requests) before exiting.
ENTRYPOINT ["kiln", "serve", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001", "--log-format", "json"]
CMD ["/models/model"]
