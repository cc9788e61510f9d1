# loopscope: two commands do all set-up on a fresh machine.
#   make repro   venv + pinned deps + corpus (params.yaml's data:) + the cost estimate
#                (loopscope.tools.plan --brief) + `dvc repro` -> reports/html/*.html
#   make test    venv + pinned deps + pytest: the fast tests (all but those marked slow),
#                on two workers, one test at a time
#   make test-slow   the slow tests only (the micro `dvc repro`, its experiments and queue,
#                the remote, the reliability runs through DVC, the torchrun launches), on
#                two workers; the tests of the one shared micro `dvc repro` on one of them
#   make test-all    every test, fast and slow, as test-slow runs them
#                (CI, .ci/run: make test, then make test-slow)
#   make setup   venv + pinned deps only (e.g. before `dvc pull`)
#   make lock    requirements.lock (every installed package's version) from the venv
#   make depth   paper B's depth-use search (loopscope.tools.levers): queue its `dvc exp` runs,
#                run them one after another, write docs/depth.md from their results
#   make screenshots   reports/html/*.html -> reports/screenshots/*.png in headless
#                Chromium (Debian's `chromium` package), offline, full page
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
# Stage commands say `python`: run them, and dvc, from the venv.
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup lock repro test test-slow test-all lint data depth screenshots clean-venv

# The install: uv (from the package index, by pip) installs the project and its pins,
# constrained by requirements.lock, byte-compiling on both cores: 25 s where pip alone
# takes 75 s. uv reads no pip configuration: a wheel folder or index given to pip by
# PIP_FIND_LINKS, PIP_INDEX_URL or PIP_EXTRA_INDEX_URL (the CPU build of torch, say) is
# handed on as uv's own.
UV_VERSION := 0.13.9
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
ifdef PIP_INDEX_URL
export UV_INDEX_URL ?= $(PIP_INDEX_URL)
endif
ifdef PIP_EXTRA_INDEX_URL
export UV_EXTRA_INDEX_URL ?= $(PIP_EXTRA_INDEX_URL)
endif
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	  -c requirements.lock -e '.[dev]'
	touch $@

# requirements.lock from the venv as it is (after a change to pyproject.toml's pins:
# edit the pin, `make setup`, `make lock`); local build labels (+cpu) are left off, so
# the lock admits whichever build of torch the index gives
lock: $(STAMP)
	{ sed -n '1,3p' requirements.lock; $(BIN)/uv pip freeze --python $(BIN)/python \
	  --exclude-editable | grep -v '^uv==' | sed -E 's/\+[A-Za-z0-9.]+$$//'; } \
	  > requirements.lock.tmp && mv requirements.lock.tmp requirements.lock

setup: $(STAMP)

data: $(STAMP)
	$(BIN)/python -m loopscope.weights.corpus

# The estimate first (a few seconds: a matmul probe on this machine), then configure
# forced (train.precision auto resolves on this machine: where it resolves as the configs
# say, they come out byte for byte and nothing reruns), then the run, then README's
# timings block: what each stage really took (`python -m loopscope.base.timings`
# itemizes it).
repro: data
	$(BIN)/python -m loopscope.tools.plan params.yaml --brief
	$(BIN)/dvc repro --force configure
	$(BIN)/dvc repro
	$(BIN)/python -m loopscope.render.summary timings

depth: data
	$(BIN)/python -m loopscope.tools.levers queue
	$(BIN)/dvc exp run --run-all
	$(BIN)/python -m loopscope.tools.levers collect

# The tests go to the workers one by one (loadgroup: the tests of an xdist_group mark
# share a worker), so a long test file does not keep one worker busy alone. The tests of
# the session's one from-scratch micro `dvc repro` (conftest.SHARES_REPRO, in
# test_pipeline and test_remote) are one such group: one worker runs it once for them all.
PYTEST := $(BIN)/python -m pytest -q -n 2 --durations=15 --dist loadgroup
test: $(STAMP)
	$(PYTEST) -m "not slow"

# pytest exits 5 when it selects no test: no slow test is not a failure
test-slow: $(STAMP)
	$(PYTEST) -m slow || test $$? -eq 5

test-all: $(STAMP)
	$(PYTEST)

# Full page: headless Chromium captures only its window, so the window is
# SCREENSHOT_WIDTH x SCREENSHOT_HEIGHT px (a height any report fits in) and the blank rows
# below the page are cut off; a taller page fails, naming SCREENSHOT_HEIGHT. Offline:
# every host name resolves to nothing, so the PNG shows what a reader without network sees.
SCREENSHOT_HTML ?= reports/html
SCREENSHOT_DIR ?= reports/screenshots
SCREENSHOT_WIDTH ?= 1400
SCREENSHOT_HEIGHT ?= 20000
screenshots: $(STAMP)
	@command -v chromium >/dev/null || { echo "make screenshots: no chromium on PATH;" \
	  "install Debian's package: sudo apt-get install -y chromium" >&2; exit 1; }
	$(BIN)/python -m loopscope.render.screenshots $(SCREENSHOT_HTML) $(SCREENSHOT_DIR) \
	  --width $(SCREENSHOT_WIDTH) --height $(SCREENSHOT_HEIGHT)

lint: $(STAMP)
	$(BIN)/ruff check src stages tests

clean-venv:
	rm -rf $(VENV)
