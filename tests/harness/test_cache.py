import asyncio
import math
import multiprocessing as mp
from pathlib import Path

from fakes import ScriptedBackend

from harness.backends.base import (
    GenerateRequest,
    LogprobRequest,
    Message,
    SamplingParams,
    ScoreRequest,
    user_chat,
)
from harness.cache import CachedBackend, CallCache, _generate_payload, cache_key


def _req(text: str, **params) -> GenerateRequest:
    return GenerateRequest(user_chat(text), SamplingParams(**params))


def test_key_covers_model_request_params_and_sample():
    ident = {"kind": "hf", "model": "m", "weights": "abc"}
    base = cache_key(ident, "generate", {"messages": [1], "temperature": 0.7}, 0)
    assert base == cache_key(dict(reversed(ident.items())), "generate", {"temperature": 0.7, "messages": [1]}, 0)
    assert base != cache_key({**ident, "weights": "abd"}, "generate", {"messages": [1], "temperature": 0.7}, 0)
    assert base != cache_key(ident, "generate", {"messages": [2], "temperature": 0.7}, 0)
    assert base != cache_key(ident, "generate", {"messages": [1], "temperature": 0.8}, 0)
    assert base != cache_key(ident, "generate", {"messages": [1], "temperature": 0.7}, 1)
    assert base != cache_key(ident, "logprobs", {"messages": [1], "temperature": 0.7}, 0)


def test_second_call_is_served_from_cache(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    cached = CachedBackend(backend, cache)
    reqs = [_req("a"), _req("b", n=3, temperature=1.0, seed=7)]
    first = asyncio.run(cached.generate(reqs))
    assert cached.calls == 2 and cached.hits == 0
    second = asyncio.run(CachedBackend(backend, cache).generate(reqs))
    assert [c.texts for c in second] == [c.texts for c in first]
    assert all(c.cached for c in second)
    assert len(backend.requests) == 2  # nothing new reached the backend
    stats = cache.stats()
    assert (stats.entries, stats.hits, stats.misses) == (4, 2, 2)
    assert stats.by_model == {"scripted:scripted-model": 4}


def test_failures_are_never_cached(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    cached = CachedBackend(backend, cache)
    [failed] = asyncio.run(cached.generate([_req("please FAIL")]))
    assert failed.error is not None and not failed.cached
    assert cache.stats().entries == 0
    asyncio.run(cached.generate([_req("please FAIL")]))
    assert len(backend.requests) == 2  # retried, not served a cached failure


def test_greedy_seed_is_not_semantic_but_sampled_seed_is(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    cached = CachedBackend(backend, cache)
    asyncio.run(cached.generate([_req("x", seed=1)]))
    asyncio.run(cached.generate([_req("x", seed=2)]))
    assert len(backend.requests) == 1
    asyncio.run(cached.generate([_req("x", temperature=0.5, seed=1)]))
    asyncio.run(cached.generate([_req("x", temperature=0.5, seed=2)]))
    assert len(backend.requests) == 3


def test_logprobs_cached_with_minus_inf(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")

    class Partial(ScriptedBackend):
        async def next_token_logprobs(self, requests, candidates):
            results = await super().next_token_logprobs(requests, candidates)
            return [type(r)({**r.logprobs, "No": -math.inf}) for r in results]

    backend = Partial()
    reqs = [LogprobRequest(user_chat("q1")), LogprobRequest(user_chat("q2"), assistant_prefix="Answer:")]
    first = asyncio.run(CachedBackend(backend, cache).next_token_logprobs(reqs, ["Yes", "No"]))
    second = asyncio.run(CachedBackend(backend, cache).next_token_logprobs(reqs, ["No", "Yes"]))
    assert [r.logprobs for r in second] == [r.logprobs for r in first]
    assert second[0].logprobs["No"] == -math.inf and all(r.cached for r in second)
    assert len(backend.logprob_requests) == 2


def test_prefill_and_min_tokens_are_part_of_the_key(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    plain = _req("sheet", max_tokens=8)
    prefilled = GenerateRequest(plain.messages, plain.params, assistant_prefix="1:")
    held = _req("sheet", max_tokens=8, min_tokens=5)
    for r in (plain, prefilled, held, plain, prefilled, held):
        asyncio.run(CachedBackend(backend, cache).generate([r]))
    assert len(backend.requests) == 3  # three different requests, each computed once
    # Unset, they stay out of the payload, so entries written before they existed keep their keys.
    legacy = {"messages", "temperature", "top_p", "max_tokens", "seed", "stop", "logprobs"}
    assert set(_generate_payload(plain)) == legacy


def test_branched_logprobs_round_trip_per_branch(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")

    class Partial(ScriptedBackend):
        async def next_token_logprobs(self, requests, candidates):
            results = await super().next_token_logprobs(requests, candidates)
            return [type(r)({}, branches=tuple({**b, "No": -math.inf} for b in r.branches)) for r in results]

    backend = Partial()
    branched = LogprobRequest(user_chat("Is it "), branches=("red?", "blue?", "red?"))
    [first] = asyncio.run(CachedBackend(backend, cache).next_token_logprobs([branched], ["Yes", "No"]))
    [again] = asyncio.run(CachedBackend(backend, cache).next_token_logprobs([branched], ["Yes", "No"]))
    assert again.cached and again.branches == first.branches and len(again.branches) == 3
    assert again.branches[0] == again.branches[2] != again.branches[1] and again.branches[1]["No"] == -math.inf
    other = LogprobRequest(user_chat("Is it "), branches=("red?", "blue?"))
    [fresh] = asyncio.run(CachedBackend(backend, cache).next_token_logprobs([other], ["Yes", "No"]))
    assert not fresh.cached and len(backend.logprob_requests) == 2  # the branches are part of the key


def test_a_result_with_the_wrong_number_of_branches_is_not_cached(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")

    class Short(ScriptedBackend):
        async def next_token_logprobs(self, requests, candidates):
            results = await super().next_token_logprobs(requests, candidates)
            return [type(r)({}, branches=r.branches[:1]) for r in results]

    backend = Short()
    branched = LogprobRequest(user_chat("Is it "), branches=("red?", "blue?"))
    for _ in range(2):
        asyncio.run(CachedBackend(backend, cache).next_token_logprobs([branched], ["Yes"]))
    assert len(backend.logprob_requests) == 2 and cache.stats().entries == 0


def test_loglikelihoods_are_cached_by_context_and_continuation_and_failures_are_not(tmp_path: Path):
    from harness.backends.base import LoglikelihoodRequest, LoglikelihoodResult
    from harness.errors import Failure, FailureCategory

    cache = CallCache(tmp_path / "c.sqlite")

    class Scorer(ScriptedBackend):
        async def loglikelihood(self, requests):
            self.asked += requests
            return [LoglikelihoodResult(None, error=Failure(FailureCategory.BACKEND, "oom")) if r.continuation == "!"
                    else LoglikelihoodResult(-float(len(r.continuation)), r.continuation == " a", 1, False)
                    for r in requests]

    backend = Scorer()
    backend.asked = []
    reqs = [LoglikelihoodRequest(" a", "Q"), LoglikelihoodRequest(" bb", "Q"), LoglikelihoodRequest(" a", "P"),
            LoglikelihoodRequest(" a", "Q", user_chat("hi")), LoglikelihoodRequest("!", "Q")]
    first = asyncio.run(CachedBackend(backend, cache).loglikelihood(reqs))
    second = asyncio.run(CachedBackend(backend, cache).loglikelihood(reqs))
    assert [(r.logprob, r.greedy) for r in second[:4]] == [(r.logprob, r.greedy) for r in first[:4]]
    assert all(r.cached for r in second[:4]) and not second[4].ok and not second[4].cached
    assert len(backend.asked) == 6  # four distinct keys once, the failure twice


def _writer(path: str, worker: int, n: int) -> None:
    cache = CallCache(Path(path))
    for i in range(n):
        cache.put_many([(f"k{worker}-{i}", "m", {"v": i}), ("shared", "m", {"v": worker})])
        cache.count(hits=1)
    cache.close()


def test_safe_under_several_processes(tmp_path: Path):
    path = tmp_path / "c.sqlite"
    CallCache(path).close()
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(path), w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)  # a hang guard: each writer needs seconds, more on a busy machine
        assert p.exitcode == 0
    stats = CallCache(path).stats()
    assert stats.entries == 4 * 50 + 1
    assert stats.hits == 200


def _open_at_once(path: str, start, errors) -> None:
    start.wait()
    try:
        CallCache(Path(path)).close()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        errors.put(repr(exc))


def test_processes_that_create_the_same_new_cache_at_once_all_open_it(tmp_path: Path):
    """The ranks of a training job open a new cache file together: SQLite answers the switch to WAL with 'database
    is locked' at once (no busy wait) for the one that loses; it waits and tries again instead of failing (before,
    about one pair in four failed)."""
    fork = mp.get_context("fork")
    errors = fork.Queue()
    for trial in range(40):
        start = fork.Barrier(2)
        procs = [fork.Process(target=_open_at_once, args=(str(tmp_path / f"c{trial}.sqlite"), start, errors))
                 for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)  # a hang guard
            assert p.exitcode == 0
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def test_clear(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    cache.put_many([("a", "m1", 1), ("b", "m2", 2)])
    assert cache.clear(model="m1") == 1
    assert cache.stats().entries == 1
    assert cache.clear() == 1
    assert cache.stats().entries == 0


def test_token_logprobs_round_trip_and_are_part_of_the_key(tmp_path: Path):
    from harness.backends.base import Completion, TokenLogprob

    class WithLogprobs(ScriptedBackend):
        async def generate(self, requests):
            self.requests.extend(requests)
            return [
                Completion(
                    ("Yes",) * r.params.n,
                    logprobs=((TokenLogprob("Yes", -0.1, {"Yes": -0.1, "No": -2.4}),),) * r.params.n,
                )
                if r.params.logprobs
                else Completion(("plain",) * r.params.n)
                for r in requests
            ]

    cache = CallCache(tmp_path / "c.sqlite")
    backend = WithLogprobs()
    [first] = asyncio.run(CachedBackend(backend, cache).generate([_req("q", logprobs=5)]))
    [again] = asyncio.run(CachedBackend(backend, cache).generate([_req("q", logprobs=5)]))
    assert again.cached and again.logprobs == first.logprobs
    assert again.logprobs[0][0].top == {"Yes": -0.1, "No": -2.4}
    [plain] = asyncio.run(CachedBackend(backend, cache).generate([_req("q")]))
    assert plain.texts == ("plain",) and plain.logprobs is None and not plain.cached
    assert len(backend.requests) == 2


def _scored(prompt: str, response: str, **fields) -> ScoreRequest:
    return ScoreRequest((Message("user", prompt), Message("assistant", response)), **fields)


def test_scores_are_cached_with_their_token_counts_and_failures_are_not(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    requests = [_scored("q", "one two three", max_length=2), _scored("q", "a FAIL"), _scored("q", "yes")]
    first = asyncio.run(CachedBackend(backend, cache).score(requests))
    assert [r.score for r in first] == [13.0, None, 3.0] and first[0].truncated and not first[0].cached
    again = CachedBackend(backend, cache)
    second = asyncio.run(again.score(requests))
    assert (again.calls, again.hits) == (1, 2) and len(backend.score_requests) == 4  # only the failure again
    assert [(r.score, r.tokens, r.kept, r.cached) for r in second[::2]] == [(13.0, 3, 2, True), (3.0, 1, 1, True)]
    assert second[1].error is not None and cache.stats().entries == 2


def test_the_score_key_covers_head_conversation_and_max_length(tmp_path: Path):
    cache = CallCache(tmp_path / "c.sqlite")
    backend = ScriptedBackend()
    cached = CachedBackend(backend, cache)
    variants = [
        _scored("q", "yes"),
        _scored("q", "yes", head="lm-token0"),
        _scored("q", "yes", max_length=64),
        _scored("other q", "yes"),
    ]
    for request in variants:
        asyncio.run(cached.score([request]))
        asyncio.run(cached.score([request]))
    assert len(backend.score_requests) == 4 and cached.hits == 4
