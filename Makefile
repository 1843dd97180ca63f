# The two set-up commands of the README. Each makes .venv on first use: torch==2.13.0 first (the
# CPU wheel; an unpinned torch would pull gigabytes of CUDA), then the project with its dev extra.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.faultlab-installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/faultlab run experiments/rank_kill.yaml

# The shipped experiments that must pass run as pytest items through our own plugin, beside
# the tests, two at a time (rank_hang_default_timeouts fails by design; its test expects that).
SHIPPED := experiments/rank_kill.yaml experiments/rank_hang.yaml \
	experiments/node_loss_elastic.yaml experiments/ckpt_bitflip.yaml \
	experiments/ckpt_torn_write.yaml

test: $(STAMP)
	$(PY) -m pytest -n 2 tests $(SHIPPED)

bench: $(STAMP)
	$(PY) benchmarks/bench_trainer.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache
