# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench chaos clean browser docs docs-serve

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU build on this machine's disk (a plain "torch" pulls CUDA).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,ray,trl,lora,tracking,docs]'
	# verl without its pins (transformers<5.11, packaging<26, wandb, ...), plus just what its agent-loop
	# and reward modules import: torch and transformers stay as installed.
	$(PY) -m pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 omegaconf==2.3.1 \
	  hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 cloudpickle==3.1.3 pillow==13.0.0 codetiming==1.4.0 \
	  orjson==3.13.0 cachetools==8.0.2
	touch $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the console's browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
	  || echo "could not install chromium: browser tests will be skipped"; }

demo: $(STAMP)
	$(VENV)/bin/plugtune demo

lint: $(STAMP)
	$(VENV)/bin/ruff check plugtune tests benchmarks scripts docs

typecheck: $(STAMP)
	$(VENV)/bin/mypy plugtune docs/hooks.py

pytest: $(STAMP) browser
	# faulthandler: a crash of the test process (during the run or at its exit) prints every thread's stack
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest -q -x --durations=15

test: lint typecheck docs pytest

# The documentation site (mkdocs.yml, docs/): built offline and strict (a warning, a broken link or
# a reference page whose generator fails stops it); docs/hooks.py writes the job.yaml, CLI and
# failure references from the code at every build. `make docs-serve` serves it on 127.0.0.1:8000.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The chaos suite's long form: 10,000 plugin calls with 20% faults, 8 + 5 kill -9s mid-job (about 10 min).
chaos: $(STAMP)
	PLUGTUNE_CHAOS=long $(VENV)/bin/pytest -q -s tests/chaos

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/runtime_overhead.py

clean:
	rm -rf $(VENV) .plugtune .pytest_cache .mypy_cache .ruff_cache site
