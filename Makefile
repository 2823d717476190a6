# The two commands of the README. Both create .venv when missing and install kiln into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed
DEMO_OUT ?= kiln-out

.PHONY: demo test install browser lint clean

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: any other version pulls gigabytes of CUDA wheels; with 2.13.0 present,
# kiln's `torch>=2.4` is already satisfied and pip installs nothing more for it.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,openvino,serve]'
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

test: install browser
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
