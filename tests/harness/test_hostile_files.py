"""Files written to break their readers: nesting deeper than the parsers' recursion limit, a YAML key written
twice, and a `layer_types` that does not match the layers. Each gets one error naming the file (and the line where
there is one), never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_yaml, read_yaml_mapping
from harness.errors import TOO_DEEP, ConfigError
from harness.records import EvalRecord
from harness.runstore import Manifest, RecordLog
from harness.weights import attention_shape, read_config
from training.plots import read_log

DEEP = 100_000
"""Levels of nesting: far past CPython's recursion limit (1,000) and its C stack guard."""


def deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


def test_a_config_json_nested_too_deeply_names_the_file(tmp_path: Path):
    (tmp_path / "config.json").write_text(deep_json())
    with pytest.raises(ConfigError, match=r"config\.json: nested too deeply") as err:
        read_config(tmp_path)
    assert TOO_DEEP in str(err.value)


def test_an_endpoints_file_nested_too_deeply_names_the_file(tmp_path: Path):
    path = tmp_path / "endpoints.yaml"
    path.write_text("models: " + "[" * 50_000 + "]" * 50_000)
    with pytest.raises(ConfigError, match=rf"{path}: the endpoints file is nested too deeply"):
        read_yaml_mapping(path, what="endpoints file")


def test_a_records_line_and_a_manifest_nested_too_deeply_name_the_file_and_line(tmp_path: Path):
    records = tmp_path / "records.jsonl"
    records.write_text("{}\n" + '{"a": ' + deep_json() + "}\n")
    with pytest.raises(ConfigError, match=rf"{records}:1: "):  # line 1 is no record either: the first error wins
        RecordLog(records, EvalRecord)
    records.write_text('{"a": ' + deep_json() + "}\n")
    with pytest.raises(ConfigError, match=rf"{records}:1: malformed record line \(nested too deeply"):
        RecordLog(records, EvalRecord)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(deep_json())
    with pytest.raises(ConfigError, match=rf"{manifest}: cannot read the manifest \(nested too deeply"):
        Manifest(manifest).read()


def test_a_training_log_line_nested_too_deeply_names_its_line(tmp_path: Path):
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n' + deep_json() + "\n")
    with pytest.raises(ConfigError, match=rf"{log}:2: nested too deeply"):
        read_log(log)


def plan(tmp_path: Path, data: Path, config: str, *args: str) -> subprocess.CompletedProcess:
    """`harness plan table1` of one row whose generator is the local model `gen/` holding `config` as its
    config.json."""
    model = tmp_path / "gen"
    model.mkdir()
    (model / "config.json").write_text(config)
    (tmp_path / "rows.yaml").write_text(
        "benchmarks: [ultrafeedback]\nonly_rows: [Qwen3-8B zero-shot]\n"
        "rows:\n  Qwen3-8B zero-shot: dynamic-rubric:generator=vllm:gen\n")
    return subprocess.run([sys.executable, "-m", "harness", "plan", "table1", "--config", "rows.yaml",
                           "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_plan_on_a_deeply_nested_config_json_exits_2_with_one_line(tmp_path: Path, shared_data: Path):
    done = plan(tmp_path, shared_data, deep_json())
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "config.json: nested too deeply" in line


def test_a_key_written_twice_is_refused_with_both_lines(tmp_path: Path):
    path = tmp_path / "table5.yaml"
    path.write_text("generators:\n  G: openai:a\n  H: openai:h\n  G: openai:b\n")
    with pytest.raises(ConfigError) as err:
        read_yaml_mapping(path, what="table config")
    assert str(err.value) == (f"{path}: the table config is not valid YAML: the key 'G' is written twice "
                              "(first at line 2) at line 4, column 3")


def test_keys_are_told_apart_by_value_and_a_merge_may_override():
    assert load_yaml("a: 1\n1: 2\n'1': 3\n") == {"a": 1, 1: 2, "1": 3}
    assert load_yaml("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  a: 3\n")["x"] == {"a": 3, "b": 2}
    assert load_yaml("- {a: 1}\n- {a: 2}\n") == [{"a": 1}, {"a": 2}]  # the same key in two mappings


def _config(**extra) -> dict:
    return {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 16, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 128,
            "sliding_window": 512, **extra}


def test_layer_types_must_list_one_kind_per_layer():
    fine = attention_shape(_config(layer_types=["sliding_attention", "full_attention"]))
    assert fine.sliding_layers == 1 and fine.sliding_window == 512
    with pytest.raises(ConfigError, match=r"layer_types must list one kind per layer \(2 layers.*got 1000 entries"):
        attention_shape(_config(layer_types=["sliding_attention"] * 1000))
    with pytest.raises(ConfigError, match="got a str"):
        attention_shape(_config(layer_types="sliding_attention"))


def test_plan_refuses_a_layer_types_longer_than_the_layers(tmp_path: Path, shared_data: Path):
    config = {**_config(layer_types=["sliding_attention"] * 1000), "architectures": ["Gemma3ForCausalLM"]}
    done = plan(tmp_path, shared_data, json.dumps(config), "--gpus", "1", "--gpu-memory", "80")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "layer_types must list one kind per layer" in done.stderr and "Traceback" not in done.stderr
