"""The `hf` backend's prefill (`assistant_prefix`), `min_tokens` and branched logprob requests.

Tiny random models built here (a Llama, and a Gemma-3 with a sliding-window layer, whose KV cache is hybrid) are
checked against direct forward passes; the real `smollm2-135m` (slow) shows `min_tokens` holding back a real
end-of-turn.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from tiny_models import build_tiny_lm  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.backends.base import (  # noqa: E402
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    Message,
    SamplingParams,
    user_chat,
)
from harness.errors import FailureCategory  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory: pytest.TempPathFactory):
    from harness.backends.hf import HFBackend

    path = build_tiny_lm(tmp_path_factory.mktemp(request.param) / "model", arch=request.param)
    backend = HFBackend(str(path), BackendOptions(dtype="float32", batch_size=2))
    yield backend, path
    asyncio.run(backend.close())


def _direct(model_dir: Path, ids: list[int]):
    """Next-token log-softmax after `ids`, by one plain forward pass of a freshly loaded model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)


def _expected(backend, model_dir: Path, ids: list[int], candidate: str) -> float:
    """What the backend should report for `candidate` after `ids` (its best first-token variant)."""
    from harness.backends.local import candidate_token_ids

    direct = _direct(model_dir, ids)
    return max(float(direct[i]) for i in candidate_token_ids(backend._tok, candidate))


SHARED = "Is the answer Yes or No? The quick brown fox jumps over the lazy dog. Criterion: "
BRANCHES = ("Yes.", "one two three four five six seven", "No", "Hello, world! How are you today?", "x")


def test_branches_match_direct_forward_passes_and_share_their_start(tiny) -> None:
    backend, path = tiny
    branched = LogprobRequest(user_chat(SHARED), branches=BRANCHES)
    single = LogprobRequest(user_chat("Hello"), assistant_prefix="Answer:")
    candidates = ["Yes", "No"]
    got, plain = asyncio.run(backend.next_token_logprobs([branched, single], candidates))
    assert got.ok and plain.ok and got.logprobs == {} and len(got.branches) == len(BRANCHES)
    full = [backend.encode(c) for c in branched.contexts()]
    for ids, found in zip(full, got.branches):  # 5 branches in batches of 2: three copies of the cache
        for c in candidates:
            assert found[c] == pytest.approx(_expected(backend, path, ids, c), abs=1e-4)
    # The shared tokens were computed once: the count is the union, not the sum, of the contexts.
    shared = len(backend.encode(user_chat(SHARED)))
    assert shared < got.usage.prompt_tokens < sum(len(ids) for ids in full)
    single_ids = backend.encode(single.messages, "Answer:")
    assert plain.usage.prompt_tokens == len(single_ids) and plain.branches == ()
    assert plain.logprobs["Yes"] == pytest.approx(_expected(backend, path, single_ids, "Yes"), abs=1e-4)


def test_requests_of_different_lengths_batched_together_match_direct_passes(tiny) -> None:
    """Several branched requests in one call: their shared starts left-padded in one pass (batch_size 2: two
    chunks), their branches on rows picked from that cache, each branch as a direct forward pass computes it."""
    backend, path = tiny
    requests = [
        LogprobRequest(user_chat("Short question?"), branches=(" Criterion: brief.", " Criterion: polite and exact.")),
        LogprobRequest(user_chat(SHARED + " A much longer start than the others, " * 3), branches=BRANCHES[:3]),
        LogprobRequest(user_chat("Medium length question about foxes?"), branches=(" Yes", " No, never")),
    ]
    got = asyncio.run(backend.next_token_logprobs(requests, ["Yes", "No"]))
    for request, result in zip(requests, got):
        assert result.ok and len(result.branches) == len(request.branches)
        full = [backend.encode(c) for c in request.contexts()]
        for ids, found in zip(full, result.branches):
            for c in ("Yes", "No"):
                assert found[c] == pytest.approx(_expected(backend, path, ids, c), abs=1e-4)
        assert result.usage.prompt_tokens < sum(len(ids) for ids in full)


def test_a_chunk_that_fails_is_rerun_request_by_request(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward pass that fails for one request of a chunk fails that request alone, with what went wrong."""
    backend, _ = tiny
    real = backend._branch_logprobs

    def failing(requests):
        if any("poison" in backend.tokenizer.decode(seqs[0]) for seqs in requests):
            raise RuntimeError("the forward pass ran out of memory")
        return real(requests)

    monkeypatch.setattr(backend, "_branch_logprobs", failing)
    requests = [LogprobRequest(user_chat("fine"), branches=(" a", " b")),
                LogprobRequest(user_chat("poison"), branches=(" a", " b"))]
    ok, bad = asyncio.run(backend.next_token_logprobs(requests, ["Yes"]))
    assert ok.ok and len(ok.branches) == 2
    assert bad.error is not None and "ran out of memory" in bad.error.message


def test_identical_branches_and_a_single_branch(tiny) -> None:
    backend, path = tiny
    same = LogprobRequest(user_chat("one two"), branches=(" three", " three"))
    alone = LogprobRequest(user_chat("one two"), branches=(" three",))
    a, b = asyncio.run(backend.next_token_logprobs([same, alone], ["Yes"]))
    assert a.branches[0]["Yes"] == pytest.approx(a.branches[1]["Yes"], abs=1e-5)
    assert a.branches[0]["Yes"] == pytest.approx(b.branches[0]["Yes"], abs=1e-5)
    ids = backend.encode(user_chat("one two three"))
    assert b.branches[0]["Yes"] == pytest.approx(_expected(backend, path, ids, "Yes"), abs=1e-4)


def test_a_branch_past_the_context_fails_its_request_only(tiny) -> None:
    backend, _ = tiny
    long = " ".join(["one two three four five"] * 200)
    bad = LogprobRequest(user_chat("Hi "), branches=("ok", long))
    good = LogprobRequest(user_chat("Hi "), branches=("ok",))
    failed, ok = asyncio.run(backend.next_token_logprobs([bad, good], ["Yes"]))
    assert failed.error is not None and failed.error.category is FailureCategory.BACKEND
    assert "context" in failed.error.message and ok.ok and len(ok.branches) == 1


def test_prefill_continues_the_assistant_turn(tiny) -> None:
    backend, path = tiny
    messages = user_chat("Is the answer Yes or No?")
    [c] = asyncio.run(
        backend.generate([GenerateRequest(messages, SamplingParams(max_tokens=6), assistant_prefix="Answer:")])
    )
    assert c.ok and c.usage.prompt_tokens == len(backend.encode(messages, "Answer:"))
    ids = backend.encode(messages, "Answer:")
    expected = []
    for _ in range(c.usage.completion_tokens):
        token = int(_direct(path, ids + expected).argmax())
        if token in backend._eos_ids:
            break
        expected.append(token)
    assert c.texts[0] == backend._tok.decode(expected, skip_special_tokens=True)
    [plain] = asyncio.run(backend.generate([GenerateRequest(messages, SamplingParams(max_tokens=6))]))
    assert plain.usage.prompt_tokens < c.usage.prompt_tokens


@pytest.mark.slow
def test_smollm2_min_tokens_holds_back_the_end_of_turn() -> None:
    backend = load_backend("smollm2-135m")
    try:
        chat = (Message("user", "Reply with one word: is water wet?"),)
        short, held = asyncio.run(
            backend.generate(
                [
                    GenerateRequest(chat, SamplingParams(max_tokens=40)),
                    GenerateRequest(chat, SamplingParams(max_tokens=40, min_tokens=12)),
                ]
            )
        )
    finally:
        asyncio.run(backend.close())
    assert short.ok and held.ok
    assert short.usage.completion_tokens < 12  # the model ends on its own quickly...
    assert held.usage.completion_tokens >= 12 and held.texts[0].startswith(short.texts[0].rstrip("."))
