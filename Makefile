# Every target creates the virtualenv and installs the package by itself on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: test demo lint docs bench clean

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev,bench,spark]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check nsqclient tests bench examples
	$(VENV)/bin/ruff format --check nsqclient tests bench examples
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W -q -b html docs docs/_build/html

bench: $(STAMP)
	$(PY) bench/publish.py
	$(PY) bench/consume.py

clean:
	rm -rf $(VENV) docs/_build .pytest_cache
