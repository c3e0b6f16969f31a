# Every target sets itself up: a fresh clone needs Python 3.10+ with its venv module, make, network
# access to PyPI for the first install, and about 10 GB of free disk (tools/check_setup.py says what is missing).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.ptlab-ready
PORT ?= 8888
# Strict nbval: every stored output is compared, volatile text sanitised, each cell limited in time.
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 120
# The second configuration the notebooks must pass in: other float digits and other speed (one thread,
# ATen without SIMD, oneDNN at AVX2). Kept equal to ptlab.course.nbrun.SECOND_CONFIG by a test.
SECOND_CONFIG := OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2
# A CPU with AVX2 only (no AVX-512), emulated on a faster one: what the budgets are set for.
AVX2_CPU := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
# The thread rule (README, "Threads"), exported to every command below, JupyterLab's kernels and CI's included:
# torch's idle OpenMP threads sleep (PASSIVE) instead of spinning, so a laptop busy with other programs slows the
# course down little. A policy set in your environment or on the command line wins. Equal to
# ptlab.course.nbrun.THREAD_DEFAULTS, which `python -m ptlab notebooks`, `bench` and pytest give kernels themselves.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY

.PHONY: check-setup handout help setup lab lint test test-fast test-unit test-notebooks test-second-config test-browser notebooks bench bench-busy bench-avx2 \
	doctor lock catalogue clean gpu-check gpu-wheels

help:
	@echo "make lab            set up .venv and start JupyterLab in the course folder, open at notebooks/"
	@echo "make test           set up .venv, then the linter, unit tests, strict nbval and notebook hygiene"
	@echo "make test-fast      the edit-test loop: the linter and the unit tests not marked slow (no notebooks)"
	@echo "make lint           ruff on ptlab, tests, tools and the notebooks (pyproject.toml says which rules)"
	@echo "make test-second-config  strict nbval again at 1 thread, without ATen SIMD (other float digits)"
	@echo "make test-browser   every notebook and widget in real JupyterLab + Chromium"
	@echo "make notebooks      re-execute every notebook in place (refresh committed outputs)"
	@echo "make bench          run every notebook once: time, slowest cell, peak RSS, checked share"
	@echo "make bench-busy     every notebook quiet, then beside one busy process: the busy/quiet ratios"
	@echo "make bench-avx2     the same, with AVX-512 switched off (the CPU the budgets are set for)"
	@echo "make gpu-check      on a GPU machine: every notebook on CUDA, claims asserted, the GPU tests; gpu-report/"
	@echo "make gpu-wheels     .gpu-wheels/: the wheels a GPU machine with its own torch needs for gpu-check"
	@echo "make handout        a zip for learners: no solutions, no answers, one top-level folder"
	@echo "make lock           recompile requirements.lock from requirements.in (needs uv)"
	@echo "make clean          remove .venv and test artefacts (do this if set-up says the venv is broken)"

# Python too old, no venv module, a venv that was moved or made by another Python: say so before pip does.
check-setup:
	@$(PYTHON) tools/check_setup.py $(VENV)

$(READY): requirements.lock pyproject.toml tools/jupyterlab-overrides.json | check-setup
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned environment into $(VENV): a few minutes and about 6.4 GB (torch with CUDA) on Linux."
	$(PY) -m pip install --disable-pip-version-check --progress-bar on --require-hashes -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# JupyterLab settings for this venv only (your own JupyterLab is untouched): no news pop-up.
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp tools/jupyterlab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $@

setup: check-setup $(READY)

# JupyterLab refuses to run as root without --allow-root (Docker, CI); a normal user never needs it.
# Rooted at the course folder, so docs/ (decisions.md) and README.md open in JupyterLab and a notebook's link to
# ../docs/decisions.md resolves; the browser opens at notebooks/ (the file browser starts there).
LAB_ARGS := --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks
lab: check-setup $(READY)
	$(VENV)/bin/jupyter lab $(LAB_ARGS) --port=$(PORT) $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

doctor: check-setup $(READY)
	$(PY) -m ptlab doctor

lint: check-setup $(READY)
	$(PY) -m ruff check .

test: check-setup $(READY)
	$(PY) -m ruff check .
	$(PY) -m ptlab doctor
	$(PY) -m pytest tests notebooks --ignore=tests/browser $(NBVAL)

test-fast: check-setup $(READY)
	$(PY) -m ruff check .
	$(PY) -m pytest tests --ignore=tests/browser -m "not slow and not browser" -q

test-unit: check-setup $(READY)
	$(PY) -m pytest tests --ignore=tests/browser

test-notebooks: check-setup $(READY)
	$(PY) -m pytest notebooks $(NBVAL)

test-second-config: check-setup $(READY)
	env $(SECOND_CONFIG) $(PY) -m pytest notebooks $(NBVAL) -p no:cacheprovider

# Needs Debian's chromium (apt-get install -y chromium; PTLAB_CHROMIUM=path for another one).
# PTLAB_UPDATE_DOCS=1 also refreshes docs/widget.png from the screenshot it takes.
test-browser: check-setup $(READY)
	@test -x "$${PTLAB_CHROMIUM:-/usr/bin/chromium}" || { echo "make test-browser: no chromium at $${PTLAB_CHROMIUM:-/usr/bin/chromium}; install it: sudo apt-get install -y chromium" >&2; exit 1; }
	$(PY) -m pytest tests/browser -m browser -p no:cacheprovider -v

# Outputs are regenerated on the CPU (a GPU would print its name in error messages and reprs): the
# command starts every kernel with PTLAB_DEVICE=cpu and CUDA_VISIBLE_DEVICES="" (ptlab.course.nbrun.CPU_ONLY_ENV).
notebooks: check-setup $(READY)
	$(PY) -m ptlab notebooks notebooks

# The doctor's one-line torch.compile builds Inductor's C++ header for this CPU capability first, as
# a prepared laptop has it: chapter 8's first compile is then measured warm.
bench: check-setup $(READY)
	$(PY) -m ptlab doctor
	$(PY) -m ptlab bench notebooks

# Every notebook quiet, then beside one busy process (pure Python on one core): the busy/quiet ratios.
bench-busy: check-setup $(READY)
	$(PY) -m ptlab doctor
	$(PY) -m ptlab bench --busy notebooks

bench-avx2: check-setup $(READY)
	env $(AVX2_CPU) $(PY) -m ptlab doctor
	env $(AVX2_CPU) $(PY) -m ptlab bench notebooks

# On a GPU machine (README, "On a GPU"): at most 8 minutes on one H200; report in gpu-report/ ($$OUT when set).
# It runs on whatever Python and torch are there, so it uses them rather than this venv when there is none.
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(GPU_PY) -m ptlab gpu-check

# A borrowed GPU machine has its own torch and torchvision and no PyPI: carry these (at requirements.lock's pins,
# with what they need, less what torch and torchvision pull in), for CPython 3.12 manylinux x86-64 and this Python.
# Add a package the report names as missing: make gpu-wheels GPU_WHEELS="$(GPU_WHEELS) matplotlib" (~17 MiB).
GPU_WHEELS ?= nbclient nbformat nbval ipykernel ipywidgets pytest pytest-timeout tqdm psutil
gpu-wheels: check-setup $(READY)
	$(PY) tools/gpu_wheels.py --lock requirements.lock --dest .gpu-wheels $(GPU_WHEELS)

catalogue: check-setup $(READY)
	$(PY) -m ptlab catalogue --write

lock:
	uv pip compile requirements.in --universal --python-version 3.10 --generate-hashes --no-header \
		--custom-compile-command "make lock" -o requirements.lock

# The learners' copy: everything but the solutions and tests/answers (every exercise answer), in one
# top-level folder. Made from the committed HEAD, so commit first.
HANDOUT ?= ptlab-handout
HANDOUT_ZIP ?= $(HANDOUT).zip
handout:
	git archive --format=zip --prefix=$(HANDOUT)/ -o $(HANDOUT_ZIP) HEAD -- . \
		':(exclude)notebooks/solutions' ':(exclude)tests/answers'
	@echo "wrote $(HANDOUT_ZIP): unzip, cd $(HANDOUT), make lab. Publish notebooks/solutions/ after the session."

clean:
	rm -rf $(VENV) .pytest_cache artifacts
