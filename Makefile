# binlens: `make run` serves a sample binary; `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin/binlens
SAMPLE := build/sample
HOST ?= 127.0.0.1
PORT ?= 8765

.PHONY: run test lint bench clean sample system-run system-test

# Debian packages: installed when root and missing, otherwise the exact command is printed.
system-run:
	@bash scripts/system-packages.sh run
system-test:
	@bash scripts/system-packages.sh test

$(VENV)/.installed: pyproject.toml setup.py src/binlens/analysis/native/_x86scan.c src/binlens/analysis/native/_descent.c \
		src/binlens/analysis/native/_chunkmap.h src/binlens/analysis/native/_addrbits.h \
		src/binlens/analysis/native/_predmap.h src/binlens/analysis/native/_packedrefs.h src/binlens/store/_rows.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,debug,decompile,corpus]'
	$(PY) -m compileall -q src  # an editable install has no bytecode yet (PYTHONDONTWRITEBYTECODE may be set)
	touch $@

$(SAMPLE): tests/fixtures/src/sample.c
	mkdir -p build
	cc -O2 -g -o $@ $<

sample: $(SAMPLE)

# Serve build/sample over HTTP on $(HOST):$(PORT) (/mcp, /sse, /ws, /healthz); prints the mcpServers entries.
run: system-run
	@$(MAKE) --no-print-directory $(VENV)/.installed $(SAMPLE)
	$(BIN) serve $(SAMPLE) --host $(HOST) --port $(PORT) --print-mcp-config

test: system-test
	@$(MAKE) --no-print-directory $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy  # src/binlens, with the settings of [tool.mypy] in pyproject.toml
	PYTHONPATH=src $(VENV)/bin/lint-imports  # this checkout's code, whichever binlens the venv holds

clean:
	rm -rf build .pytest_cache .mypy_cache

# Benchmarks (bench/README.md): builds the benchmark programs on first use (bench/builds.py: Debian
# source packages, gcc, clang).
# Peers (angr, smda, ddisasm) join when bench/work/peers-venv exists: add --tools to choose.
bench: $(VENV)/.installed
	$(PY) bench/accuracy.py --quick --tools binlens,eh_frame
	$(PY) bench/speed.py --quick --compilers gcc --tools binlens
