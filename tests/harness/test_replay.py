"""Replayable model calls: a run records its calls in calls.sqlite, `harness cache export` gathers them into one
file, and `--replay FILE` answers a rerun from that file alone (no server, a fresh call cache), stopping with one
line on the first call it lacks."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cache import cache_key
from harness.loopback import chat_completion, json_response, models_list, serve_in_thread

JUDGE = "pairwise-judge:model=openai:judge,max_tokens=16"


async def judge(request):
    """A pairwise judge whose verdict follows a hash of the game it is shown (so items differ, replays agree)."""
    if request.method == "GET":
        return json_response(models_list("judge"))
    body = request.json()
    shown = json.dumps(body["messages"], sort_keys=True).encode()
    return json_response(chat_completion(["[[A]]" if hashlib.sha256(shown).digest()[0] % 2 else "[[B]]"],
                                         model=body["model"]))


def harness(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_CALL_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def eval_args(shared_data: Path, url: str, limit: int, out: Path) -> list[str]:
    return ["eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", str(limit), "--data-dir", str(shared_data),
            "--base-url", url, "--out", str(out)]


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())["results"]


def test_a_run_replays_from_its_exported_calls_without_a_server(tmp_path: Path, shared_data: Path):
    with serve_in_thread(judge) as url:
        done = harness(*eval_args(shared_data, url, 2, tmp_path / "run"), cache=tmp_path / "cache.sqlite")
        assert done.returncode == 0, done.stderr
    # The run recorded every call it made, with what each asked: each key is the hash of its identity, op,
    # payload and sample.
    with sqlite3.connect(tmp_path / "run" / "calls.sqlite") as conn:
        calls = dict(conn.execute("SELECT key, model FROM calls"))
        asked = conn.execute("SELECT key, identity, op, payload, sample FROM requests").fetchall()
    assert len(calls) == 4 and set(calls.values()) == {"openai:judge"}  # 2 items x 2 orders
    assert {key for key, *_ in asked} == set(calls)
    for key, identity, op, payload, sample in asked:
        assert op == "generate" and json.loads(identity)["base_url"] == url
        assert cache_key(json.loads(identity), op, json.loads(payload), sample) == key

    exported = harness("cache", "export", str(tmp_path / "run"), "--out", str(tmp_path / "calls.sqlite"),
                       cache=tmp_path / "cache.sqlite")
    assert exported.returncode == 0, exported.stderr
    assert "wrote 4 calls" in exported.stdout and "4  openai:judge" in exported.stdout
    with sqlite3.connect(tmp_path / "calls.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one self-contained file
        assert dict(conn.execute("SELECT key, model FROM calls")) == calls

    # The server is gone and the call cache is new: the replay answers everything from the file.
    fresh = tmp_path / "fresh.sqlite"
    replayed = harness(*eval_args(shared_data, url, 2, tmp_path / "run2"), "--replay", str(tmp_path / "calls.sqlite"),
                       cache=fresh)
    assert replayed.returncode == 0, replayed.stderr
    assert results(tmp_path / "run2") == results(tmp_path / "run")
    assert not fresh.exists()  # the user's cache was never opened
    manifest = json.loads((tmp_path / "run2" / "manifest.json").read_text())
    assert manifest["config"]["replay"] == str(tmp_path / "calls.sqlite")

    # Asked for more than the file holds: exit 2, one line naming the model, the operation and the request.
    more = harness(*eval_args(shared_data, url, 4, tmp_path / "run3"), "--replay", str(tmp_path / "calls.sqlite"),
                   cache=fresh)
    assert more.returncode == 2, more.stderr
    (line,) = more.stderr.strip().splitlines()
    assert line.startswith(f"error: replay file {tmp_path / 'calls.sqlite'} has no answer for openai:judge "
                           'generate "'), line
    assert "Traceback" not in more.stderr and not fresh.exists()
    assert (tmp_path / "run3" / "manifest.json").is_file()  # the run directory keeps what was finished


def test_export_refuses_a_folder_without_calls_and_replay_refuses_no_cache(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    done = harness("cache", "export", str(tmp_path / "empty"), "--out", str(tmp_path / "x.sqlite"),
                   cache=tmp_path / "cache.sqlite")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'empty'} holds no calls.sqlite"), line
    assert not (tmp_path / "x.sqlite").exists()

    refused = harness("eval", "-e", JUDGE, "-b", "ultrafeedback", "--replay", str(tmp_path / "x.sqlite"),
                      "--no-cache", "--out", str(tmp_path / "run"), cache=tmp_path / "cache.sqlite")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line == "error: --replay and --no-cache exclude each other: a replay answers every call from its file"
    assert not (tmp_path / "run").exists()


def test_a_rerun_adds_to_calls_and_overwrite_discards_them(tmp_path: Path, shared_data: Path):
    down = {"odd": True}

    async def flaky(request):
        """`judge`, but while `down["odd"]` every game whose verdict would be [[A]] fails with a 500."""
        answer = await judge(request)
        if request.method == "POST" and down["odd"] and b"[[A]]" in answer.body:
            return json_response({"error": {"message": "overloaded"}}, status=500)
        return answer

    def calls(run: Path) -> int:
        with sqlite3.connect(run / "calls.sqlite") as conn:
            return conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]

    cache = tmp_path / "cache.sqlite"
    run = tmp_path / "run"
    with serve_in_thread(flaky) as url:
        first = harness(*eval_args(shared_data, url, 2, run), "--max-attempts", "1", cache=cache)
        assert first.returncode == 1, first.stderr  # some games failed: a rerun retries them
        partly = calls(run)
        assert 0 < partly < 4  # failures are never recorded, as they are never cached
        down["odd"] = False
        second = harness(*eval_args(shared_data, url, 2, run), "--max-attempts", "1", cache=cache)
        assert second.returncode == 0, second.stderr
        assert calls(run) == 4
        # --overwrite starts over, calls.sqlite included (the call cache answers; what it looked up is recorded).
        again = harness(*eval_args(shared_data, url, 1, run), "--overwrite", cache=cache)
        assert again.returncode == 0, again.stderr
        assert calls(run) == 2
        bare = harness(*eval_args(shared_data, url, 1, tmp_path / "bare"), "--no-cache", cache=cache)
        assert bare.returncode == 0, bare.stderr
        assert not (tmp_path / "bare" / "calls.sqlite").exists()


@pytest.mark.parametrize("kind", ["hf", "vllm"], ids=["transformers", "engine"])  # no vLLM needed
def test_a_replay_builds_a_local_model_from_its_recorded_identity(tmp_path: Path, kind: str):
    """In a replay a local model is its recorded identity: nothing is located, loaded or checked."""
    from harness.backends.base import BackendOptions
    from harness.cache import CallCache
    from harness.calllog import CallLog, ReplayedBackend
    from harness.pool import BackendPool

    identity = {"kind": kind, "model": "org/absent-model", "revision": "0" * 40}
    if kind == "vllm":
        identity.update(dtype="auto", top_logprobs="20")
    log = CallLog(tmp_path / "calls.sqlite")
    log.add(identity, "generate", [("k", {"messages": []}, 0, "x")])
    log.close()
    pool = BackendPool(options=BackendOptions(), cache=CallCache(tmp_path / "calls.sqlite", read_only=True))
    backend = pool.get(f"{kind}:org/absent-model")
    assert isinstance(backend.backend, ReplayedBackend) and backend.identity() == identity
    assert not backend.local and pool.local() == []
    pool.preflight()
