# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned here only for installation on these machines (a CPU build lies on local
# disk); setup.cfg keeps a range.
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= build/demo
DEMO_STEPS ?= 4096

.PHONY: venv demo test bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# Rewrite the bundled PPO example (in a copy: the engine never edits your files), run the
# original and the committed rewrite on a small budget with the same seeds, then show the log,
# the comparison of the two and what was rewritten.
DEMO_SEEDS ?= 0,1
demo: venv
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	cp -r examples/cartpole_ppo $(DEMO_DIR)/
	cd $(DEMO_DIR)/cartpole_ppo && ../../../$(BIN)/scalebox init .
	cd $(DEMO_DIR)/cartpole_ppo && ../../../$(BIN)/scalebox rewrite .
	cd $(DEMO_DIR)/cartpole_ppo && OMP_NUM_THREADS=1 ../../../$(BIN)/scalebox run --original --seeds $(DEMO_SEEDS) --parallel 2 train.py -- --total-steps $(DEMO_STEPS) > /dev/null
	cd $(DEMO_DIR)/cartpole_ppo && OMP_NUM_THREADS=1 ../../../$(BIN)/scalebox run --seeds $(DEMO_SEEDS) --parallel 2 train.py -- --total-steps $(DEMO_STEPS) > /dev/null
	cd $(DEMO_DIR)/cartpole_ppo && ../../../$(BIN)/scalebox log
	cd $(DEMO_DIR)/cartpole_ppo && ../../../$(BIN)/scalebox compare original run/0001
	cd $(DEMO_DIR)/cartpole_ppo && ../../../$(BIN)/scalebox diff --stat

test: venv
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

bench: venv
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/run_all.py

clean:
	rm -rf build $(VENV)
