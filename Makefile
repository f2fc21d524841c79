# One command each for a fresh machine: `make demo` and `make test` do all their own set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: FORCE demo test lint unit integration bench bench-run bench-sim experiments docs clean

# Always asked, and quick when nothing changed: the script remakes the virtualenv from the hash-pinned lock
# (requirements/dev.txt) when the interpreter, the lock, pyproject.toml or the script itself changed.
$(STAMP): FORCE
	PYTHON=$(PYTHON) scripts/venv.sh $(VENV)

FORCE:

demo: $(STAMP)
	rm -rf .gridbot/demo results/pi
	$(VENV)/bin/gridbot run examples/pi/sweep.toml --db sqlite:///.gridbot/demo/gridbot.db --results results/pi
	$(PY) examples/pi/combine.py results/pi

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples experiments
	$(VENV)/bin/mypy

test: $(STAMP) lint
	scripts/slurm.sh install
	scripts/boinc.sh install
	scripts/chromium.sh
	. scripts/ensure-postgres.sh && $(PY) -m pytest -q -p no:cacheprovider tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

docs: $(STAMP)
	$(PY) -c 'from gridbot.policy.reference import markdown; print(markdown(), end="")' > docs/policies.md

# BENCH_ARGS goes to bench/suite.py as it is: make bench BENCH_ARGS="--only 1 --runs 5 --db-dir /var/tmp"
BENCH_ARGS ?=

bench: $(STAMP)
	PYTHON=$(PYTHON) bench/peers/setup.sh .venv-peers
	mkdir -p results
	. scripts/ensure-postgres.sh && $(PY) bench/suite.py --out results/bench.md $(BENCH_ARGS)

bench-run: $(STAMP)
	$(PY) bench/throughput.py

bench-sim: $(STAMP)
	$(PY) bench/simulate.py

experiments: $(STAMP)
	$(PY) experiments/run.py

clean:
	rm -rf $(VENV) .venv-peers .gridbot results
