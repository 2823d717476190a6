# The two commands of the README. Both create .venv when missing and install kiln into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed
DEMO_OUT ?= kiln-out

.PHONY: demo test install docs browser triton-server slim infinity-server kserve-client pylate colbert-ai rag-clients \
	lint clean

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# uv installs every venv (pip bootstraps it into .venv): with pip the seven peer venvs took 570 s of CPU (5:00 of wall
# at 4 jobs on the 2-core EPYC, slowing the tests beside them). uv reads none of pip's configuration, so the machine's
# find-links (where the CPU torch wheel lies on these machines) and its constraint file (which caps torch) are handed
# over from pip's. kiln's venv gets bytecode (--compile-bytecode; uv writes no .pyc by default): with
# PYTHONDONTWRITEBYTECODE=1, set on these machines, nothing writes it later, and every process compiled torch again on
# import (torch + transformers: 6.8 s against 3.7). A peer's venv does not: a handful of processes import from each,
# and a fresh-clone CI with bytecode in every venv took 33:34 against 29:10 without (its tests/e2e 827 s against 824;
# the compile, 275 s more CPU in the install phase, slowed the integration tier beside it: 1,090 s against 836).
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
UV_FROM_PIP := $(shell $(PYTHON) -m pip config list 2>/dev/null | \
	sed -n "s/^global\.find-links='\([^ ]*\)'$$/--find-links \1/p; s/^global\.constraint='\([^ ]*\)'$$/-c \1/p")
UV_INSTALL = $(UV) pip install -q $(UV_FROM_PIP) --python

$(UV): | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

# torch first and pinned: any other version pulls gigabytes of CUDA wheels; with 2.13.0 present,
# kiln's `torch>=2.4` is already satisfied and nothing more is installed for it.
$(STAMP): pyproject.toml constraints.txt | $(PY) $(UV)
	$(UV_INSTALL) $(PY) --compile-bytecode torch==2.13.0
	$(UV_INSTALL) $(PY) --compile-bytecode -c constraints.txt -e '.[build,test,docs,openvino,serve,triton,grpc,embed,ray,otel]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/kiln optimize --task feature-extraction --force -o $(DEMO_OUT)
	@echo "report: $(abspath $(DEMO_OUT))/summary.md (results.json beside it; chosen variant in $(DEMO_OUT)/best)"

# The report test renders report.html in Debian's headless chromium; without root or apt the test is
# skipped with its reason instead.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "make: could not install chromium; the browser test will be skipped"; \
	  else echo "make: chromium missing and no root/apt to install it; the browser test will be skipped"; fi; }

# A real tritonserver for the Triton tests: PyPI's nvidia-pytriton ships the binary and the Python backend (no GPU
# needed). Its own venv: the backend stub embeds Python 3.11 and failed with numpy 2 ("output tensor shape does not
# match size of output" for a trivial model), so numpy 1.26 there; kiln itself without its dependencies.
TRITON_VENV ?= .venv-triton
TRITON_STAMP := $(TRITON_VENV)/.kiln-triton
PYTRITON := $(TRITON_VENV)/lib/python3.11/site-packages/pytriton/tritonserver
triton-server: $(TRITON_STAMP)

$(TRITON_STAMP): pyproject.toml | $(UV)
	@if [ "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2] == (3, 11))')" != True ]; then \
	  echo "make: the pytriton Python-backend stub needs Python 3.11; the Triton tests will be skipped"; \
	else \
	  $(PYTHON) -m venv $(TRITON_VENV) && \
	  $(UV_INSTALL) $(TRITON_VENV)/bin/python nvidia-pytriton==0.7.0 numpy==1.26.4 \
	    tokenizers==0.23.3 pydantic==2.14.3 onnxruntime==1.32.0 openvino==2026.4.1 && \
	  $(UV_INSTALL) $(TRITON_VENV)/bin/python --no-deps -e . && \
	  cp $(PYTRITON)/python_backend_stubs/3.11/triton_python_backend_stub $(PYTRITON)/backends/python/ && \
	  touch $(TRITON_STAMP); \
	fi

# A serving-only install (pip install 'kiln[serve,embed]': no torch, transformers, scipy or scikit-learn), the way a
# container serving an ONNX artifact installs kiln; tests/e2e/test_slim_install.py serves from it.
SLIM_VENV ?= .venv-slim
SLIM_STAMP := $(SLIM_VENV)/.kiln-slim
slim: $(SLIM_STAMP)

$(SLIM_STAMP): pyproject.toml constraints.txt | $(UV)
	$(PYTHON) -m venv $(SLIM_VENV)
	$(UV_INSTALL) $(SLIM_VENV)/bin/python -c constraints.txt -e '.[serve,embed]'
	touch $(SLIM_STAMP)

# The peers' venvs install side by side (INSTALL_JOBS at once, each target's output kept together), and while they do,
# the tiers that need only kiln's venv run: tests/unit and tests/integration (chromium, for the report's page, is
# installed first). tests/e2e, which uses the peers' venvs, runs once they are in place. With uv the seven take 72 s
# of wall at 4 jobs (130 s of CPU; a cold uv cache, the 2-core avx2 EPYC); with pip one after another they took 12-13
# minutes of CI (the 2-core Xeon, 770 s).
INSTALL_JOBS ?= 4
# Each tier runs in PYTEST_WORKERS processes (pytest-xdist), a test file to a worker (a module's fixtures are built
# once; the session's tiny models once per worker). Tests wait on subprocesses and servers, so more workers than cores
# fill the gaps: on the 2-core avx2 EPYC, tests/unit + tests/integration took 852 s in two processes and 779 s in
# three (194% of the 2 cores; `pytest -n N --dist loadfile tests/unit tests/integration`, nothing else running).
PYTEST_WORKERS ?= 3
# Three workers and the servers they start keep more threads busy than there are cores, and a thread spinning between
# runs (ONNX Runtime's, OpenMP's in torch) takes a core from one with work: 4 integration files took 260 s of wall
# and 462 s of user CPU spinning, 178 s and 300 s with both sleeping (`pytest -n 3 --dist loadfile
# tests/integration/test_{optimize,generation,tasks,bench}.py`, 2-core AMD EPYC). Every process the tests start
# inherits these settings.
# Bytecode is written while the tests run (PYTHONDONTWRITEBYTECODE, set to 1 on these machines, emptied): kiln's own
# modules, pytest's rewritten test files and the peers' imports are compiled by the first process that loads them,
# not by every one. Collecting the suite took 20-23 CPU-s in each pytest process without it and 13 with it (`pytest
# --collect-only -q tests/unit tests/integration tests/e2e`, 2-core avx2 EPYC); the tiers start 6 such processes and
# ~150 kiln and peer processes. Unused plugins stay out (schemathesis runs as its own command; no test is async or
# uses hypothesis): each loaded hypothesis into every process.
PYTEST := KILN_SPIN_WAIT=0 OMP_WAIT_POLICY=PASSIVE PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(PYTEST_WORKERS) \
	--dist loadfile --durations=15 -p no:schemathesis -p no:hypothesispytest -p no:anyio
PEER_VENVS := triton-server slim infinity-server kserve-client pylate colbert-ai rag-clients
PEERS := browser $(PEER_VENVS)

test:
	$(MAKE) --no-print-directory -j2 --output-sync=target install browser
	@$(MAKE) --no-print-directory -j$(INSTALL_JOBS) --output-sync=target $(PEER_VENVS) >.peers-install.log 2>&1 & \
	peers=$$!; \
	$(PYTEST) tests/unit tests/integration; first=$$?; \
	wait $$peers; installed=$$?; cat .peers-install.log; \
	if [ $$installed -ne 0 ]; then echo "make: a peer venv failed to install (above)"; exit $$installed; fi; \
	$(PYTEST) tests/e2e; second=$$?; \
	if [ $$first -ne 0 ]; then exit $$first; fi; exit $$second

lint: install
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/lint-imports

# The documentation site, built into site/ (open site/index.html); `mkdocs serve` for a live preview.
docs: install
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) $(TRITON_VENV) $(SLIM_VENV) $(INFINITY_VENV) $(KSERVE_VENV) $(PYLATE_VENV) $(COLBERT_VENV) \
	  $(CLIENTS_VENV) $(DEMO_OUT) \
	  .pytest_cache site .peers-install.log

# A real deployment nobody here wrote, for kiln audit's test: Infinity (infinity-emb 0.0.78) in its own venv. It pins
# transformers 4.57 and numpy < 2; torch 2.13.0 first, as everywhere (any other version pulls CUDA wheels).
INFINITY_VENV ?= .venv-infinity
INFINITY_STAMP := $(INFINITY_VENV)/.kiln-infinity
infinity-server: $(INFINITY_STAMP)

$(INFINITY_STAMP): | $(UV)
	$(PYTHON) -m venv $(INFINITY_VENV)
	$(UV_INSTALL) $(INFINITY_VENV)/bin/python torch==2.13.0
	$(UV_INSTALL) $(INFINITY_VENV)/bin/python 'infinity-emb[server,torch]==0.0.78' \
	  'transformers==4.57.*' 'numpy<2' \
	  || { echo "make: infinity-emb could not be installed; the Infinity audit test will be skipped"; exit 0; }
	touch $(INFINITY_STAMP)

# KServe's own Python clients (REST v2 and gRPC), for tests/e2e/test_serve_protocols.py: a peer in its own venv, as
# KServe's users install it (kserve pulls its own fastapi, grpcio-tools and numpy 2).
KSERVE_VENV ?= .venv-kserve
KSERVE_STAMP := $(KSERVE_VENV)/.kiln-kserve
kserve-client: $(KSERVE_STAMP)

$(KSERVE_STAMP): | $(UV)
	$(PYTHON) -m venv $(KSERVE_VENV)
	$(UV_INSTALL) $(KSERVE_VENV)/bin/python 'kserve==0.21.0'
	touch $(KSERVE_STAMP)

# The RAG frameworks' embedders people point at a TEI or OpenAI URL, as they ship, for
# tests/e2e/test_serve_protocols.py: LlamaIndex's TextEmbeddingsInference and LangChain's OpenAIEmbeddings (their own
# venv: llama-index-core and langchain-core pull dependency trees kiln does not need).
CLIENTS_VENV ?= .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.kiln-clients
rag-clients: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): | $(UV)
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(UV_INSTALL) $(CLIENTS_VENV)/bin/python \
	  'llama-index-embeddings-text-embeddings-inference==0.6.0' 'langchain-openai==1.7.4'
	touch $(CLIENTS_STAMP)

# PyLate (pylate 1.6.0), the ColBERT implementation tests/e2e/test_multi_vector.py compares kiln with, in its own venv:
# it pins sentence-transformers 5.3.0 and transformers <= 5.3.0 (kiln's venv has newer), and its fast-plaid index
# dependency pins torch 2.11 with CUDA wheels (5 GB). kiln needs only pylate.models, which imports neither
# fast-plaid nor fastkmeans, so pylate goes in without its dependencies and the ones models needs are named here.
# FlagEmbedding 1.4.2 (BGE-M3's own library, tests/e2e/test_hybrid_flagembedding.py) shares the venv: its
# BGEM3FlagModel needs torch, transformers and sentence-transformers, which are here; it goes in without its
# dependencies too (datasets is here; peft and accelerate, which its package imports, are named; ir-datasets and
# the fine-tuning extras are not needed to encode).
PYLATE_VENV ?= .venv-pylate
PYLATE_STAMP := $(PYLATE_VENV)/.kiln-pylate
pylate: $(PYLATE_STAMP)

$(PYLATE_STAMP): | $(UV)
	$(PYTHON) -m venv $(PYLATE_VENV)
	$(UV_INSTALL) $(PYLATE_VENV)/bin/python torch==2.13.0
	$(UV_INSTALL) $(PYLATE_VENV)/bin/python 'sentence-transformers==5.3.0' \
	  'transformers==5.3.0' datasets scipy 'ujson==5.12.0'
	$(UV_INSTALL) $(PYLATE_VENV)/bin/python --no-deps 'pylate==1.6.0'
	$(UV_INSTALL) $(PYLATE_VENV)/bin/python --no-deps 'FlagEmbedding==1.4.2' 'peft==0.21.2' \
	  'accelerate==1.15.0' psutil pyyaml
	$(PYLATE_VENV)/bin/python -c "from pylate import models; from FlagEmbedding import BGEM3FlagModel"
	touch $(PYLATE_STAMP)

# The original ColBERT (colbert-ai 0.2.22), whose checkpoint layout kiln also reads, in its own venv: its HF_ColBERT
# does not load under transformers 5 (no post_init), so transformers 4.57.1 here; torch 2.13.0 first, as everywhere.
# Its search extension (segmented_maxsim) is compiled by torch on first use, with the system's g++.
COLBERT_VENV ?= .venv-colbert
COLBERT_STAMP := $(COLBERT_VENV)/.kiln-colbert
colbert-ai: $(COLBERT_STAMP)

$(COLBERT_STAMP): | $(UV)
	$(PYTHON) -m venv $(COLBERT_VENV)
	$(UV_INSTALL) $(COLBERT_VENV)/bin/python torch==2.13.0
	$(UV_INSTALL) $(COLBERT_VENV)/bin/python 'transformers==4.57.1' 'colbert-ai==0.2.22'
	$(COLBERT_VENV)/bin/python -c "from colbert.modeling.checkpoint import Checkpoint"
	touch $(COLBERT_STAMP)
