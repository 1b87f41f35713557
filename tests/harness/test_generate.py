import asyncio
import json
from pathlib import Path

from fakes import ScriptedBackend

from harness.backends.base import user_chat
from harness.cache import CachedBackend, CallCache
from harness.generation import GenerateConfig, PromptRecord, run_generate


def _prompts(*texts: str) -> list[PromptRecord]:
    return [PromptRecord(f"p{i}", user_chat(t)) for i, t in enumerate(texts)]


def _run(backend, prompts, out: Path, **config):
    cfg = GenerateConfig(model="scripted", source="test", **config)
    return asyncio.run(run_generate(backend, prompts, cfg, out))


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_one_line_per_prompt_and_sample_with_derived_seeds(tmp_path: Path):
    out = tmp_path / "gen.jsonl"
    summary = _run(ScriptedBackend(), _prompts("a", "b"), out, n=3, temperature=1.0, seed=5)
    lines = _lines(out)
    assert [(x["id"], x["sample"]) for x in lines] == [(f"p{i}", s) for i in range(2) for s in range(3)]
    assert all(x["schema"] == "generation/1" for x in lines)
    assert (summary.total, summary.complete, summary.with_failures) == (6, 6, 0)
    assert len({x["text"] for x in lines}) == 6  # every sample its own seed
    again = tmp_path / "again.jsonl"
    _run(ScriptedBackend(), _prompts("a", "b"), again, n=3, temperature=1.0, seed=5)
    assert [x["text"] for x in _lines(again)] == [x["text"] for x in lines]  # seeds derive from run seed + id
    other = tmp_path / "other.jsonl"
    _run(ScriptedBackend(), _prompts("a", "b"), other, n=3, temperature=1.0, seed=6)
    assert [x["text"] for x in _lines(other)] != [x["text"] for x in lines]
    manifest = json.loads(out.with_name("gen.jsonl.manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["settings"]["n"] == 3
    assert manifest["summary"]["complete"] == 6 and manifest["summary"]["written"] == 6


def test_resume_skips_answered_and_retries_failed(tmp_path: Path):
    out = tmp_path / "gen.jsonl"
    backend = ScriptedBackend()
    summary = _run(backend, _prompts("ok", "FAIL me"), out)
    assert (summary.complete, summary.with_failures, summary.failures) == (1, 1, {"server_error": 1})
    assert _lines(out)[1]["error"]["category"] == "server_error"
    manifest = json.loads(out.with_name("gen.jsonl.manifest.json").read_text())
    assert manifest["status"] == "finished_with_failures"

    backend.fail_marker = "never"
    summary = _run(backend, _prompts("ok", "FAIL me"), out)
    assert (summary.complete, summary.with_failures, summary.skipped, summary.written) == (2, 0, 1, 1)
    assert [r.messages[-1].content for r in backend.requests] == ["ok", "FAIL me", "FAIL me"]
    lines = _lines(out)
    assert [(x["id"], x["error"]) for x in lines] == [("p0", None), ("p1", None)]  # compacted: one line per key

    summary = _run(backend, _prompts("ok", "FAIL me"), out)
    assert summary.skipped == 2 and summary.written == 0 and len(backend.requests) == 3


def test_identical_run_into_new_file_is_all_cache_hits(tmp_path: Path):
    cache = CallCache(tmp_path / "calls.sqlite")
    inner = ScriptedBackend()
    first = _run(CachedBackend(inner, cache), _prompts("a", "b", "c"), tmp_path / "1.jsonl", n=2, temperature=0.7)
    assert first.backend_calls == 3 and first.cache_hits == 0
    second = _run(CachedBackend(inner, cache), _prompts("a", "b", "c"), tmp_path / "2.jsonl", n=2, temperature=0.7)
    assert second.backend_calls == 0 and second.cache_hits == 3
    assert len(inner.requests) == 3
    assert [x["text"] for x in _lines(tmp_path / "2.jsonl")] == [x["text"] for x in _lines(tmp_path / "1.jsonl")]


def test_stop_strings_reach_the_request_and_bind_the_output(tmp_path: Path):
    backend = ScriptedBackend()
    out = tmp_path / "gen.jsonl"
    _run(backend, _prompts("a"), out, stop=("\n\n", "###"))
    assert backend.requests[0].params.stop == ("\n\n", "###")
    manifest = json.loads(out.with_name("gen.jsonl.manifest.json").read_text())
    assert manifest["settings"]["stop"] == ["\n\n", "###"]
    plain = tmp_path / "plain.jsonl"
    _run(ScriptedBackend(), _prompts("a"), plain)
    assert "stop" not in json.loads(plain.with_name("plain.jsonl.manifest.json").read_text())["settings"]


def test_benchmark_prompts_take_loader_options(shared_data: Path):
    import pytest

    from harness.commands.prompts import benchmark_prompts
    from harness.errors import ConfigError

    found = benchmark_prompts("writingbench", data_dir=shared_data, limit=2, options={"subset": "length"})
    assert len(found) == 2 and all(p.id.startswith("writingbench:") for p in found)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) flavour; valid: subset, version"):
        benchmark_prompts("writingbench", data_dir=shared_data, limit=2, options={"flavour": "x"})
