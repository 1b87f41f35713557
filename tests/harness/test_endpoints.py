"""Per-model endpoints: the `models:` mapping and endpoints files, checked before any call; a served model's
identity; a training job's frozen models on their own servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.backends.base import BackendOptions
from harness.endpoints import parse_endpoints, read_endpoints, served_backend
from harness.errors import ConfigError


def test_the_models_mapping_and_its_errors(tmp_path: Path):
    found = parse_endpoints({"vllm:Qwen/Qwen3-8B": {"base_url": "http://a:8000/v1", "concurrency": 8},
                             "vllm:Qwen/Qwen3-30B-A3B": {"base_url": ["http://b:8000/v1", "http://c:8000/v1"],
                                                         "identity": {"revision": "abc"}}}, where="c.yaml")
    assert found["vllm:Qwen/Qwen3-8B"].options == {"concurrency": 8}
    assert found["vllm:Qwen/Qwen3-30B-A3B"].urls == ("http://b:8000/v1", "http://c:8000/v1")
    for bad, message in (({"m": {"concurrency": 3}}, "c.yaml: models.m: needs base_url"),
                         ({"m": {"base_url": "localhost:8000"}}, "base_url must be an http(s) URL"),
                         ({"m": {"base_url": "http://a/v1", "concurency": 3}}, "unknown setting 'concurency'"),
                         ({"m": {"base_url": "http://a/v1"}, "n": {"base_url": "http://a/v1/"}},
                          "models.m and models.n name the same server http://a/v1/; a server serves one model")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_endpoints(bad, where="c.yaml")
    path = tmp_path / "endpoints.yaml"
    path.write_text(json.dumps({"models": {"vllm:x": {"base_url": "http://a/v1"}}, "extra": 1}))
    with pytest.raises(ConfigError, match="unknown key 'extra'"):
        read_endpoints(path)


def test_a_served_model_is_named_as_its_server_knows_it_and_identified_by_its_weights():
    served = parse_endpoints({"vllm:Qwen/Qwen3-8B": {"base_url": "http://a:8000/v1",
                                                     "identity": {"revision": "abc"}}}, where="c")
    backend = served_backend("vllm:Qwen/Qwen3-8B", served["vllm:Qwen/Qwen3-8B"], BackendOptions())
    assert backend.model == "Qwen/Qwen3-8B"
    assert backend.identity() == {"kind": "openai", "model": "Qwen/Qwen3-8B", "revision": "abc"}
    plain = parse_endpoints({"openai:gpt-x": {"base_url": "http://a:8000/v1", "api_key_env": None}}, where="c")
    assert served_backend("openai:gpt-x", plain["openai:gpt-x"], BackendOptions()).identity()["base_url"] \
        == "http://a:8000/v1"


@pytest.mark.slow
def test_a_training_job_identifies_its_frozen_models_by_their_servers(tmp_path: Path):
    from tiny_models import build_tiny_lm

    from training.grpo import TrainConfig
    from training.job import prepare

    tiny = build_tiny_lm(tmp_path / "tiny")
    config = TrainConfig(model=f"hf:{tiny}", output_dir=tmp_path / "out", verifier="vllm:Qwen/Qwen3-30B-A3B",
                         generator="vllm:checkpoints/g", grpo={"max_steps": 1},
                         models={"vllm:Qwen/Qwen3-30B-A3B": {"base_url": "http://v:8000/v1",
                                                             "identity": {"revision": "r1"}},
                                 "vllm:checkpoints/g": {"base_url": "http://g:8000/v1"}})
    job = prepare("policy", config)
    assert job.parents["verifier"]["identity"] == {"kind": "openai", "model": "Qwen/Qwen3-30B-A3B", "revision": "r1"}
    assert job.parents["generator"]["identity"]["base_url"] == "http://g:8000/v1"
    assert "models" not in job.settings  # where a model is served is not what the checkpoint is bound to
