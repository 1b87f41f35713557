"""`harness generate` end to end against loopback OpenAI-compatible servers, as a user runs it (subprocesses)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from faults import ALWAYS, KEY, KEY_ENV, FaultyServer

from harness.loopback import openai_handler, serve_in_thread


def harness(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write_prompts(path: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": rid, "prompt": rid}) + "\n" for rid in ids))
    return path


def test_faulty_server_run_records_every_failure_and_leaks_no_key(tmp_path: Path):
    rids = [f"req-{i}" for i in range(60)] + list(ALWAYS)
    prompts = _write_prompts(tmp_path / "prompts.jsonl", rids)
    out = tmp_path / "run" / "gen.jsonl"
    env = {
        KEY_ENV: KEY,
        "HARNESS_CACHE_DIR": str(tmp_path / "cache"),
        "HARNESS_CALL_CACHE": str(tmp_path / "cache" / "calls.sqlite"),
    }
    server = FaultyServer()
    with serve_in_thread(server) as url:
        args = [
            "generate",
            "--model",
            "openai:test-model",
            "--base-url",
            url,
            "--api-key-env",
            KEY_ENV,
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--timeout",
            "0.5",
            "--max-attempts",
            "4",
            "--concurrency",
            "16",
        ]
        first = harness("--debug", *args, env=env)
        assert sum(server.faults.values()) >= 0.2 * sum(server.attempts.values())
        second = harness(*args, env=env)

    assert first.returncode == 1, first.stderr[-2000:]
    assert "65 samples (60 complete, 5 with failures, 0 already done)" in first.stdout
    lines = _lines(out)
    keys = [(x["id"], x["sample"]) for x in lines]
    assert len(keys) == len(set(keys)) == 65  # one line per (id, sample), nothing duplicated
    by_id = {x["id"]: x for x in lines}
    for rid in rids:
        if rid in ALWAYS:
            assert by_id[rid]["text"] is None and by_id[rid]["error"]["category"] == ALWAYS[rid].value
        else:
            assert by_id[rid]["error"] is None and by_id[rid]["text"] == f"answer:{rid}"

    # Failures never reach the cache: exactly the 60 answers are stored.
    with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as db:
        values = [json.loads(v) for (v,) in db.execute("SELECT value FROM calls")]
    assert sorted(values) == sorted(f"answer:req-{i}" for i in range(60))

    # The rerun resumes: only the 5 failed requests are retried, still recorded once each.
    assert second.returncode == 1
    assert "backend calls: 5" in second.stdout and "60 already done" in second.stdout
    assert len(_lines(out)) == 65

    # The key appears in no file written and in no output, although the server echoed it back in error bodies.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != prompts]
    assert any(p.name == "gen.jsonl.manifest.json" for p in written)
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    for proc in (first, second):
        assert KEY not in proc.stdout + proc.stderr


def test_second_identical_run_makes_zero_backend_calls(tmp_path: Path):
    prompts = _write_prompts(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(20)])
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    with serve_in_thread(openai_handler(text="hello")) as url:
        common = [
            "generate",
            "--model",
            "openai:loopback",
            "--base-url",
            url,
            "--prompts",
            str(prompts),
            "--n",
            "2",
            "--temperature",
            "0.8",
        ]
        first = harness(*common, "--out", str(tmp_path / "a.jsonl"), env=env)
        second = harness(*common, "--out", str(tmp_path / "b.jsonl"), env=env)
    assert first.returncode == 0, first.stderr
    assert "backend calls: 20, cache hits: 0" in first.stdout
    assert second.returncode == 0, second.stderr
    assert "backend calls: 0, cache hits: 20" in second.stdout
    assert all(x["cached"] for x in _lines(tmp_path / "b.jsonl"))
    stats = harness("cache", "stats", env=env)
    assert "entries: 40" in stats.stdout and "hits:    20" in stats.stdout and "misses:  20" in stats.stdout
