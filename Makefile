# Two entry points: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv, installs torch==2.13.0 first (so nothing pulls a CUDA build), then the project.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv chromium clean docs

$(STAMP): pyproject.toml setup.py src/gpufeed/data/_jpeg_region.c src/gpufeed/data/_resample.c src/gpufeed/data/_store.c src/gpufeed/data/_resample.h
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpufeed demo

# The report tests drive a real headless Chromium; install Debian's when we may (root, apt present).
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: browser tests will be skipped"; }

test: $(STAMP) chromium
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples README.md
	$(PY) -m pytest -q

# The documentation site (mkdocs.yml) into site/: the docs extra goes into the same .venv, once.
# --strict: a warning (a broken link, an API name that no longer exists) fails the build.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/ruff check docs
	$(VENV)/bin/ruff format --check docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests benchmarks examples
	$(VENV)/bin/ruff format src tests benchmarks examples README.md

clean:
	rm -rf $(VENV) gpufeed-runs .pytest_cache
