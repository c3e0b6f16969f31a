# Every target sets itself up: a fresh clone needs only Python 3.10+ and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.ptlab-ready
PORT ?= 8888
# Strict nbval: every stored output is compared, volatile text sanitised, each cell limited in time.
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 120
# The second configuration the notebooks must pass in: other float digits and other speed (one thread,
# ATen without SIMD, oneDNN at AVX2). Kept equal to ptlab.nbrun.SECOND_CONFIG by a test.
SECOND_CONFIG := OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2
# A CPU with AVX2 only (no AVX-512), emulated on a faster one: what the budgets are set for.
AVX2_CPU := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: help setup lab test test-unit test-notebooks test-second-config test-browser notebooks bench bench-avx2 doctor lock catalogue clean

help:
	@echo "make lab            set up .venv and start JupyterLab on notebooks/"
	@echo "make test           set up .venv, then unit tests, strict nbval and notebook hygiene"
	@echo "make test-second-config  strict nbval again at 1 thread, without ATen SIMD (other float digits)"
	@echo "make test-browser   every notebook and widget in real JupyterLab + Chromium"
	@echo "make notebooks      re-execute every notebook in place (refresh committed outputs)"
	@echo "make bench          run every notebook once: time, slowest cell, peak RSS, checked share"
	@echo "make bench-avx2     the same, with AVX-512 switched off (the CPU the budgets are set for)"
	@echo "make lock           recompile requirements.lock from requirements.in (needs uv)"

$(READY): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

setup: $(READY)

lab: $(READY)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks --port=$(PORT)

doctor: $(READY)
	$(PY) -m ptlab doctor

test: $(READY)
	$(PY) -m ptlab doctor
	$(PY) -m pytest tests notebooks --ignore=tests/browser $(NBVAL)

test-unit: $(READY)
	$(PY) -m pytest tests --ignore=tests/browser

test-notebooks: $(READY)
	$(PY) -m pytest notebooks $(NBVAL)

test-second-config: $(READY)
	env $(SECOND_CONFIG) $(PY) -m pytest notebooks $(NBVAL) -p no:cacheprovider

# Needs Debian's chromium (apt-get install -y chromium; PTLAB_CHROMIUM=path for another one).
# PTLAB_UPDATE_DOCS=1 also refreshes docs/widget.png from the screenshot it takes.
test-browser: $(READY)
	@test -x "$${PTLAB_CHROMIUM:-/usr/bin/chromium}" || { echo "make test-browser: no chromium at $${PTLAB_CHROMIUM:-/usr/bin/chromium}; install it: sudo apt-get install -y chromium" >&2; exit 1; }
	$(PY) -m pytest tests/browser -p no:cacheprovider -v

# Outputs are regenerated on the CPU (a GPU would print its name in error messages and reprs).
notebooks: $(READY)
	PTLAB_DEVICE=cpu $(PY) -m ptlab notebooks notebooks

bench: $(READY)
	$(PY) -m ptlab bench notebooks

bench-avx2: $(READY)
	env $(AVX2_CPU) $(PY) -m ptlab bench notebooks

catalogue: $(READY)
	$(PY) -m ptlab catalogue --write

lock:
	uv pip compile requirements.in --universal --python-version 3.10 --generate-hashes --no-header \
		--custom-compile-command "make lock" -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache artifacts
