# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned here only for installation on these machines (a CPU build lies on local
# disk); setup.cfg keeps a range.
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= build/demo
DEMO_STEPS ?= 4096

.PHONY: venv browser demo test lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml setup.py runtime/_recurrence_c.c runtime/_gradnorm_c.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# The monitor's browser tests drive the system Chromium through playwright (never a browser
# download of its own). Installed here when missing and we are root with apt; never fails the
# build: without it those tests skip and say why.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ ! -x $(CHROMIUM) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the monitor's browser tests"; \
		(DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq chromium >/dev/null 2>&1 || \
		 (timeout 120 apt-get update -qq >/dev/null 2>&1 && \
		  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq chromium >/dev/null 2>&1)) || \
		echo "note: chromium could not be installed; the monitor's browser tests will skip"; \
	fi

# Rewrite the bundled PPO example (in a copy: the engine never edits your files), run the
# original and the committed rewrite on a small budget with the same seeds, then show the log,
# the comparison of the two and what was rewritten. One run at a time, original and rewrite
# alternating per seed: runs side by side (--parallel) share the CPUs, and a load that changes
# between the two sides made their steps/s differ by 75% where sequential reruns showed no
# difference (compare still flags runs that shared the machine; CPU time is compared beside).
DEMO_SEEDS ?= 0,1
# absolute, so that VENV may be given as an absolute path too
SCALEBOX = $(abspath $(BIN))/scalebox
demo: venv
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	cp -r examples/cartpole_ppo $(DEMO_DIR)/
	cd $(DEMO_DIR)/cartpole_ppo && $(SCALEBOX) init .
	cd $(DEMO_DIR)/cartpole_ppo && $(SCALEBOX) rewrite .
	cd $(DEMO_DIR)/cartpole_ppo && for seed in $$(echo "$(DEMO_SEEDS)" | tr ',' ' '); do \
		OMP_NUM_THREADS=1 $(SCALEBOX) run --original --seeds $$seed train.py -- --total-steps $(DEMO_STEPS) > /dev/null && \
		OMP_NUM_THREADS=1 $(SCALEBOX) run --seeds $$seed train.py -- --total-steps $(DEMO_STEPS) > /dev/null || exit 1; \
	done
	cd $(DEMO_DIR)/cartpole_ppo && $(SCALEBOX) log
	cd $(DEMO_DIR)/cartpole_ppo && $(SCALEBOX) compare original run/0001
	cd $(DEMO_DIR)/cartpole_ppo && $(SCALEBOX) diff --stat
	@echo "watch it live: $(BIN)/scalebox monitor $(DEMO_DIR)/cartpole_ppo --web-port 8080 --refresh-interval 2  (then open http://127.0.0.1:8080/)"

# --durations: the slowest tests in every CI log (CI must stay under 20 minutes: ~15 today)
test: venv browser lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist worksteal --durations=15

# ruff and mypy over the engine core, the transforms and the runtime (configured in
# pyproject.toml). mypy reads the package as it installs (transforms/ and runtime/ under
# scalebox_cst) through build/typecheck/, a tree of links to the source folders.
TYPECHECK := build/typecheck
lint: venv
	$(BIN)/ruff check scalebox_cst transforms runtime
	rm -rf $(TYPECHECK)/scalebox_cst && mkdir -p $(TYPECHECK)/scalebox_cst
	for f in scalebox_cst/*; do ln -s "$$PWD/$$f" $(TYPECHECK)/scalebox_cst/; done
	ln -s "$$PWD/transforms" $(TYPECHECK)/scalebox_cst/transforms
	ln -s "$$PWD/runtime" $(TYPECHECK)/scalebox_cst/runtime
	cd $(TYPECHECK) && $(abspath $(BIN))/mypy --config-file $(CURDIR)/pyproject.toml -p scalebox_cst

bench: venv
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/run_all.py

clean:
	rm -rf build $(VENV)
