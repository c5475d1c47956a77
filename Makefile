# One task runner for people, pre-commit and CI. `make run` and `make test` work on a fresh
# machine: each creates .venv and installs what it needs (PyPI only).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# the top-level folders that map into the memstream namespace (setup.py's FOLDERS)
PACKAGES := $(filter-out tests,$(patsubst %/__init__.py,%,$(wildcard */__init__.py)))
STAMP  := $(VENV)/.installed-stamp
# pytest processes for the test targets (`make test TEST_WORKERS=` for one). Most of the suite
# waits on servers, subprocesses and timers, so two processes on two cores take about half the
# time of one: 606 s against 1,018 s on a slow stretch, where one process came near CI's
# 20 minutes (docs/benchmarks.md, "twenty-eighth session"). Two, not three, so the timing
# assertions keep their margins; the three failures the extra load brought out were defects,
# each fixed with a test of its own
TEST_WORKERS ?= 2
PYTEST_N := $(if $(TEST_WORKERS),-n $(TEST_WORKERS))

.PHONY: install run test unit integration lint fmt bench-redaction bench-locomo bench-recall bench-vector-index bench-engine bench-faults bench-ingest clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## the whole pipeline on the embedded stack (NATS, PostgreSQL, Qdrant Edge under .memstream/)
run: install
	$(BIN)/memstream dev

## lint, types, import contracts, then every test tier
test: install lint
	$(BIN)/pytest -q $(PYTEST_N)

unit: install
	$(BIN)/pytest -q $(PYTEST_N) tests/unit

integration: install
	$(BIN)/pytest -q $(PYTEST_N) tests/integration tests/contract

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# import-linter needs a real memstream/ folder: stage one of symlinks (PEP 420 layout)
	rm -rf build/imports && mkdir -p build/imports/memstream
	for f in $(PACKAGES); do ln -s "$(CURDIR)/$$f" build/imports/memstream/$$f; done
	cd build && PYTHONPATH=$(CURDIR)/build/imports ../$(BIN)/lint-imports --config ../pyproject.toml
	@# mypy on the package as it is imported (memstream.x), so cross-module types are real;
	@# the tests as tests.<tier>.<module> (MYPYPATH is their base), relaxed in pyproject.toml
	cd build/imports && ../../$(BIN)/mypy --config-file ../../pyproject.toml $(addprefix -p memstream.,$(PACKAGES))
	cd build/imports && MYPYPATH=$(CURDIR) ../../$(BIN)/mypy --config-file ../../pyproject.toml $(CURDIR)/tests

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-redaction: install
	$(BIN)/memstream bench redaction --data ../shared/bench/redaction-dev.jsonl

bench-locomo: install
	$(BIN)/memstream bench locomo --data ../shared/bench/locomo-dev.json

bench-recall: install
	$(BIN)/memstream bench recall --memories 100000

## the vector index alone (both layouts of reads), at recall scale
bench-vector-index: install
	$(BIN)/python benchmarks/vector_index.py --points 100000

## how long each Qdrant Edge call holds the interpreter lock and stalls the worker's event loop
bench-engine: install
	$(BIN)/python benchmarks/engine_gil.py --points 20000

## its own nats-server, PostgreSQL and worker process, killed and restarted during ingest
bench-faults: install
	$(BIN)/memstream bench faults --turns 3000

## turns/s end to end, the bare JetStream hop beside it, paced latency and recall; the workers
## in their own process (--processes N: one owns the index, N-1 extract/redact beside it)
bench-ingest: install
	$(BIN)/memstream bench ingest

clean:
	rm -rf $(VENV) .memstream build dist *.egg-info
