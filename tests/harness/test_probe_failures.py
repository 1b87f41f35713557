"""A capability probe the server fails decides nothing: a 5xx, a timeout or a dropped connection during the
structured-output probe is retried as any request is and, should every attempt fail, fails the request that
needed it; only a clear refusal (an error naming the field, or an answer that breaks the constraint) records a
form as unsupported. An answer sent without its constraint is never kept under the constrained request's key."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from faults import asked

from harness.backends.base import BackendOptions, Constraint, GenerateRequest, SamplingParams, user_chat
from harness.backends.openai_backend import OpenAIBackend
from harness.errors import FailureCategory
from harness.loopback import chat_completion, json_response, serve_in_thread

YES_NO = Constraint.choice(["Yes", "No"])
FEATURE = "structured output (choice)"


class Structured:
    """A chat server that honours vLLM's `structured_outputs` (the answer keeps to the choice) and ignores the
    other forms' fields (a plain answer). It fails its first `failing` chat requests with `status` and a body
    that names no field (an overloaded or crashing server), and refuses the forms in `refuses` with a 400 that
    names the field (as OpenAI's API does)."""

    def __init__(self, *, failing: int = 0, status: int = 500, refuses: tuple[str, ...] = ()) -> None:
        self.failing, self.status, self.refuses = failing, status, refuses
        self.bodies: list[dict] = []
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        with self._lock:
            self.bodies.append(body)
            failing = len(self.bodies) <= self.failing
        if failing:
            return json_response({"error": {"message": "Internal Server Error"}}, status=self.status)
        for field in self.refuses:
            if any(key.startswith(field) for key in body):
                return json_response({"error": {"message": f"Unrecognized request argument supplied: {field}"}},
                                     status=400)
        text = "Yes" if "structured_outputs" in body else "Sure! The answer is yes."
        return json_response(chat_completion([text]))


def _ask(url: str, *prompts: str, max_attempts: int = 3):
    backend = OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=max_attempts))

    async def go():
        try:
            return [(await backend.generate([GenerateRequest(user_chat(p), SamplingParams(constraint=YES_NO))]))[0]
                    for p in prompts]
        finally:
            await backend.close()

    return asyncio.run(go()), backend


class Hanging:
    """A server that takes connections and answers `/models`, but never a chat request (it counts them)."""

    def __init__(self) -> None:
        self.chats = 0

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        self.chats += 1
        await asyncio.Event().wait()


def test_a_500_during_the_structured_output_probe_is_retried_and_the_form_kept():
    server = Structured(failing=2)
    with serve_in_thread(server) as url:
        (answer,), backend = _ask(url, "q")
    assert answer.ok and answer.texts == ("Yes",) and answer.constrained
    assert backend.probed()[FEATURE] == "structured_outputs" and backend.capabilities() == {}
    assert len(server.bodies) == 3 and all("structured_outputs" in b for b in server.bodies)


def test_a_probe_failed_on_every_attempt_fails_its_request_and_the_next_request_probes_again():
    server = Structured(failing=3)
    with serve_in_thread(server) as url:
        (failed, answer), backend = _ask(url, "q1", "q2")
    assert failed.error.category is FailureCategory.SERVER_ERROR and failed.error.attempts == 3
    assert answer.ok and answer.texts == ("Yes",) and answer.constrained
    assert backend.probed()[FEATURE] == "structured_outputs" and backend.capabilities() == {}
    assert all("structured_outputs" in b for b in server.bodies) and len(server.bodies) == 4


def test_a_400_that_names_no_field_decides_nothing_either():
    server = Structured(failing=1, status=400)
    with serve_in_thread(server) as url:
        (failed, answer), backend = _ask(url, "q1", "q2")
    assert failed.error.category is FailureCategory.BAD_REQUEST and failed.error.attempts == 1
    assert answer.ok and answer.constrained and backend.capabilities() == {}


def test_a_500_during_the_top_logprobs_probe_is_retried_and_nothing_is_cut():
    """Every probe, not only the structured-output one: a 500 that names nothing is the server failing."""
    from harness.backends.base import LogprobRequest

    class Logprobs:
        def __init__(self) -> None:
            self.bodies: list[dict] = []

        async def __call__(self, request):
            if request.path.endswith("/models"):
                return json_response({"object": "list", "data": []})
            body = request.json()
            self.bodies.append(body)
            if len(self.bodies) == 1:
                return json_response({"error": {"message": "Internal Server Error"}}, status=500)
            ranked = [{"token": t, "logprob": -1.0 - i} for i, t in
                      enumerate(["Yes", "No", *(f"t{i}" for i in range(body["top_logprobs"]))])]
            first = {**ranked[0], "top_logprobs": ranked[:body["top_logprobs"]]}
            return json_response(chat_completion(["Yes"], logprobs=[{"content": [first]}]))

    server = Logprobs()
    with serve_in_thread(server) as url:
        backend = OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=3, top_logprobs=20))

        async def go():
            try:
                return await backend.next_token_logprobs([LogprobRequest(user_chat("Is it?"))], ["Yes", "No"])
            finally:
                await backend.close()

        (answer,) = asyncio.run(go())
    assert answer.ok and answer.logprobs == {"Yes": -1.0, "No": -2.0}
    assert backend.probed()["top_logprobs"] == 20 and backend.capabilities() == {}
    assert [b["top_logprobs"] for b in server.bodies] == [20, 20, 20]  # the probe twice (a 500, then 20), the request


def test_a_probe_that_times_out_takes_the_attempts_any_request_takes():
    """A server that takes connections and never answers a chat request: the probes (of `n > 1` and of the
    structured-output form) are the request's attempts, not attempts on top of them."""

    for attempts in (1, 2):
        server = Hanging()
        with serve_in_thread(server) as url:
            backend = OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=attempts, timeout=0.5))

            async def go():
                try:
                    params = SamplingParams(n=2, constraint=YES_NO)
                    return await backend.generate([GenerateRequest(user_chat("q"), params)])
                finally:
                    await backend.close()

            (answer,) = asyncio.run(go())
        assert answer.error.category is FailureCategory.TIMEOUT
        assert server.chats == attempts and backend.probed() == {} and backend.capabilities() == {}


def test_requests_waiting_for_a_probe_the_server_fails_share_its_failure():
    """Requests that wait for one probe (of the structured-output form, of `n > 1`) while the server hangs do not
    each probe again in turn: the probe's timeout fails them all, and only the probe reached the server."""

    for params in (SamplingParams(constraint=YES_NO), SamplingParams(n=2)):
        server = Hanging()
        with serve_in_thread(server) as url:
            backend = OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=1, timeout=0.5))

            async def go():
                try:
                    return await backend.generate([GenerateRequest(user_chat(f"q{i}"), params) for i in range(4)])
                finally:
                    await backend.close()

            answers = asyncio.run(go())
        assert [a.error.category for a in answers] == [FailureCategory.TIMEOUT] * 4
        assert server.chats == 1 and backend.probed() == {}


def test_a_replica_whose_probe_met_a_500_keeps_the_constraint_afterwards():
    """Both replicas fail their first request with a 500 (one probe each meets it); every later request of
    both goes under the constraint, and nothing says a replica lacks it."""
    from test_replicas import Clock

    from harness.backends.replicas import HOLD_CAP_S, ReplicaBackend

    a, b = Structured(failing=1), Structured(failing=1)
    clock = Clock()
    with serve_in_thread(a) as url_a, serve_in_thread(b) as url_b:
        async def run():
            router = ReplicaBackend("m", [OpenAIBackend("m", BackendOptions(base_url=u, max_attempts=4))
                                          for u in (url_a, url_b)], clock=clock)
            try:
                def sets(*names: str):
                    return asyncio.gather(*(router.generate([GenerateRequest(user_chat(n), constrained)])
                                            for n in names))

                constrained = SamplingParams(constraint=YES_NO)
                found = await sets("first")  # meets a 500 on both replicas, answered on the second try of one
                clock.now += HOLD_CAP_S  # the other one's hold is over: a set tries it
                found += await sets(*(f"trial {i}" for i in range(2)))
                found += await sets(*(f"both up {i}" for i in range(6)))
                return found, router
            finally:
                await router.close()

        found, router = asyncio.run(run())
    assert all(c.ok and c.texts == ("Yes",) and c.constrained for completions in found for c in completions)
    assert router.capabilities() == {}
    for server in (a, b):
        assert len(server.bodies) >= 3 and all("structured_outputs" in body for body in server.bodies)


def test_an_answer_sent_without_its_constraint_is_not_kept_under_the_constrained_key(tmp_path: Path):
    """A server that clearly refuses every form (a 400 naming the field) gets plain requests: their answers are
    kept under the key of what was sent, not the constrained request's, and read back marked unconstrained
    (whichever server of the same weights is asked next); constrained answers keep their own keys."""
    from harness.backends.replicas import ReplicaBackend
    from harness.cache import CachedBackend, CallCache, _generate_payload, cache_key

    refusing = Structured(refuses=("structured_outputs", "guided_", "grammar"))
    honouring = Structured()
    cache = CallCache(tmp_path / "calls.sqlite")
    request = GenerateRequest(user_chat("Is the sky blue?"), SamplingParams(constraint=YES_NO))
    other = GenerateRequest(user_chat("Is grass green?"), SamplingParams(constraint=YES_NO))

    def served(url: str) -> CachedBackend:  # both servers serve the same weights: one identity, one cache
        replica = OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=2))
        return CachedBackend(ReplicaBackend("m", [replica], identity={"weights": "w1"}), cache)

    async def ask(backend: CachedBackend, *requests: GenerateRequest):
        try:
            return [(await backend.generate([r]))[0] for r in requests]
        finally:
            await backend.close()

    with serve_in_thread(refusing) as url_r, serve_in_thread(honouring) as url_h:
        plain = asyncio.run(ask(backend := served(url_r), request, request))
        constrained_key = cache_key(backend.identity(), "generate", _generate_payload(request), 0)
        assert cache.get_many([constrained_key]) == {}  # nothing under the constrained request's key
        later = asyncio.run(ask(served(url_h), other, other, request))
    assert [c.texts for c in plain] == [("Sure! The answer is yes.",)] * 2
    assert [(c.constrained, c.cached) for c in plain] == [(False, False), (False, True)]
    assert len(asked(refusing.bodies)) == 3 + 1  # each form refused once, then the request plain; then the cache
    assert [(c.texts, c.constrained, c.cached) for c in later] == [
        (("Yes",), True, False), (("Yes",), True, True), (("Sure! The answer is yes.",), False, True)]
    assert cache.stats().entries == 2
