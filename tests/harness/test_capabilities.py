"""Server capabilities are probed, not assumed: a loopback server with a real server's gaps (`n` ignored, a
prefill answered in a new turn, no `json_schema`) gets requests it can serve, and the run says what it lacked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from faults import LlamaCppLikeServer, asked, chatml_prompt_tokens

from harness.backends.base import (
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    SamplingParams,
    sample_seed,
    user_chat,
)
from harness.backends.openai_backend import MIN_TOKENS, N_SAMPLES, PREFILL, OpenAIBackend
from harness.commands.bench_verify import format_bench_verify, run_bench_verify
from harness.errors import FailureCategory
from harness.loopback import serve_in_thread
from harness.seeds import derive_seed
from judges.rubric import Rubric, RubricItem
from judges.verify import VERDICT_CHOICE, sheet_constraint, verify


def _backend(url: str) -> OpenAIBackend:
    return OpenAIBackend("smollm2", BackendOptions(base_url=url, max_attempts=2, timeout=5))


def _run(backend: OpenAIBackend, coroutine):
    async def go():
        try:
            return await coroutine
        finally:
            await backend.close()

    return asyncio.run(go())


def test_chatml_counts_a_continued_turn_like_the_prefix_in_the_user_turn():
    """The emulation's arithmetic, which the prefill probe relies on: a new turn costs 5 tokens more."""
    whole = [{"role": "user", "content": "Count to ten in words. one two three"}]
    split = [{"role": "user", "content": "Count to ten in words."}, {"role": "assistant", "content": " one two three"}]
    assert chatml_prompt_tokens(split) - chatml_prompt_tokens(whole) == 5


def test_n_ignored_gives_one_request_per_sample_with_derived_seeds():
    server = LlamaCppLikeServer()
    requests = [GenerateRequest(user_chat(f"q{i}"), SamplingParams(n=3, temperature=0.8, seed=100 + i))
                for i in range(4)]
    with serve_in_thread(server) as url:
        backend = _backend(url)
        out = _run(backend, backend.generate(requests))
    for i, completion in enumerate(out):
        assert completion.ok, completion.error
        assert completion.texts == tuple(f"sample seed={sample_seed(100 + i, s)}" for s in range(3))
    probes = [b for b in server.bodies if b not in asked(server.bodies)]
    assert [b.get("n") for b in probes] == [2]  # probed once
    assert len(asked(server.bodies)) == 4 * 3 and all("n" not in b for b in asked(server.bodies))
    assert backend.probed()[N_SAMPLES] is False
    assert backend.capabilities()[N_SAMPLES].startswith("unsupported (answered n=2 with 1 choice(s))")


def test_a_prefill_the_server_ignores_is_left_out_and_the_sheet_read_whole():
    server = LlamaCppLikeServer()
    rubric = Rubric(tuple(RubricItem(f"Criterion {i}", 1) for i in range(1, 5)))
    with serve_in_thread(server) as url:
        backend = _backend(url)
        found = _run(backend, verify(backend, "p", ["r1", "r2", "r3"], rubric, mode="batched"))
    assert found.failures == ()
    assert found.verdicts == [[1.0] * 3, [0.0] * 3, [1.0] * 3, [0.0] * 3]  # every cell has a verdict
    sheets = asked(server.bodies)
    assert len(sheets) == 3  # one per response, no re-ask
    assert all(b["messages"][-1]["role"] == "user" and b["min_tokens"] == 4 * 4 - 3 for b in sheets)
    assert found.raw["answers"][0] == "1: yes\n2: no\n3: yes\n4: no"  # written whole, nothing glued on
    assert backend.probed()[PREFILL] is None
    lacks = backend.capabilities()[PREFILL]
    assert "continue_final_message: a new turn (+5 prompt tokens)" in lacks
    assert "trailing_message: a new turn (+5 prompt tokens)" in lacks


def test_a_constrained_sheet_without_prefill_is_constrained_prefix_included():
    server = LlamaCppLikeServer()
    request = GenerateRequest(user_chat("Criteria:\n1. a\n2. b\n\n"),
                              SamplingParams(constraint=sheet_constraint(2)), "1:")
    with serve_in_thread(server) as url:
        backend = _backend(url)
        (completion,) = _run(backend, backend.generate([request]))
    assert completion.ok and not completion.continues_prefix and completion.texts == ("1: yes\n2: no",)
    (body,) = asked(server.bodies)
    assert body["structured_outputs"]["regex"].startswith("1:(")  # the prefix written by the model, constrained


def test_a_logprob_request_with_a_prefix_fails_where_the_server_cannot_prefill():
    server = LlamaCppLikeServer()
    requests = [LogprobRequest(user_chat("Is it?")), LogprobRequest(user_chat("Is it?"), assistant_prefix="1:")]
    with serve_in_thread(server) as url:
        backend = _backend(url)
        plain, prefixed = _run(backend, backend.next_token_logprobs(requests, ["Yes", "No"]))
    assert plain.ok and plain.logprobs == {"Yes": -0.2, "No": -1.8}
    assert prefixed.error is not None and prefixed.error.category is FailureCategory.UNSUPPORTED
    assert "does not continue an assistant turn" in prefixed.error.message


def test_generate_n2_on_the_server_records_every_sample_and_says_what_it_lacked(tmp_path: Path):
    """`harness generate --n 2` as a user runs it: every sample complete (not `malformed_response` on every
    rerun), the lack printed once and recorded in the manifest; the rerun is served by the cache."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(3)))
    env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    server = LlamaCppLikeServer()
    with serve_in_thread(server) as url:
        args = [sys.executable, "-m", "harness", "generate", "--model", "openai:smollm2", "--base-url", url,
                "--prompts", str(prompts), "--n", "2", "--temperature", "0.8", "--seed", "5"]
        first = subprocess.run([*args, "--out", str(tmp_path / "a.jsonl")], capture_output=True, text=True,
                               env=env, timeout=120)
        second = subprocess.run([*args, "--out", str(tmp_path / "b.jsonl")], capture_output=True, text=True,
                                env=env, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "6 samples (6 complete, 0 with failures" in first.stdout
    assert first.stdout.count("n > 1: unsupported (answered n=2 with 1 choice(s)): one request per sample") == 1
    records = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    for r in records:
        assert r["error"] is None
        assert r["text"] == f"sample seed={sample_seed(derive_seed(5, r['id']), r['sample'])}"
    manifest = json.loads((tmp_path / "a.jsonl.manifest.json").read_text())
    lacking = manifest["lacking"]
    assert manifest["summary"]["lacking"] == manifest["sessions"][-1]["lacking"] == lacking
    assert list(lacking) == ["openai:smollm2"] and list(lacking["openai:smollm2"]) == [N_SAMPLES]
    assert second.returncode == 0 and "backend calls: 0, cache hits: 3" in second.stdout
    assert "lack" not in second.stdout  # nothing was asked of the server, so nothing was found lacking


def test_bench_verify_counts_http_requests_on_a_server():
    """On an OpenAI-compatible server a logprob branch is an HTTP request of its own: the printed ratio says so
    (the server here lacks prefill, so the sheets are asked for whole, and every cell still gets a verdict)."""
    server = LlamaCppLikeServer()
    with serve_in_thread(server) as url:
        options = BackendOptions(base_url=url, max_attempts=2, timeout=5)
        results, _, lacking = asyncio.run(run_bench_verify("openai:smollm2", items=3, responses=2,
                                                               options=options))
    by_label = {r.label: r for r in results}
    assert by_label["logprob"].calls == 6 and by_label["batched"].calls == 2 and by_label["per_item"].calls == 6
    assert all(r.failed_cells == 0 for r in results)
    assert set(lacking) == {PREFILL}
    sent = sum(r.calls for r in results)
    warm = len(server.bodies) - sent  # the warm-up and the capability probes, none of them counted in a mode
    assert warm >= 4
    text = format_bench_verify(results, spec="openai:smollm2", items=3, responses=2)
    assert "per_item/logprob: calls 1.0x" in text and "calls: HTTP requests" in text


def test_constraints_go_as_gbnf_where_the_server_ignores_the_other_fields():
    """The server accepts `structured_outputs` and `guided_*` (it ignores fields it does not know), which its
    answers give away; the GBNF grammar it honours is kept."""
    server = LlamaCppLikeServer()
    sea = user_chat("Describe the sea in one sentence.")
    requests = [GenerateRequest(sea, SamplingParams(constraint=VERDICT_CHOICE)),
                GenerateRequest(sea, SamplingParams(constraint=VERDICT_CHOICE))]
    with serve_in_thread(server) as url:
        backend = _backend(url)

        async def one_then_another():
            return await backend.generate(requests[:1]) + await backend.generate(requests[1:])

        out = _run(backend, one_then_another())
    assert [c.texts for c in out] == [("Yes",), ("Yes",)]
    sent = asked(server.bodies)
    assert ["structured_outputs" in b for b in sent] == [True, False, False, False]
    assert [b.get("grammar") for b in sent] == [None, None] + ['root ::= "Yes" | "No"\n'] * 2
    assert backend.probed()["structured output (choice)"] == "gbnf" and backend.capabilities() == {}


def test_min_tokens_is_sent_where_the_server_honours_it():
    """A server that holds back the end of an answer for `min_tokens` (vLLM's and llama-cpp-python's do) gets it;
    one that ignores the field does not."""
    bodies = []

    async def handler(request):
        from harness.loopback import chat_completion, json_response

        body = request.json()
        bodies.append(body)
        answer = chat_completion(["yes"])
        answer["usage"]["completion_tokens"] = max(2, body.get("min_tokens", 0))
        return json_response(answer)

    request = GenerateRequest(user_chat("sheet"), SamplingParams(max_tokens=40, min_tokens=21))
    with serve_in_thread(handler) as url:
        backend = _backend(url)
        (completion,) = _run(backend, backend.generate([request]))
    assert completion.ok and backend.probed()[MIN_TOKENS] is True and backend.capabilities() == {}
    assert [b.get("min_tokens") for b in bodies] == [None, 24, 21]  # the probe's two requests, then the request


def test_min_tokens_is_not_sent_where_the_server_ignores_it():
    bodies = []

    async def handler(request):
        from harness.loopback import chat_completion, json_response

        bodies.append(request.json())
        return json_response(chat_completion(["4"]))  # one token, whatever min_tokens says

    request = GenerateRequest(user_chat("sheet"), SamplingParams(max_tokens=40, min_tokens=21))
    with serve_in_thread(handler) as url:
        backend = _backend(url)
        (completion,) = _run(backend, backend.generate([request]))
    assert completion.ok and backend.probed()[MIN_TOKENS] is False
    assert backend.capabilities()[MIN_TOKENS].startswith("unsupported (ignored: the answer ended after 1 tokens)")
    assert [b.get("min_tokens") for b in bodies] == [None, 24, None]
