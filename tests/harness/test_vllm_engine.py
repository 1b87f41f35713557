"""The `vllm` backend on vLLM's real engine, against the `hf` backend on the same tiny checkpoint.

Runs where vLLM is installed: `make test-vllm` builds an environment with vLLM's CPU build and runs every `vllm`
test (on a GPU machine the same tests run with the CUDA build). One engine serves the whole module (it takes
~30 s to start on two CPU cores). The model is the tests' tiny random Llama with head_dim 32 (vLLM's CPU
attention supports 32, 64, 80, 96, 112, 128, ...), in float32 on both sides, so `vllm:` and `hf:` must agree:
the same texts token for token, logprobs within 1e-4.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU build otherwise claims most of the RAM

from tiny_models import build_tiny_lm, build_tiny_rm  # noqa: E402

from harness.backends.base import (  # noqa: E402
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    Message,
    SamplingParams,
    ScoreRequest,
    user_chat,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOP = 1000
"""Alternatives asked per position: more than the vocabulary (so values are exact, as in hf) and far more than
vLLM's default `max_logprobs` of 20, which refuses such requests unless the backend raises it."""
ENGINE = dict(dtype="float32", enforce_eager=True, top_logprobs=TOP, gpu_memory_utilization=0.3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-vllm") / "model", head_dim=32)


@pytest.fixture(scope="module")
def engine(tiny_dir: Path):
    from harness.backends.vllm_backend import VLLMBackend

    b = VLLMBackend(str(tiny_dir), BackendOptions(**ENGINE))
    b.load()
    yield b
    asyncio.run(b.close())


@pytest.fixture(scope="module")
def hf(tiny_dir: Path):
    from harness.backends.hf import HFBackend

    b = HFBackend(str(tiny_dir), BackendOptions(dtype="float32", batch_size=8))
    yield b
    asyncio.run(b.close())


def run(coro):
    return asyncio.run(coro)


def req(text: str, prefix: str = "", **params) -> GenerateRequest:
    params.setdefault("max_tokens", 16)
    return GenerateRequest(user_chat(text), SamplingParams(**params), assistant_prefix=prefix)


GREEDY = [
    req("Hello, world!"),
    req("Is the answer Yes or No?", max_tokens=24),
    req("one two three four", stop=("e",)),
    req("How are you today?", min_tokens=10, max_tokens=12),
    req("Yes or No?", prefix="1:"),  # prefill: the continuation of an assistant prefix
    req("The quick brown fox", prefix="The answer is"),
]


def test_greedy_generation_prefill_stops_and_min_tokens_match_hf(engine, hf) -> None:
    calls = len(engine.engine_calls)
    ours, theirs = run(engine.generate(GREEDY)), run(hf.generate(GREEDY))
    assert engine.engine_calls[calls:] == [len(GREEDY)]  # one engine call for the whole batch
    for request, a, b in zip(GREEDY, ours, theirs):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.texts == b.texts, request  # token for token, leading spaces included
        assert a.usage == b.usage, request
    assert all("e" not in t for t in ours[2].texts)
    assert ours[3].usage.completion_tokens >= 10


def test_token_logprobs_match_hf(engine, hf) -> None:
    requests = [req("Hello, world!", logprobs=5), req("Yes or No?", prefix="1:", logprobs=3, stop=("o",))]
    for a, b in zip(run(engine.generate(requests)), run(hf.generate(requests))):
        assert a.texts == b.texts
        [ours], [theirs] = a.logprobs, b.logprobs
        assert [t.token for t in ours] == [t.token for t in theirs]
        assert "".join(t.token for t in ours).startswith(a.texts[0])
        for x, y in zip(ours, theirs):
            assert math.isclose(x.logprob, y.logprob, abs_tol=1e-4), (x, y)
            assert list(x.top) == list(y.top)
            assert all(math.isclose(x.top[k], y.top[k], abs_tol=1e-4) for k in x.top)


def test_next_token_and_branch_logprobs_match_hf(engine, hf) -> None:
    chat = user_chat("Is Paris in France? Answer Yes or No.")
    requests = [
        LogprobRequest(chat),
        LogprobRequest(chat, assistant_prefix="Answer:"),
        LogprobRequest(chat, branches=(" 1: yes", " 1: no\n2:", " 1: maybe")),
    ]
    candidates = ["Yes", "No", "yes", "no", "thre"]
    ours = run(engine.next_token_logprobs(requests, candidates))
    theirs = run(hf.next_token_logprobs(requests, candidates))
    for a, b in zip(ours, theirs):
        assert a.ok and b.ok, (a.error, b.error)
        assert len(a.branches) == len(b.branches)
        for x, y in zip(a.branches or (a.logprobs,), b.branches or (b.logprobs,)):
            assert x.keys() == y.keys()
            for c in x:  # exact for every candidate (vLLM returned the whole vocabulary), -inf for none
                assert x[c] == y[c] == -math.inf or math.isclose(x[c], y[c], abs_tol=1e-4), (c, x[c], y[c])
            assert sum(math.isfinite(v) for v in x.values()) >= 3  # some have no token in the tiny vocabulary
    assert len(ours[2].branches) == 3 and ours[2].logprobs == {}


def test_loglikelihood_matches_hf(engine, hf) -> None:
    from harness.backends.base import LoglikelihoodRequest

    requests = [LoglikelihoodRequest(" Paris", "The capital of France is"), LoglikelihoodRequest("Hello world"),
                LoglikelihoodRequest("blue.", "The sky is "),
                LoglikelihoodRequest(" Yes", messages=user_chat("Is Paris in France?"))]
    ours, theirs = run(engine.loglikelihood(requests)), run(hf.loglikelihood(requests))
    for a, b in zip(ours, theirs):
        assert a.ok and b.ok, (a.error, b.error)
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-3) and (a.greedy, a.tokens) == (b.greedy, b.tokens)
        assert a.tokens > 0 and a.logprob < 0


def test_sampled_generation_is_seeded_per_sample(engine) -> None:
    three, two, again = run(
        engine.generate(
            [
                req("Hello", n=3, temperature=0.9, seed=7),
                req("Hello", n=2, temperature=0.9, seed=7),
                req("Hello", n=3, temperature=0.9, seed=7),
            ]
        )
    )
    assert three.texts[:2] == two.texts and three.texts == again.texts
    assert len(set(three.texts)) > 1  # different seeds per sample


def test_seeded_samples_beside_prompts_longer_than_a_batch(tmp_path: Path) -> None:
    """Seeded sampling while prompts longer than `max_num_batched_tokens` prefill: on vLLM's CPU build a chunked
    prefill kills the engine (it rewinds the seeded request's generator, which a CPU generator cannot), so the
    backend prefills whole prompts there; on a GPU chunking stays on. Every sample comes back, seeded."""
    from harness.backends.vllm_backend import VLLMBackend

    path = build_tiny_lm(tmp_path / "model", head_dim=32, context=2048)
    b = VLLMBackend(str(path), BackendOptions(dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3,
                                              max_model_len=1024, max_num_batched_tokens=64))
    long = [req("one two three four five " * 40, temperature=1.0, seed=s, max_tokens=8) for s in range(4)]
    try:
        first = run(b.generate(long))
        again = run(b.generate(long))
    finally:
        run(b.close())
    assert all(c.ok for c in first + again), [c.error for c in first + again if not c.ok]
    assert [c.texts for c in first] == [c.texts for c in again]


def test_concurrent_calls_are_merged_into_batched_engine_calls(engine) -> None:
    calls = [[req(f"set {i}: Is the answer Yes or No?", max_tokens=8)] for i in range(6)]
    asks = [[LogprobRequest(user_chat(f"set {i}: Yes or No?"))] for i in range(6)]
    alone = [run(engine.generate(c))[0].texts for c in calls]
    before = len(engine.engine_calls)

    async def together():
        texts = await asyncio.gather(*(engine.generate(c) for c in calls))
        values = await asyncio.gather(*(engine.next_token_logprobs(a, ["Yes", "No"]) for a in asks))
        return texts, values

    texts, values = run(together())
    made = engine.engine_calls[before:]
    assert sum(made) == 12 and len(made) <= 2 + 2, made  # 6 + 6 prompts in at most two rounds each
    assert [t[0].texts for t in texts] == alone
    assert all(v[0].ok and set(v[0].logprobs) == {"Yes", "No"} for v in values)


def test_a_cancel_aborts_the_engine_requests_after_the_step_in_flight(engine, monkeypatch) -> None:
    """A cancel from another thread while the engine generates: the backend takes no step after the one in
    flight, aborts the requests (the engine holds none afterwards), raises `Cancelled`, and serves the next call
    as before."""
    import threading

    from harness.backends.local import Cancelled

    short = [req("Hello, world!")]
    before = run(engine.generate(short))[0].texts
    llm_engine = engine._llm.llm_engine
    real, steps = llm_engine.step, []
    first, go = threading.Event(), threading.Event()

    def step():
        out = real()
        steps.append(len(out))
        if len(steps) == 1:
            first.set()
            assert go.wait(600), "the test never let the engine go on"
        return out

    monkeypatch.setattr(llm_engine, "step", step)

    def cancel_after_the_first_step() -> None:
        assert first.wait(600)
        engine.cancel()
        go.set()

    canceller = threading.Thread(target=cancel_after_the_first_step)
    canceller.start()
    endless = [req("Tell me everything.", max_tokens=200, min_tokens=200)]  # no end-of-sequence before 200 tokens
    with pytest.raises(Cancelled):
        run(engine.generate(endless))
    canceller.join()
    assert len(steps) == 1 and not llm_engine.has_unfinished_requests()
    monkeypatch.undo()
    assert run(engine.generate(short))[0].texts == before


@pytest.mark.timeout(3600)
def test_a_fully_cached_rerun_builds_no_engine(tiny_dir: Path, tmp_path: Path) -> None:
    """`harness generate` twice in fresh processes: the second is answered by the call cache, engine unbuilt.

    The cold run starts an engine (under a minute on an idle 2-core machine): its bounds only stop a hang."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Prompt {i}?"}) + "\n" for i in range(4)))

    def generate(out: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", "generate", "--model", f"vllm:{tiny_dir}", "--prompts", str(prompts),
             "--max-tokens", "8", "--dtype", "float32", "--enforce-eager", "--out", str(tmp_path / out)],
            capture_output=True, text=True, timeout=1800, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        )

    cold = generate("a.jsonl")
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "starting the vLLM engine" in cold.stderr
    warm = generate("b.jsonl")
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "starting the vLLM engine" not in warm.stderr and "backend calls: 0, cache hits: 4" in warm.stdout
    texts = [
        [json.loads(line)["text"] for line in (tmp_path / name).read_text().splitlines()]
        for name in ("a.jsonl", "b.jsonl")
    ]
    assert texts[0] == texts[1] and len(texts[0]) == 4


def test_a_reward_model_on_the_pooling_runner_scores_as_hf_does(tmp_path: Path) -> None:
    """A tiny sequence classifier on its own engine (vLLM picks the pooling runner): raw logits, cuts and token
    counts equal to the `hf` backend's, in float32."""
    from harness.backends.hf import HFBackend
    from harness.backends.vllm_backend import VLLMBackend
    from harness.errors import ConfigError

    rm = build_tiny_rm(tmp_path / "rm", head_dim=32)
    chats = [("Is the answer Yes or No?", "Yes."), ("Hello, world!", "The quick brown fox jumps. " * 20)]
    requests = [ScoreRequest((Message("user", u), Message("assistant", a))) for u, a in chats]
    ours = VLLMBackend(str(rm), BackendOptions(dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3))
    theirs = HFBackend(str(rm), BackendOptions(dtype="float32"))
    try:
        a, b = run(ours.score(requests)), run(theirs.score(requests))
        with pytest.raises(ConfigError, match="a reward model scores conversations"):
            run(ours.generate([req("Hello")]))
    finally:
        run(ours.close())
        run(theirs.close())
    assert ours.engine_calls == [2]
    for x, y in zip(a, b):
        assert x.ok and y.ok and math.isclose(x.score, y.score, abs_tol=1e-4), (x, y)
        assert (x.tokens, x.kept) == (y.tokens, y.kept)
    assert a[1].truncated and a[1].kept == 128


def test_structured_output_on_the_real_engine(tmp_path: Path) -> None:
    """vLLM decodes under the grammar `hf` masks with (its guidance backend): schema, choice and regex hold for
    every seed on a random model that writes none of them unconstrained."""
    import re

    from harness.backends.base import Constraint
    from harness.backends.vllm_backend import VLLMBackend
    from judges.dynamic import rubric_constraint
    from judges.rubric import parse_rubric

    model = build_tiny_lm(tmp_path / "bytes", head_dim=32, byte_level=True)  # llguidance reads byte-level tokenizers
    schema = {"type": "array", "minItems": 1, "maxItems": 3,
              "items": {"type": "object", "required": ["criterion", "weight"], "additionalProperties": False,
                        "properties": {"criterion": {"type": "string", "minLength": 1, "maxLength": 20},
                                       "weight": {"type": "integer", "minimum": 1, "maximum": 5}}}}
    constraints = [Constraint.json_schema(schema), Constraint.choice(["yes", "no"]), Constraint.regex(r"[0-9]{2}-[a-c]{3}")]
    requests = [req("rubric?", max_tokens=200, temperature=1.0, seed=s, constraint=c)
                for s in range(8) for c in constraints]
    # The evaluator's budget-exact rubric grammar (criteria bounded in tokens, llguidance's max_tokens) at the
    # budget it was built for: spelled a byte a token, every rubric still closes within it.
    requests += [req("rubric?", max_tokens=48, temperature=1.0, seed=s, constraint=rubric_constraint(48))
                 for s in range(8)]
    b = VLLMBackend(str(model), BackendOptions(**ENGINE))
    try:
        out = run(b.generate(requests))
    finally:
        run(b.close())
    assert all(c.ok for c in out), [c.error for c in out if not c.ok]
    for budgeted in out[24:]:
        assert parse_rubric(budgeted.texts[0]).items and budgeted.usage.completion_tokens <= 48
    texts = [c.texts[0] for c in out[:24]]
    for rubric in texts[0::3]:
        items = json.loads(rubric)
        assert 1 <= len(items) <= 3 and all(1 <= i["weight"] <= 5 and 1 <= len(i["criterion"]) <= 20 for i in items)
    assert set(texts[1::3]) <= {"yes", "no"}
    assert all(re.fullmatch(r"[0-9]{2}-[a-c]{3}", t) for t in texts[2::3]), texts[2::3]
