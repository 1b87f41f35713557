"""The `openai` backend against loopback servers whose handlers misbehave on purpose.

Every server here is `harness.loopback`'s HTTP machinery with a handler defined in this file; no test needs
the internet. Timeouts and backoffs are shrunk so the whole module runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from email.utils import formatdate

import pytest
from faults import ALWAYS, FAULT_KINDS, KEY, KEY_ENV, FaultyServer, asked

from harness.backends.base import (
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    SamplingParams,
    TokenLogprob,
    user_chat,
)
from harness.backends.openai_backend import OpenAIBackend
from harness.backends.openai_format import match_candidates
from harness.backends.openai_transport import _AdaptiveLimit, _Pacer, normalise_base_url, retry_after_seconds
from harness.commands.bench_api import format_bench_api, run_bench_api
from harness.errors import BackendUnavailableError, FailureCategory
from harness.loopback import (
    HttpRequest,
    chat_completion,
    json_response,
    openai_handler,
    serve_in_thread,
)
from harness.registry import lookup


@pytest.fixture(autouse=True)
def _fake_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def make_backend(base_url: str, **options) -> OpenAIBackend:
    defaults = {
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout": 0.5,
        "max_attempts": 4,
        "concurrency": 8,
    }
    return OpenAIBackend(
        "test-model", BackendOptions(**(defaults | options)), backoff_base_s=0.01, backoff_cap_s=0.05
    )


def generate(backend: OpenAIBackend, requests: list[GenerateRequest]):
    async def go():
        try:
            return await backend.generate(requests)
        finally:
            await backend.close()

    return asyncio.run(go())


def ask(text: str, **params) -> GenerateRequest:
    return GenerateRequest(user_chat(text), SamplingParams(**params))


def test_fault_injection_every_request_answered_or_categorised() -> None:
    server = FaultyServer()
    rids = [f"req-{i}" for i in range(60)] + list(ALWAYS)
    requests = [ask(rid) for rid in rids]
    with serve_in_thread(server) as url:
        results = generate(make_backend(url), requests)

    assert len(results) == len(requests)
    for rid, result in zip(rids, results):
        if rid in ALWAYS:
            assert result.error is not None, rid
            assert result.error.category is ALWAYS[rid], (rid, result.error)
            assert result.texts == ()
            expected_attempts = 1 if rid == "always-400" else 4
            assert result.error.attempts == expected_attempts, (rid, result.error)
            assert server.attempts[rid] == expected_attempts
        else:
            assert result.ok, (rid, result.error)
            assert result.texts == (f"answer:{rid}",)  # aligned: the text encodes its own request id
    # No duplicates: every result is distinct, and the server answered each normal request (a success is never
    # retried, so more than one answer could only come from a stalled machine outliving the 0.5 s timeout).
    texts = [r.texts for r in results if r.ok]
    assert len(texts) == len(set(texts)) == 60
    assert set(server.answered) == {f"req-{i}" for i in range(60)}
    # Every kind of fault happened, and faults were at least 20% of all attempts.
    for kind in FAULT_KINDS:
        assert server.faults[kind] >= 6, (kind, server.faults)
    assert sum(server.faults.values()) >= 0.2 * sum(server.attempts.values())
    # The key never leaks into a recorded failure, even though the server echoed it.
    messages = [r.error.message for r in results if r.error]
    assert not any(KEY in m for m in messages)
    assert "***" in next(r.error.message for rid, r in zip(rids, results) if rid == "always-500")


def test_retry_after_is_honoured() -> None:
    seen: list[float] = []

    async def handler(request: HttpRequest):
        seen.append(time.monotonic())
        if len(seen) == 1:
            return json_response(
                {"error": {"message": "slow down"}}, status=429, headers=(("Retry-After", "1"),)
            )
        return json_response(chat_completion(["fine"]))

    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url, timeout=5.0), [ask("hi")])
    assert result.ok and result.texts == ("fine",)
    assert len(seen) == 2
    # The 0.01 s backoff would have retried at once; the bound is far below the 60 s cap on Retry-After.
    assert 0.9 <= seen[1] - seen[0] < 30


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "3600"}) == 60.0  # capped
    assert retry_after_seconds({"retry-after": "-5"}) == 0.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None
    in_ten = retry_after_seconds({"retry-after": formatdate(time.time() + 10, usegmt=True)})
    assert in_ten is not None and 8 <= in_ten <= 11


def test_401_is_auth_and_not_retried() -> None:
    calls = []

    async def handler(request: HttpRequest):
        calls.append(request.headers.get("authorization"))
        return json_response({"error": {"message": "bad key"}}, status=401)

    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url), [ask("hi")])
    assert result.error is not None and result.error.category is FailureCategory.AUTH
    assert result.error.attempts == 1 and len(calls) == 1
    assert calls[0] == f"Bearer {KEY}"  # the key from the configured variable is what gets sent


def test_concurrency_is_bounded() -> None:
    """Three requests in flight at once, never more: the first three are held until all three have arrived (so
    the limit is reached however slow the machine), and every later one stays long enough to overlap."""
    state = {"now": 0, "peak": 0}
    three_arrived = asyncio.Event()  # used on the server's loop only

    async def handler(request: HttpRequest):
        state["now"] += 1
        try:
            state["peak"] = max(state["peak"], state["now"])
            if state["peak"] >= 3:
                three_arrived.set()
            await asyncio.wait_for(three_arrived.wait(), 60)  # a hang guard: fails if fewer ever arrive
            await asyncio.sleep(0.05)
        finally:
            state["now"] -= 1
        return json_response(chat_completion(["x"]))

    with serve_in_thread(handler) as url:
        results = generate(make_backend(url, concurrency=3, timeout=120), [ask(f"q{i}") for i in range(20)])
    assert all(r.ok for r in results)
    assert state["peak"] == 3


def test_rate_limits_shrink_the_concurrency_limit_and_successes_restore_it() -> None:
    limit = _AdaptiveLimit(16)
    limit.on_rate_limit(started=time.monotonic())
    assert limit.limit == 8
    limit.on_rate_limit(started=-1.0)  # sent before the cut: no second cut for the same round trip
    assert limit.limit == 8
    for _ in range(200):
        limit.on_success()
    assert limit.limit == 16


def test_a_cancelled_waiter_does_not_strand_the_others() -> None:
    async def go():
        limit = _AdaptiveLimit(1)
        slot = await limit.acquire()
        first = asyncio.ensure_future(limit.acquire())
        second = asyncio.ensure_future(limit.acquire())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        limit.release(slot)
        return await asyncio.wait_for(second, 60)  # a hang guard: `second` is due at once

    assert asyncio.run(go()) == 0


def test_pacer_spaces_request_starts() -> None:
    async def go():
        pacer = _Pacer()
        pacer.interval = 0.02
        starts = []

        async def one():
            await pacer.wait()
            starts.append(time.monotonic())
            pacer.finished()

        await asyncio.gather(*(one() for _ in range(5)))
        return sorted(starts)

    starts = asyncio.run(go())
    assert starts[-1] - starts[0] >= 0.07  # 4 gaps of 0.02 s, minus timer slack


# -- request mapping and parsing -----------------------------------------------------------------------------


def test_generate_maps_sampling_params_and_orders_choices() -> None:
    bodies = []

    async def handler(request: HttpRequest):
        body = request.json()
        bodies.append(body)
        response = chat_completion(["first", "second", "third"])
        response["choices"].reverse()  # servers may list choices out of order
        return json_response(response)

    params = {"n": 3, "temperature": 0.7, "top_p": 0.9, "max_tokens": 42, "seed": 7, "stop": ("\n\n",)}
    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url), [ask("hi", **params)])
    assert result.ok and result.texts == ("first", "second", "third")
    assert result.usage.prompt_tokens == 1 and result.usage.completion_tokens == 3
    (body,) = asked(bodies)
    assert body["model"] == "test-model"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert {k: body[k] for k in params if k != "stop"} == {k: v for k, v in params.items() if k != "stop"}
    assert body["stop"] == ["\n\n"]


def test_choice_without_content_is_malformed() -> None:
    async def handler(request: HttpRequest):
        response = chat_completion(["x"])
        response["choices"][0]["message"]["content"] = None
        return json_response(response)

    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url), [ask("hi")])
    assert result.error is not None and result.error.category is FailureCategory.MALFORMED_RESPONSE


def logprob_handler(bodies: list):
    async def handler(request: HttpRequest):
        bodies.append(request.json())
        first = {
            "token": "Yes",
            "logprob": -0.1,
            "top_logprobs": [
                {"token": "Yes", "logprob": -0.1},
                {"token": " Yes", "logprob": -0.5},
                {"token": "No", "logprob": -2.3},
                {"token": " No", "logprob": -2.0},
                {"token": "yes", "logprob": -3.0},
            ],
        }
        return json_response(chat_completion(["Yes"], logprobs=[{"content": [first]}]))

    return handler


def test_next_token_logprobs_match_candidates_without_leading_whitespace() -> None:
    bodies: list = []
    requests = [
        LogprobRequest(user_chat("Is it?")),
        LogprobRequest(user_chat("Is it?"), assistant_prefix="Answer:"),
    ]

    async def go(backend: OpenAIBackend):
        try:
            return await backend.next_token_logprobs(requests, ["Yes", "No", "Maybe"])
        finally:
            await backend.close()

    with serve_in_thread(logprob_handler(bodies)) as url:
        results = asyncio.run(go(make_backend(url, top_logprobs=5)))
    for result in results:
        assert result.ok, result.error
        assert result.logprobs == {"Yes": -0.1, "No": -2.0, "Maybe": -math.inf}
    plain, prefixed = sorted(asked(bodies), key=lambda b: len(b["messages"]))
    assert plain["max_tokens"] == 1 and plain["temperature"] == 0
    assert plain["logprobs"] is True and plain["top_logprobs"] == 5
    assert prefixed["messages"][-1] == {"role": "assistant", "content": "Answer:"}
    assert prefixed["continue_final_message"] is True  # the loopback counts the same prompt tokens: continued


def test_branches_are_one_http_request_each_and_fail_together() -> None:
    bodies: list = []
    inner = logprob_handler(bodies)

    async def handler(request: HttpRequest):
        if "bad branch" in request.json()["messages"][-1]["content"]:
            return json_response({"error": {"message": "no"}}, status=400)
        return await inner(request)

    requests = [
        LogprobRequest(user_chat("Response: 4. Criterion: "), branches=("States 4?", "Shows work?")),
        LogprobRequest(user_chat("Response: 4. Criterion: "), branches=("ok", "bad branch")),
    ]

    async def go(backend: OpenAIBackend):
        try:
            return await backend.next_token_logprobs(requests, ["Yes", "No"])
        finally:
            await backend.close()

    with serve_in_thread(handler) as url:
        good, bad = asyncio.run(go(make_backend(url, top_logprobs=5)))
    assert good.ok and good.logprobs == {} and good.branches == ({"Yes": -0.1, "No": -2.0},) * 2
    assert good.usage.prompt_tokens == 2  # the loopback reports 1 prompt token per request
    sent = sorted(b["messages"][-1]["content"] for b in asked(bodies))
    assert sent == [f"Response: 4. Criterion: {c}" for c in ("Shows work?", "States 4?", "ok")]
    assert bad.error is not None and bad.error.category is FailureCategory.BAD_REQUEST


def test_generate_sends_a_prefill_in_the_form_the_server_continues_and_no_min_tokens() -> None:
    bodies = []

    async def handler(request: HttpRequest):
        bodies.append(request.json())
        return json_response(chat_completion([" yes\n2: no"]))

    prefilled = GenerateRequest(user_chat("sheet"), SamplingParams(max_tokens=9, min_tokens=5), "1:")
    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url), [prefilled])
    assert result.ok and result.texts == (" yes\n2: no",)  # the continuation, as the server sent it
    assert result.continues_prefix
    (body,) = asked(bodies)
    assert body["messages"] == [{"role": "user", "content": "sheet"}, {"role": "assistant", "content": "1:"}]
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert "min_tokens" not in body  # not part of the OpenAI API: this server was found to ignore it


def test_match_candidates_takes_the_best_variant() -> None:
    alternatives = [(" Yes", -1.0), ("Yes", -2.0), ("\nNo", -3.0)]
    assert match_candidates(alternatives, ["Yes", "No", "Maybe"]) == {
        "Yes": -1.0,
        "No": -3.0,
        "Maybe": -math.inf,
    }


def test_server_without_logprobs_is_unsupported() -> None:
    async def go(backend: OpenAIBackend):
        try:
            return await backend.next_token_logprobs([LogprobRequest(user_chat("Is it?"))], ["Yes"])
        finally:
            await backend.close()

    with serve_in_thread(openai_handler()) as url:
        (result,) = asyncio.run(go(make_backend(url)))
    assert result.error is not None and result.error.category is FailureCategory.UNSUPPORTED
    assert "did not return logprobs" in result.error.message


def _entry(token: str, logprob: float, top: list[tuple[str, float]], raw: bytes | None = None) -> dict:
    entry = {"token": token, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}
    if raw is not None:
        entry["bytes"] = list(raw)
    return entry


def test_generate_parses_token_logprobs_per_choice_in_order() -> None:
    bodies: list = []
    sheet = [  # "1: Yes\n2: No", as a server lists it (top alternatives best first, one repeated)
        _entry("1", -0.01, [("1", -0.01), ("A", -5.0)]),
        _entry(":", -0.02, [(":", -0.02), (".", -4.0)]),
        _entry(" Yes", -0.3, [(" Yes", -0.3), (" No", -1.4), (" Yes", -9.0)]),
        _entry("\n", -0.05, [("\n", -0.05), (" ", -3.5)]),
        _entry("2", -0.01, [("2", -0.01)]),
        _entry(":", -0.02, [(":", -0.02)]),
        _entry(" No", -0.7, [(" No", -0.7), (" Yes", -0.9)]),
    ]
    # "ça\n\n" whose "ç" is split over two tokens (token strings as bytes escapes), then a token the server
    # reports although the stop string "\n\n" cut it from the text.
    split = [
        _entry("\\xc3", -1.0, [("\\xc3", -1.0)], b"\xc3"),
        _entry("\\xa7", -0.1, [("\\xa7", -0.1)], b"\xa7"),
        _entry("a", -0.2, [("a", -0.2)], b"a"),
        _entry("\n\n", -0.3, [("\n\n", -0.3)], b"\n\n"),
    ]

    async def handler(request: HttpRequest):
        body = request.json()
        bodies.append(body)
        if not body.get("logprobs"):
            return json_response(chat_completion(["plain"] * body.get("n", 1)))
        response = chat_completion(["1: Yes\n2: No", "ça"], logprobs=[{"content": sheet}, {"content": split}])
        response["choices"].reverse()  # servers may list choices out of order
        return json_response(response)

    with serve_in_thread(handler) as url:
        with_lp, plain = generate(
            make_backend(url), [ask("sheet", n=2, logprobs=2, stop=("\n\n",)), ask("plain")]
        )
    assert with_lp.ok and with_lp.texts == ("1: Yes\n2: No", "ça")
    assert plain.ok and plain.logprobs is None
    by_text = {b["messages"][0]["content"]: b for b in bodies}
    assert by_text["sheet"]["logprobs"] is True and by_text["sheet"]["top_logprobs"] == 2
    assert "logprobs" not in by_text["plain"] and "top_logprobs" not in by_text["plain"]
    answers, accented = with_lp.logprobs
    assert isinstance(answers[0], TokenLogprob)
    assert [t.token for t in answers] == ["1", ":", " Yes", "\n", "2", ":", " No"]
    assert "".join(t.token for t in answers) == with_lp.texts[0]
    assert [t.logprob for t in answers] == [-0.01, -0.02, -0.3, -0.05, -0.01, -0.02, -0.7]
    assert answers[2].top == {" Yes": -0.3, " No": -1.4}  # the best of a repeated text, at most k entries
    assert list(answers[2].top) == [" Yes", " No"] and answers[4].top == {"2": -0.01}
    assert answers[6].top == {" No": -0.7, " Yes": -0.9}
    assert [t.token for t in accented] == ["", "ç", "a"]  # the token past the stop cut is dropped
    assert [t.logprob for t in accented] == [-1.0, -0.1, -0.2] and accented[0].top == {"\\xc3": -1.0}


@pytest.mark.parametrize(
    ("logprobs", "category", "phrase"),
    [
        (None, FailureCategory.UNSUPPORTED, "did not return logprobs"),
        ({"content": None}, FailureCategory.UNSUPPORTED, "did not return logprobs"),
        ({"content": [{"token": "x"}]}, FailureCategory.MALFORMED_RESPONSE, "numeric logprob"),
    ],
)
def test_generate_without_usable_token_logprobs_fails(logprobs, category, phrase) -> None:
    async def handler(request: HttpRequest):
        return json_response(chat_completion(["x"], logprobs=[logprobs]))

    with serve_in_thread(handler) as url:
        (result,) = generate(make_backend(url), [ask("hi", logprobs=3)])
    assert result.error is not None and result.error.category is category and result.texts == ()
    assert phrase in result.error.message and result.error.attempts == 1


def test_stock_server_without_logprobs_fails_generation_as_unsupported() -> None:
    with serve_in_thread(openai_handler()) as url:
        ok, unsupported = generate(make_backend(url), [ask("hi"), ask("hi", logprobs=1)])
    assert ok.ok and ok.logprobs is None
    assert unsupported.error is not None and unsupported.error.category is FailureCategory.UNSUPPORTED


# -- probe, identity, registry -------------------------------------------------------------------------------


def probe(backend: OpenAIBackend) -> None:
    async def go():
        try:
            await backend.probe()
        finally:
            await backend.close()

    asyncio.run(go())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_unreachable_server() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BackendUnavailableError) as info:
        probe(make_backend(url, timeout=2.0))
    message = str(info.value)
    assert message.startswith(f"cannot reach OpenAI-compatible server at {url}: ")
    assert KEY not in message


def test_probe_refused_key_names_the_variable_not_the_key() -> None:
    async def handler(request: HttpRequest):
        return json_response(
            {"error": {"message": f"invalid key {request.headers.get('authorization')}"}}, status=401
        )

    with serve_in_thread(handler) as url, pytest.raises(BackendUnavailableError) as info:
        probe(make_backend(url))
    assert f"${KEY_ENV}" in str(info.value) and KEY not in str(info.value)


def test_probe_passes_without_a_models_route() -> None:
    async def handler(request: HttpRequest):
        return json_response({"error": "not found"}, status=404)

    with serve_in_thread(handler) as url:
        probe(make_backend(url))
    with serve_in_thread(openai_handler()) as url:
        probe(make_backend(url))


def test_identity_has_model_and_normalised_url_but_no_key() -> None:
    backend = make_backend("HTTP://user:pw@LocalHost:8000/v1/")
    identity = backend.identity()
    asyncio.run(backend.close())
    assert identity == {"kind": "openai", "model": "test-model", "base_url": "http://localhost:8000/v1"}
    assert KEY not in repr(identity)
    assert normalise_base_url("https://api.example.com/v1") == "https://api.example.com/v1"


def test_registered_under_openai() -> None:
    backend = lookup("backend", "openai")("m", BackendOptions(base_url="http://127.0.0.1:1/v1"))
    asyncio.run(backend.close())
    assert isinstance(backend, OpenAIBackend) and backend.kind == "openai"


def test_bench_api_runs_against_a_loopback_server_process() -> None:
    result = run_bench_api(latency_ms=20, concurrency=4, requests=16)
    assert result.failures == 0 and result.requests == 16
    assert result.ideal_rps == pytest.approx(200.0)  # 4 in flight / 20 ms
    assert 0 < result.ratio <= 1.05
    assert format_bench_api(result).splitlines()[-1] == f"achieved/ideal throughput: {result.ratio:.2f}"
