"""Training memory: the activations of one micro-batch (the longest prompt plus the completion, the batch, gradient
checkpointing) reach the training plan instead of a flat allowance, before and after the rows are read; and an
in-process `vllm:` frozen model is refused beside TRL's colocated vLLM, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from paper_configs import QWEN3_8B

from harness.backends.base import BackendOptions
from harness.errors import ConfigError
from harness.plan import Devices, activation_gib, check_training
from harness.weights import read_config
from training.grpo import TrainConfig
from training.job import CHAT_TOKENS, NECTAR_PROMPT_TOKENS, _check_frozen_engines, _check_rows_fit, load

H100 = Devices(gpus=1, gpu_memory_gib=80.0)
SMALL = {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 300,
         "gradient_checkpointing": True}


def _policy(tmp_path: Path, model: str, **grpo) -> TrainConfig:
    return TrainConfig(model=model, output_dir=tmp_path / "p", verifier="openai:v", generator="openai:g",
                       grpo={**SMALL, **grpo})


def _tokens(tiny_lm: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tiny_lm)(text, add_special_tokens=False)["input_ids"])


def test_the_activations_of_the_rows_longest_prompt_reach_the_plan(tmp_path: Path, tiny_lm: Path):
    config = _policy(tmp_path, f"hf:{tiny_lm}")
    prompts = ["short", "a much longer prompt that the rows hold " * 40, "mid " * 10]
    found = load("policy", config, BackendOptions(), {}, H100, processes=1, prompts=prompts)
    longest = max(_tokens(tiny_lm, p) for p in prompts) + CHAT_TOKENS
    shape = read_config(tiny_lm)
    assert found.activations_gib == activation_gib(shape, batch=4, prompt_tokens=longest, completion_tokens=300,
                                                   checkpointing=True)
    assert (f"4 sequence(s) of {longest} prompt + 300 completion tokens, gradient checkpointing on; the rows' "
            f"longest prompt, counted with {tiny_lm}'s tokenizer") == found.activations_for
    # Before the rows are read: the assumed Nectar prompt; without checkpointing every layer keeps its tensors.
    assumed = load("policy", _policy(tmp_path, f"hf:{tiny_lm}", gradient_checkpointing=False), BackendOptions(), {},
                   H100, processes=1)
    assert assumed.activations_gib == activation_gib(shape, batch=4, prompt_tokens=NECTAR_PROMPT_TOKENS + CHAT_TOKENS,
                                                     completion_tokens=300, checkpointing=False)
    assert "checkpointing off; a Nectar prompt of 2048 tokens assumed" in assumed.activations_for


def test_the_generators_prompt_holds_its_request_over_a_whole_set(tmp_path: Path, tiny_lm: Path):
    from judges.dynamic import dynamic_generator_prompt

    config = TrainConfig(model=f"hf:{tiny_lm}", output_dir=tmp_path / "g", verifier="openai:v", grpo=SMALL,
                         data={"sets": {"policy": "openai:p", "set_size": 3, "max_tokens": 50}})
    found = load("generator", config, BackendOptions(), {}, H100, processes=1, prompts=["the question " * 5])
    frame = _tokens(tiny_lm, dynamic_generator_prompt("", ["", "", ""], [0, 1, 2]))
    prompt = _tokens(tiny_lm, "the question " * 5) + frame + 3 * 50 + CHAT_TOKENS
    assert found.activations_gib == activation_gib(read_config(tiny_lm), batch=4, prompt_tokens=prompt,
                                                   completion_tokens=300, checkpointing=True)


def test_the_paper_generator_at_batch_8_is_refused_on_an_80_gb_gpu_and_fits_at_batch_2(tmp_path: Path):
    """Qwen3-8B, 8 responses of 2K tokens a set: the activations, not a flat 4 GiB, decide (issue 31, item 6)."""
    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_8B))
    sets = {"policy": "openai:p", "set_size": 8, "max_tokens": 2048}
    paper = {"per_device_train_batch_size": 8, "num_generations": 8, "max_completion_length": 1024,
             "gradient_checkpointing": True, "use_vllm": True, "vllm_mode": "colocate",
             "vllm_gpu_memory_utilization": 0.3}
    config = TrainConfig(model=f"hf:{folder}", output_dir=tmp_path / "g", verifier="openai:v", grpo=paper,
                         data={"sets": sets})
    found = load("generator", config, BackendOptions(), {}, H100, processes=6)
    assert found.activations_gib > 60 and "counted with UTF-8 bytes" in found.activations_for  # no tokenizer files
    with pytest.raises(ConfigError, match=r"activations \d+\.\d.*grpo.per_device_train_batch_size"):
        check_training(found, H100)
    two = config.model_copy(update={"grpo": config.grpo.model_copy(update={"per_device_train_batch_size": 2})})
    smaller = load("generator", two, BackendOptions(), {}, H100, processes=6)
    assert smaller.activations_gib == pytest.approx(found.activations_gib / 4)
    check_training(smaller, H100)


def test_train_checks_again_with_the_longest_prompt_its_rows_hold(tmp_path: Path, tiny_lm: Path, monkeypatch):
    import harness.plan

    job = SimpleNamespace(kind="policy", config=_policy(tmp_path, f"hf:{tiny_lm}"), options=BackendOptions(),
                          endpoints={})
    rows = [SimpleNamespace(prompt="a short prompt")]
    monkeypatch.setattr(harness.plan, "resolve_devices", lambda *a, **k: None)
    _check_rows_fit(job, rows + [SimpleNamespace(prompt="x " * 10**6)])  # a CPU machine: nothing to check
    tight = Devices(gpus=1, gpu_memory_gib=0.1, usable=1.0)
    monkeypatch.setattr(harness.plan, "resolve_devices", lambda *a, **k: tight)
    _check_rows_fit(job, rows)
    with pytest.raises(ConfigError, match=r"training needs .* activations"):
        _check_rows_fit(job, rows + [SimpleNamespace(prompt="x " * 10**5)])


# --- TRL's colocated vLLM and an in-process frozen engine --------------------------------------------------------

COLOCATE = {**SMALL, "per_device_train_batch_size": 2, "use_vllm": True, "vllm_mode": "colocate"}
REFUSED = (r"verifier vllm:Qwen/Qwen3-8B: an in-process vLLM engine cannot run beside TRL's colocated vLLM .*vLLM "
           r"issue 21073\); serve it \(harness serve")


def test_an_in_process_vllm_frozen_model_is_refused_beside_colocated_vllm(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: the multi-process rule does not apply
    config = TrainConfig(model="m", output_dir=tmp_path / "p", verifier="vllm:Qwen/Qwen3-8B", generator="openai:g",
                         grpo=COLOCATE)
    with pytest.raises(ConfigError, match=REFUSED):
        _check_frozen_engines("policy", config, {})
    _check_frozen_engines("policy", config, {"vllm:Qwen/Qwen3-8B": object()})  # served: fine
    for grpo in ({**COLOCATE, "vllm_mode": "server"}, {**COLOCATE, "use_vllm": False}):
        _check_frozen_engines("policy", config.model_copy(update={"grpo": config.grpo.model_validate(grpo)}), {})
    generator = TrainConfig(model="m", output_dir=tmp_path / "g", verifier="vllm:Qwen/Qwen3-8B", grpo=COLOCATE,
                            data={"sets": {"policy": "openai:p"}})
    with pytest.raises(ConfigError, match=REFUSED):
        _check_frozen_engines("generator", generator, {})
    scalar = TrainConfig(model="m", output_dir=tmp_path / "s", reward="scalar-rm:model=vllm:org/rm", grpo=COLOCATE)
    with pytest.raises(ConfigError, match=r"reward_model vllm:org/rm: an in-process vLLM engine cannot run beside"):
        _check_frozen_engines("policy", scalar, {})


def test_prepare_refuses_it_before_any_model_is_located(tmp_path: Path, tiny_lm: Path, monkeypatch):
    """The verifier is a Hub id this offline machine does not hold: locating it would fail otherwise."""
    pytest.importorskip("trl")
    from training.job import prepare

    monkeypatch.setenv("WORLD_SIZE", "1")
    config = TrainConfig(model=f"hf:{tiny_lm}", output_dir=tmp_path / "p", verifier="vllm:Qwen/Qwen3-8B",
                         generator="openai:g", grpo=COLOCATE)
    with pytest.raises(ConfigError, match=REFUSED):
        prepare("policy", config)


def test_plan_train_refuses_it_too(tmp_path: Path, tiny_lm: Path):
    from harness.commands.plan import show_train_plan

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "p"),
                                  "verifier": f"vllm:{tiny_lm}", "generator": "openai:g", "grpo": COLOCATE}))
    with pytest.raises(ConfigError, match=f"verifier vllm:{tiny_lm}: an in-process vLLM engine cannot run beside"):
        show_train_plan("policy", config, gpus=1, gpu_memory=80, processes=1, endpoints=None)
    served = tmp_path / "served.yaml"
    served.write_text(json.dumps({"models": {f"vllm:{tiny_lm}": {"base_url": "http://localhost:8001/v1"}}}))
    lines = show_train_plan("policy", config, gpus=1, gpu_memory=80, processes=1, endpoints=served)
    assert any(line.startswith("  activations: ") and "gradient checkpointing on" in line for line in lines)
    assert lines[-1].startswith("fits: ")
