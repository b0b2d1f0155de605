# Every target bootstraps .venv first; on a fresh machine `make demo` or
# `make test` is all the set-up there is.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bootstrapped

.PHONY: demo test lint typecheck bench chaos clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	./scripts/bootstrap.sh dev
	touch $(STAMP)

$(VENV)/.bench: $(STAMP)
	./scripts/bootstrap.sh "dev,bench" || echo "bench extras partly unavailable; peers will report 'not run'"
	touch $(VENV)/.bench

demo: $(STAMP)
	$(VENV)/bin/corral demo

lint: $(STAMP)
	$(VENV)/bin/ruff check corral actors supervisor mailbox sandbox bench tests examples

typecheck: $(STAMP)
	./scripts/typecheck.sh

# Two workers on two cores: most tests wait on real processes, not on the CPU.
test: lint typecheck
	$(PY) -m pytest -q -n 2

bench: $(VENV)/.bench
	$(PY) -m bench --json bench/results/latest.json

chaos: $(STAMP)
	$(VENV)/bin/corral chaos --kills 200 --mode both --json chaos-report.json
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
