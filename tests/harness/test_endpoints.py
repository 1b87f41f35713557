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


@pytest.mark.parametrize(("entry", "said"), [
    ({"concurrency": "lots"}, "models.m.concurrency: Input should be a valid integer, got 'lots'"),
    ({"concurrency": True}, "models.m.concurrency: Input should be a valid integer, got True"),
    ({"concurrency": 0}, "models.m.concurrency: must be >= 1, got 0"),
    ({"timeout": float("inf")}, "models.m.timeout: must be a finite number, got inf"),
    ({"timeout": "30"}, "models.m.timeout: Input should be a valid number"),
    ({"max_attempts": 2.5}, "models.m.max_attempts: Input should be a valid integer"),
    ({"api_key_env": ["KEY"]}, "models.m.api_key_env: Input should be a valid string"),
    ({"enforce_eager": "yes"}, "models.m.enforce_eager: Input should be a valid boolean"),
    ({"served": [1, 2]}, "models.m: served must be the model name its servers know (a string), got [1, 2]"),
    ({"identity": {"weights": [1]}}, "models.m: identity.weights must be a string, got [1]"),
    ({"base_url": "http://"}, "models.m: base_url must be an http(s) URL with a host"),
    ({"base_url": "http://:8000/v1"}, "base_url must be an http(s) URL with a host"),
    ({"base_url": "http://a:99999/v1"}, "base_url must be an http(s) URL with a host"),
    ({"base_url": "http://a/v1\r\nX-Injected: 1"}, "base_url must be an http(s) URL with a host"),
    ({"base_url": "http://a b/v1"}, "base_url must be an http(s) URL with a host"),
    ({"base_url": ["http://a/v1", " http://b/v1"]}, "base_url must be an http(s) URL with a host"),
    ({"base_url": ["http://a/v1", "http://a/v1/"]}, "models.m: base_url lists http://a/v1/ twice"),
], ids=lambda v: str(v)[:40])
def test_every_value_of_an_entry_is_checked_by_type(entry: dict, said: str):
    with pytest.raises(ConfigError) as caught:
        parse_endpoints({"m": {"base_url": "http://a/v1", **entry}}, where="e.yaml")
    assert str(caught.value).startswith("e.yaml: ") and said in str(caught.value)
    assert "\n" not in str(caught.value)


def test_typed_options_are_kept_and_a_spec_must_be_a_string():
    found = parse_endpoints({"m": {"base_url": "https://a:8000/v1", "timeout": 5, "api_key_env": None,
                                   "tensor_parallel_size": None, "enforce_eager": True}}, where="e")
    assert found["m"].options == {"timeout": 5.0, "api_key_env": None, "tensor_parallel_size": None,
                                  "enforce_eager": True}
    with pytest.raises(ConfigError, match="models: 5 is not a model spec"):
        parse_endpoints({5: {"base_url": "http://a/v1"}}, where="e")


def test_an_entry_for_no_model_of_the_run_is_refused_naming_the_run_s_models():
    from harness.endpoints import check_matched

    endpoints = parse_endpoints({"vllm:Qwen/Qwen3-8B": {"base_url": "http://a/v1"},
                                 "vllm:Qwen/Qwen3-30B-A3b": {"base_url": "http://b/v1"}}, where="e.yaml")
    needs = {"row": frozenset({"vllm:Qwen/Qwen3-8B", "vllm:Qwen/Qwen3-30B-A3B[dtype=float32]"})}
    with pytest.raises(ConfigError) as caught:
        check_matched(endpoints, needs, left_out={})
    assert str(caught.value) == (
        "e.yaml: models.vllm:Qwen/Qwen3-30B-A3b: no model of this run has that spec (did you mean "
        "'vllm:Qwen/Qwen3-30B-A3B'?); the run's models: vllm:Qwen/Qwen3-30B-A3B, vllm:Qwen/Qwen3-8B")
    slash = parse_endpoints({"vllm:/ckpt/g/": {"base_url": "http://a/v1"}}, where="e.yaml")
    with pytest.raises(ConfigError, match="differs from vllm:/ckpt/g by a trailing slash"):
        check_matched(slash, {"row": frozenset({"vllm:/ckpt/g"})}, left_out={})
    check_matched(parse_endpoints({"vllm:Qwen/Qwen3-8B": {"base_url": "http://a/v1"}}, where="e"), needs,
                  left_out={"benchmark x": "no data"})
    # With a row left out the run's models are not all known: nothing is refused.
    assert check_matched(endpoints, needs, left_out={"evaluator scalar-rm:model=x": "not found"}) == []
    # An entry for a model no row calls, like none the run would run here (a whole table's file given to one
    # cell), is named, not refused; one close to a model that another entry serves is not a misspelling of it.
    other = parse_endpoints({"vllm:Qwen/Qwen3-8B": {"base_url": "http://a/v1"},
                             "vllm:Skywork/Skywork-Reward": {"base_url": "http://c/v1"},
                             "vllm:Qwen/Qwen3-8b": {"base_url": "http://d/v1"}}, where="e.yaml")
    assert check_matched(other, {"row": frozenset({"vllm:Qwen/Qwen3-8B"})}, left_out={}) == [
        "e.yaml: models.vllm:Skywork/Skywork-Reward: no model of this run has that spec; the entry is unused",
        "e.yaml: models.vllm:Qwen/Qwen3-8b: no model of this run has that spec; the entry is unused"]


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
