"""Run integrity, as a hostile but fair user meets it: the CLI in subprocesses against a loopback server.

Outputs are bound to their settings, two writers never share an output, every verb follows one exit-code rule and
one resume rule, bad input and a failing disk give one `error:` line, credentials never reach a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import Gate

from harness.loopback import HttpResponse, chat_completion, json_response, serve_in_thread

HERE = Path(__file__).resolve().parent


class Server:
    """A loopback chat server whose behaviour a test switches between runs; counts chat requests.

    Modes: `echo` answers `answer:<last user message>`; `verdict` answers a pairwise judge's `[[A]]` or `[[B]]`
    (deterministic in the request); `noverdict` answers without a marker (a parse failure); `malformed` answers
    200 with a cut-off body.
    """

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.requests = 0
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        text = request.json()["messages"][-1]["content"]
        with self._lock:
            self.requests += 1
        if self.mode == "malformed":
            return HttpResponse(status=200, body=b'{"choices": [{"message": ')
        if self.mode == "noverdict":
            return json_response(chat_completion(["Both have merits."]))
        if self.mode == "verdict":
            verdict = "[[A]]" if hashlib.sha256(text.encode()).digest()[0] % 3 else "[[B]]"
            return json_response(chat_completion([f"Verdict: {verdict}"]))
        return json_response(chat_completion([f"answer:{text}"]))


@pytest.fixture()
def server():
    srv = Server()
    with serve_in_thread(srv) as url:
        srv.url = url
        yield srv


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}


def harness(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _default_sigint() -> None:
    # As from a terminal: a test run started in the background inherits SIGINT ignored, and Python then never
    # raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
                            preexec_fn=_default_sigint)


def error_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Assert the one-line error contract (exit 2, one `error:` line, no traceback) and return the line."""
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def prompts_file(path: Path, n: int = 2) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def sets_file(path: Path) -> Path:
    rows = [{"id": "q1", "prompt": "Name a prime.", "responses": ["7", "8"]},
            {"id": "q2", "prompt": "Name a colour.", "responses": ["red", "table"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


JUDGE = "pairwise-judge:model=openai:judge"


def run_config(tmp_path: Path, url: str, **extra: object) -> Path:
    path = tmp_path / "run.yaml"
    body = {"only_rows": ["Qwen3-8B zero-shot"], "rows": {"Qwen3-8B zero-shot": JUDGE},
            "benchmarks": ["ultrafeedback"], "backend": {"base_url": url, "concurrency": 4}, **extra}
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


# ------------------------------------------------------------------------------------------------------------
# Outputs are bound to their settings


def _verb_args(verb: str, tmp_path: Path, url: str, data: Path) -> tuple[list[str], list[str], Path, str]:
    """(first command, the same with other settings, the records file, what the refusal must name)."""
    if verb == "generate":
        out = tmp_path / "out.jsonl"
        base = ["generate", "--base-url", url, "--prompts", str(prompts_file(tmp_path / "p.jsonl")), "--out", str(out)]
        return (base + ["--model", "openai:modelA"], base + ["--model", "openai:modelB", "--temperature", "0.9"],
                out, "model: openai:modelA -> openai:modelB")
    if verb == "score":
        out = tmp_path / "scores.jsonl"
        base = ["score", "--base-url", url, "--input", str(sets_file(tmp_path / "sets.jsonl")), "--out", str(out)]
        return (base + ["-e", JUDGE], base + ["-e", JUDGE + ",temperature=0.5"], out,
                f"evaluator: {JUDGE} -> {JUDGE},temperature=0.5")
    if verb == "eval":
        out = tmp_path / "ev"
        base = ["eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", "3", "--data-dir", str(data), "--base-url",
                url, "--out", str(out)]
        return base, base + ["--seed", "1"], out / "records.jsonl", "seed: 0 -> 1"
    out = tmp_path / "run"
    base = ["run", "table1", "--config", str(run_config(tmp_path, url)), "--limit", "3", "--seeds", "1",
            "--data-dir", str(data), "--out", str(out)]
    return base, base + ["--seed", "1"], out / "records.jsonl", "seed: 0 -> 1"


@pytest.mark.parametrize("verb", ["generate", "score", "eval", "run"])
def test_a_rerun_with_other_settings_is_refused(verb: str, tmp_path: Path, server, env, shared_data: Path):
    server.mode = "echo" if verb == "generate" else "verdict"
    first, changed, records, named = _verb_args(verb, tmp_path, server.url, shared_data)
    done = harness(*first, env=env)
    assert done.returncode == 0, done.stderr
    before, calls = records.read_bytes(), server.requests

    refused = harness(*changed, env=env)
    line = error_line(refused, "holds results made with other settings", named, "--overwrite")
    assert records.read_bytes() == before and server.requests == calls  # nothing lost, nothing asked
    assert "Traceback" not in refused.stderr and line

    again = harness(*first, env=env)  # the same settings resume: nothing to do
    assert again.returncode == 0 and "already done" in again.stdout and records.read_bytes() == before

    replaced = harness(*changed, "--overwrite", env=env)
    assert replaced.returncode == 0, replaced.stderr
    new = lines(records)
    keys = [tuple(json.dumps(v) for k, v in r.items() if k in ("id", "sample", "item", "repeat")) for r in new]
    assert len(keys) == len(set(keys)) == len(lines(records))
    if verb == "generate":
        assert {r["model"] for r in new} == {"openai:modelB"}
    elif verb == "score":
        assert {r["evaluator"] for r in new} == {JUDGE + ",temperature=0.5"}
    else:
        seeds = {r["seed"] for r in new}
        assert seeds and seeds.isdisjoint({r["seed"] for r in map(json.loads, before.decode().splitlines())})


def test_a_missing_or_corrupt_manifest_blocks_a_rerun_with_a_hint(tmp_path: Path, server, env):
    args = ["generate", "--model", "openai:m", "--base-url", server.url, "--prompts",
            str(prompts_file(tmp_path / "p.jsonl")), "--out", str(tmp_path / "out.jsonl")]
    assert harness(*args, env=env).returncode == 0
    manifest = tmp_path / "out.jsonl.manifest.json"
    manifest.write_text("{not json")
    error_line(harness(*args, env=env), "out.jsonl.manifest.json: cannot read the manifest", "--overwrite")
    manifest.unlink()
    error_line(harness(*args, env=env), "holds records but no manifest", "--overwrite")
    assert harness(*args, "--overwrite", env=env).returncode == 0


def test_an_output_of_another_verb_or_path_collisions_are_refused(tmp_path: Path, server, env, shared_data):
    prompts = prompts_file(tmp_path / "p.jsonl")
    gen = ["generate", "--model", "openai:m", "--base-url", server.url, "--prompts", str(prompts)]
    error_line(harness(*gen, "--out", str(prompts), env=env), "is the prompts file itself")
    (tmp_path / "adir").mkdir()
    error_line(harness(*gen, "--out", str(tmp_path / "adir"), env=env), "is a directory; this command writes one")
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text('{"mine": 1}\n')
    error_line(harness(*gen, "--out", str(foreign), env=env), "holds records but no manifest")
    assert foreign.read_text() == '{"mine": 1}\n'
    assert harness(*gen, "--out", str(tmp_path / "g.jsonl"), env=env).returncode == 0
    score = ["score", "-e", JUDGE, "--base-url", server.url, "--input", str(sets_file(tmp_path / "s.jsonl"))]
    error_line(harness(*score, "--out", str(tmp_path / "g.jsonl"), env=env), "written by `harness generate`")

    ev = ["eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", "2", "--data-dir", str(shared_data),
          "--base-url", server.url]
    error_line(harness(*ev, "--out", str(foreign), env=env), "exists and is not a directory")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("x")
    error_line(harness(*ev, "--out", str(busy), env=env), "non-empty directory that holds no harness run")
    assert server.requests == 2  # only the one generate that was allowed


def test_report_refuses_what_is_not_a_run(tmp_path: Path, server, env):
    out = tmp_path / "g.jsonl"
    args = ["generate", "--model", "openai:m", "--base-url", server.url, "--prompts",
            str(prompts_file(tmp_path / "p.jsonl")), "--out", str(out)]
    assert harness(*args, env=env).returncode == 0
    error_line(harness("report", str(out), env=env), "is a file; `harness report` takes the run directory")
    fake = tmp_path / "fake"
    fake.mkdir()
    shutil.copy(tmp_path / "g.jsonl.manifest.json", fake / "manifest.json")
    error_line(harness("report", str(fake), env=env), "the manifest is of `harness generate`, not of a run")


# ------------------------------------------------------------------------------------------------------------
# One writer per output


HANG_GUARD_S = 600
"""How long a test waits for an event before it calls the run hung: a failure guard, never what passes."""


@contextlib.contextmanager
def gated_server(let_through: int) -> Iterator[tuple[Server, Gate]]:
    """An echo server behind a `Gate`: the first `let_through` questions are answered, the rest held."""
    srv = Server()
    gate = Gate(srv, let_through=let_through)
    with serve_in_thread(gate) as url:
        srv.url = url
        try:
            yield srv, gate
        finally:
            gate.open()  # a failed test leaves no request waiting


def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen) -> None:
    """Wait until `path` holds `count` lines, while `proc` runs (the gate keeps it from finishing first)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {count} lines (the process exited with {proc.poll()})")


def _wait_for_stderr(proc: subprocess.Popen, fragment: str) -> None:
    """Read `proc`'s stderr up to the first line that holds `fragment`; fail if the process ends first."""
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            seen.append(line)
            if fragment in line:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(HANG_GUARD_S) and seen and fragment in seen[-1], (fragment, "".join(seen))


def _generate_args(url: str, tmp_path: Path, n: int) -> tuple[list[str], Path]:
    out = tmp_path / "out.jsonl"
    return ["generate", "--model", "openai:m", "--base-url", url, "--prompts",
            str(prompts_file(tmp_path / "p.jsonl", n)), "--out", str(out), "--concurrency", "2"], out


def test_a_second_writer_is_refused_or_waits_and_nothing_is_lost(tmp_path: Path, env):
    """Two processes on one output, the case that once lost answers to a compaction racing an append: the
    second never gets to write (or compact) while the first holds the lock.

    The server answers the first writer's first 5 questions and holds the rest, so the first writer holds the
    lock and cannot finish while the second is refused and a third (`--wait`) starts waiting. Then the gate
    opens: the first finishes, the third finds all 60 done and asks nothing; every answer is saved once.
    """
    with gated_server(let_through=5) as (server, gate):
        args, out = _generate_args(server.url, tmp_path, 60)
        first = spawn(*args, env=env)
        try:
            _wait_for_lines(out, 5, first)
            second = harness(*args, env=env)
            error_line(second, f"out.jsonl is being written by another harness process (pid {first.pid} on",
                       "--wait")
            waiter = spawn(*args, "--wait", env=env)
            try:
                _wait_for_stderr(waiter, f"waiting for {out}: held by pid {first.pid}")
                assert first.poll() is None and waiter.poll() is None  # held at the gate, and at the lock
                assert len(lines(out)) == 5
                gate.open()
                _, first_err = first.communicate(timeout=HANG_GUARD_S)
                waited_out, waited_err = waiter.communicate(timeout=HANG_GUARD_S)
            finally:
                waiter.kill()
        finally:
            first.kill()
    assert first.returncode == 0, first_err
    assert waiter.returncode == 0, waited_err
    assert "60 already done" in waited_out and "backend calls: 0" in waited_out
    records = lines(out)
    assert sorted(r["id"] for r in records) == sorted(f"p{i}" for i in range(60))  # each exactly once
    assert server.requests == 60


def test_kill_9_during_generate_then_resume_keeps_every_answer_once(tmp_path: Path, env):
    """SIGKILL after 8 of 40 answers (the server holds the rest): the 8 stay, the lock dies with the process,
    and a rerun asks for the other 32 only."""
    with gated_server(let_through=8) as (server, gate):
        args, out = _generate_args(server.url, tmp_path, 40)
        proc = spawn(*args, env=env)
        try:
            _wait_for_lines(out, 8, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=HANG_GUARD_S)
        gate.open(drop_held=True)  # what the killed process still waited for goes nowhere
        assert len(lines(out)) == 8
        resumed = harness(*args, env=env)  # the lock died with its process
        assert resumed.returncode == 0, resumed.stderr
        assert "8 already done" in resumed.stdout and server.requests == 40
    records = lines(out)
    assert sorted(r["id"] for r in records) == sorted(f"p{i}" for i in range(40))
    assert all(r["text"] == f"answer:question {r['id'][1:]}" for r in records)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_says_what_was_saved(sig, tmp_path: Path, env):
    """Ctrl-C or SIGTERM after 6 of 40 answers (the server holds the rest): exit 130, a message and a manifest
    that say what is saved, and a rerun that resumes from there."""
    with gated_server(let_through=6) as (server, gate):
        args, out = _generate_args(server.url, tmp_path, 40)
        proc = spawn(*args, env=env)
        try:
            _wait_for_lines(out, 6, proc)
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=HANG_GUARD_S)
        finally:
            proc.kill()
        assert proc.returncode == 130, stderr
        assert len(lines(out)) == 6
        assert f"interrupted: 6 of 40 samples are saved in {out}" in stderr and "Traceback" not in stderr
        assert "rerun the same command to resume" in stderr
        manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
        assert manifest["status"] == "interrupted" and manifest["summary"]["missing"] == 34
        gate.open(drop_held=True)  # the interrupted process no longer listens
        resumed = harness(*args, env=env)
    assert resumed.returncode == 0 and "6 already done" in resumed.stdout


# ------------------------------------------------------------------------------------------------------------
# Exit codes and the resume rule


@pytest.mark.parametrize(
    "case",
    ["missing data dir", "empty data file", "corrupt data file", "non-UTF-8 data file", "unknown benchmark",
     "unbuildable evaluator"],
)
def test_eval_stops_before_any_model_call_on_bad_input(case: str, tmp_path: Path, server, env, shared_data):
    data = tmp_path / "data"
    (data / "ultrafeedback").mkdir(parents=True)
    target = data / "ultrafeedback" / "ultrafeedback_binarized_test_prefs_first500.jsonl"
    source = (shared_data / "ultrafeedback" / target.name).read_bytes().splitlines(keepends=True)
    target.write_bytes(b"".join(source[:3]))
    evaluator, bench = JUDGE, "ultrafeedback"
    expected = {
        "missing data dir": "benchmark data folder not found",
        "empty data file": "benchmark 'ultrafeedback' loaded no items",
        "corrupt data file": f"{target}:2: invalid JSON (column 1: Expecting value)",
        "non-UTF-8 data file": f"{target}:2: not UTF-8 text (byte 0xff",
        "unknown benchmark": "unknown benchmark 'ultrafeedbak' (did you mean 'ultrafeedback'?); valid: ",
        "unbuildable evaluator": "evaluator 'pairwise-judge:modle=openai:judge' cannot be built: ",
    }[case]
    if case == "missing data dir":
        data = tmp_path / "nowhere"
    elif case == "empty data file":
        target.write_bytes(b"")
    elif case == "corrupt data file":
        target.write_bytes(source[0] + b"not json\n")
    elif case == "non-UTF-8 data file":
        target.write_bytes(source[0] + b'{"chosen": "\xff"}\n')
    elif case == "unknown benchmark":
        bench = "ultrafeedbak"
    else:
        evaluator = "pairwise-judge:modle=openai:judge"
    out = tmp_path / "ev"
    proc = harness("eval", "-e", evaluator, "-b", bench, "--data-dir", str(data), "--base-url", server.url,
                   "--out", str(out), env=env)
    error_line(proc, expected)
    assert server.requests == 0 and not (out / "manifest.json").exists()


def test_run_exit_codes_and_skip_unavailable(tmp_path: Path, server, env, shared_data):
    base = ["run", "table1", "--limit", "2", "--seeds", "1", "--data-dir", str(shared_data)]
    config = run_config(tmp_path, server.url, only_rows=["No such row"])
    error_line(harness(*base, "--config", str(config), "--out", str(tmp_path / "a"), env=env),
               "only_rows names unknown row(s) ['No such row']")
    config = run_config(tmp_path, server.url, benchmarks=["ultrafeedback", "aeollm"])
    error_line(harness(*base, "--config", str(config), "--out", str(tmp_path / "b"), env=env), "aeollm")
    assert server.requests == 0
    server.mode = "verdict"
    skipped = harness(*base, "--config", str(config), "--out", str(tmp_path / "b"), "--skip-unavailable", env=env)
    assert skipped.returncode == 0, skipped.stderr
    assert "benchmark aeollm left out (--skip-unavailable)" in skipped.stderr
    assert "aeollm unavailable" in (tmp_path / "b" / "table.md").read_text()
    server.mode = "noverdict"  # every game unparsable: nothing can be scored
    fresh = {"HARNESS_CALL_CACHE": str(tmp_path / "fresh.sqlite")}
    failed = harness(*base, "--config", str(run_config(tmp_path, server.url)), "--out", str(tmp_path / "c"),
                     env=fresh)
    assert failed.returncode == 1, failed.stderr
    assert "2 sets (0 complete, 2 with failures, 0 already done)" in failed.stdout
    assert "parse=4" in failed.stderr and "parse failures are final" in failed.stderr


def test_backend_failures_are_retried_and_parse_failures_are_final(tmp_path: Path, server, env, shared_data):
    out = tmp_path / "ev"
    args = ["eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", "3", "--data-dir", str(shared_data),
            "--base-url", server.url, "--max-attempts", "1", "--out", str(out)]
    server.mode = "malformed"  # a body that is not JSON: a failure of the backend
    first = harness(*args, env=env)
    assert first.returncode == 1 and "malformed_response=6" in first.stderr
    assert "backend failures are retried when you rerun" in first.stderr
    server.mode = "noverdict"
    second = harness(*args, env=env)  # retried: the server now answers, but without a verdict
    assert second.returncode == 1 and "0 already done" in second.stdout and "parse=6" in second.stderr
    assert len((out / "records.jsonl").read_text().splitlines()) == 3  # compacted: one line per record
    calls = server.requests
    third = harness(*args, env=env)  # parse failures are final: nothing is asked again
    assert third.returncode == 1 and "3 already done" in third.stdout and server.requests == calls
    retried = harness(*args, "--retry-failed", env=env)  # re-read from the cache with the current parser
    assert retried.returncode == 1 and "0 already done" in retried.stdout and server.requests == calls
    assert "backend calls: 0, cache hits: 12" in retried.stdout


def test_generate_and_score_exit_1_when_nothing_could_be_evaluated(tmp_path: Path, server, env):
    server.mode = "malformed"
    gen = harness("generate", "--model", "openai:m", "--base-url", server.url, "--max-attempts", "1",
                  "--prompts", str(prompts_file(tmp_path / "p.jsonl")), "--out", str(tmp_path / "g.jsonl"), env=env)
    assert gen.returncode == 1 and "2 samples (0 complete, 2 with failures" in gen.stdout
    server.mode = "noverdict"
    score = harness("score", "-e", JUDGE, "--base-url", server.url, "--input", str(sets_file(tmp_path / "s.jsonl")),
                    "--out", str(tmp_path / "s.out.jsonl"), env=env)
    assert score.returncode == 1 and "2 sets (0 complete, 2 with failures" in score.stdout


def test_eval_without_a_server_stops_with_one_line(tmp_path: Path, env, shared_data):
    proc = harness("eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", "2", "--data-dir", str(shared_data),
                   "--out", str(tmp_path / "ev"), env={**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    error_line(proc, "cannot reach OpenAI-compatible server at http://127.0.0.1:9/v1")
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "cannot reach" in manifest["error"]


# ------------------------------------------------------------------------------------------------------------
# Bad input and a failing environment: one error line


def test_non_utf8_inputs_name_file_and_line(tmp_path: Path, server, env):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"id": "a", "prompt": "ok"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    error_line(harness("generate", "--model", "openai:m", "--base-url", server.url, "--prompts", str(bad),
                       "--out", str(tmp_path / "o.jsonl"), env=env), f"{bad}:2: not UTF-8 text (byte 0xe9")
    sets = tmp_path / "sets.jsonl"
    sets.write_bytes(b'{"id": "a", "prompt": "p", "responses": ["x", "y"]}\n{"id": "b", "prompt": "\xff"}\n')
    error_line(harness("score", "-e", JUDGE, "--base-url", server.url, "--input", str(sets),
                       "--out", str(tmp_path / "s.jsonl"), env=env), f"{sets}:2: not UTF-8 text (byte 0xff")
    torn = tmp_path / "t.jsonl"
    torn.write_text('{"id": "a", "prompt": "unterminated}\n')
    line = error_line(harness("generate", "--model", "openai:m", "--prompts", str(torn), "--out",
                              str(tmp_path / "o.jsonl"), env=env), "invalid JSON (column")
    assert "at at" not in line
    assert server.requests == 0


def test_a_corrupt_call_cache_says_how_to_clear_it(tmp_path: Path, server, env):
    cache = Path(env["HARNESS_CALL_CACHE"])
    cache.write_bytes(b"this is not a database" * 100)
    args = ["generate", "--model", "openai:m", "--base-url", server.url, "--prompts",
            str(prompts_file(tmp_path / "p.jsonl")), "--out", str(tmp_path / "o.jsonl")]
    error_line(harness(*args, env=env), f"call cache {cache}: file is not a database", "harness cache clear --yes")
    error_line(harness("cache", "stats", env=env), "file is not a database")
    cleared = harness("cache", "clear", "--yes", env=env)
    assert cleared.returncode == 0 and "deleted the corrupt cache file" in cleared.stdout
    assert harness(*args, env=env).returncode == 0
    elsewhere = tmp_path / "a-folder"
    elsewhere.mkdir()
    error_line(harness(*args, "--overwrite", env={"HARNESS_CALL_CACHE": str(elsewhere)}),
               f"call cache {elsewhere}: unable to open database file", "--no-cache")
    assert harness(*args, "--overwrite", "--no-cache", env={"HARNESS_CALL_CACHE": str(elsewhere)}).returncode == 0


def test_config_backend_keys_and_types_are_checked_before_anything_starts(tmp_path: Path, server, env, shared_data):
    out = tmp_path / "run"
    base = ["run", "table1", "--limit", "2", "--data-dir", str(shared_data), "--out", str(out)]
    config = tmp_path / "bad.yaml"
    config.write_text(f"backend: {{base_url: '{server.url}', concurency: 4}}\n")
    error_line(harness(*base, "--config", str(config), env=env),
               "bad.yaml: backend.concurency: unknown setting; valid: base_url, api_key_env, concurrency")
    config.write_text(f"backend: {{base_url: '{server.url}', concurrency: many}}\n")
    error_line(harness(*base, "--config", str(config), env=env), "bad.yaml: backend.concurrency: Input should be")
    assert not out.exists() and server.requests == 0


def _with_disk_fault(args: list[str], *, env: dict[str, str], under: Path, errno_name: str, after_bytes: int = 0):
    """Run the CLI with writes under `under` failing as the OS fails them (see `diskfaults.py`)."""
    code = "import diskfaults, sys; from harness.commands.cli import main; sys.argv = ['harness', *sys.argv[1:]]; main()"
    fault = {"HARNESS_TEST_FAULT_DIR": str(under), "HARNESS_TEST_FAULT_ERRNO": errno_name,
             "HARNESS_TEST_FAULT_AFTER": str(after_bytes), "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, **fault})


def test_a_full_or_read_only_disk_gives_one_line_and_keeps_finished_work(tmp_path: Path, server, env):
    out_dir = tmp_path / "outs"
    out_dir.mkdir()
    out = out_dir / "o.jsonl"
    args = ["generate", "--model", "openai:m", "--base-url", server.url, "--prompts",
            str(prompts_file(tmp_path / "p.jsonl", 30)), "--out", str(out), "--concurrency", "1"]
    readonly = _with_disk_fault(args, env=env, under=out_dir, errno_name="EROFS")
    error_line(readonly, f"cannot write {out_dir}", "Read-only file system")
    assert server.requests == 0

    full = _with_disk_fault(args, env=env, under=out_dir, errno_name="ENOSPC", after_bytes=1500)
    error_line(full, f"cannot write {out}: No space left on device", "records finished before this are saved")
    kept = lines(out)  # every complete line is a whole record
    assert 0 < len(kept) < 30 and len({r["id"] for r in kept}) == len(kept)
    manifest = json.loads((out_dir / "o.jsonl.manifest.json").read_text())
    assert manifest["status"] == "failed" and "No space left on device" in manifest["error"]

    resumed = harness(*args, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(kept)} already done" in resumed.stdout and len(lines(out)) == 30


def test_credentials_in_base_url_reach_no_file_and_no_output(tmp_path: Path, server, env, shared_data):
    secret = "sk-embedded-DISTINCTIVE-9876"
    url = server.url.replace("http://", f"http://user:{secret}@")
    gen = harness("generate", "--model", "openai:m", "--base-url", url, "--prompts",
                  str(prompts_file(tmp_path / "p.jsonl")), "--out", str(tmp_path / "o.jsonl"), env=env)
    assert gen.returncode == 0, gen.stderr
    config = run_config(tmp_path, url)
    run = harness("run", "table1", "--config", str(config), "--limit", "2", "--seeds", "1", "--data-dir",
                  str(shared_data), "--out", str(tmp_path / "run"), "--base-url", url, env=env)
    server.mode = "verdict"
    assert run.returncode in (0, 1), run.stderr
    manifest = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert "http://***@127.0.0.1" in " ".join(manifest["argv"])
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != config:
            assert secret.encode() not in path.read_bytes(), path
    for proc in (gen, run):
        assert secret not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------------------
# `harness report` while a run writes


def test_report_leaves_a_torn_last_line_alone(tmp_path: Path, server, env, shared_data):
    server.mode = "verdict"
    out = tmp_path / "ev"
    args = ["eval", "-e", JUDGE, "-b", "ultrafeedback", "--limit", "3", "--data-dir", str(shared_data),
            "--base-url", server.url, "--out", str(out)]
    assert harness(*args, env=env).returncode == 0
    records = out / "records.jsonl"
    with records.open("a") as fh:
        fh.write('{"schema": "eval/1", "evaluator": "pairw')  # a writer mid-line
    before = records.read_bytes()
    report = harness("report", str(out), env=env)
    assert report.returncode == 0, report.stderr
    assert records.read_bytes() == before
    assert "the last line of records.jsonl is incomplete" in report.stdout
    resumed = harness(*args, env=env)  # the writer repairs it
    assert resumed.returncode == 0 and "3 already done" in resumed.stdout
    assert records.read_text().endswith("}\n") and len(lines(records)) == 3
