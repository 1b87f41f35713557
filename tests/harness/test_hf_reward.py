"""The `score` operation of the `hf` backend (`harness.backends.hf_reward`) on tiny random reward models, against
direct transformers forward passes; and what a reward-model checkpoint refuses to do."""

from __future__ import annotations

import asyncio
import functools
import math
from pathlib import Path

import pytest
from tiny_models import build_tiny_rm

from harness.backends.base import (
    BackendOptions,
    GenerateRequest,
    LogprobRequest,
    Message,
    SamplingParams,
    ScoreRequest,
    user_chat,
)
from harness.errors import ConfigError

pytest.importorskip("torch")
pytest.importorskip("transformers")

CHATS = [
    ("Is the answer Yes or No?", "Yes."),
    ("Hello, world!", "How are you today? I am fine, thank you."),
    ("The quick brown fox", "jumps over the lazy dog. " * 12),  # longer than the context (128)
]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_rm(tmp_path_factory.mktemp("rm") / "classifier")


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_rm(tmp_path_factory.mktemp("rm") / "causal", causal=True)


def hf(path: Path, **options):
    from harness.backends.hf import HFBackend

    return HFBackend(str(path), BackendOptions(dtype="float32", **options))


def requests(head: str = "classifier") -> list[ScoreRequest]:
    return [ScoreRequest((Message("user", u), Message("assistant", a)), head) for u, a in CHATS]


@functools.lru_cache(maxsize=4)
def reference(path: Path, causal: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    return AutoTokenizer.from_pretrained(str(path)), auto.from_pretrained(str(path), dtype=torch.float32).eval()


def direct(path: Path, user: str, assistant: str, *, causal: bool) -> tuple[float, int]:
    """The score and the token count of one conversation, by a plain unbatched forward pass of the last 128."""
    import torch

    tok, model = reference(path, causal)
    chat = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    ids = tok.encode(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
    kept = ids if len(ids) <= 128 else ids[len(ids) - 128 :]  # the template writes no BOS: a plain left cut
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([kept])).logits
    return float(logits[0, -1, 0] if causal else logits[0, 0]), len(ids)


@pytest.mark.parametrize("head", ["classifier", "lm-token0"])
def test_score_equals_a_direct_forward_pass(head: str, classifier_dir: Path, causal_dir: Path) -> None:
    path = classifier_dir if head == "classifier" else causal_dir
    backend = hf(path, batch_size=2)
    assert backend.loads == 0  # identified, not loaded
    results = asyncio.run(backend.score(requests(head)))
    assert backend.loads == 1
    for (user, assistant), result in zip(CHATS, results):
        value, tokens = direct(path, user, assistant, causal=head == "lm-token0")
        assert result.ok and math.isclose(result.score, value, abs_tol=1e-5), (result, value)
        assert result.tokens == tokens and result.kept == min(tokens, 128) and not result.cached
    assert [r.truncated for r in results] == [False, False, True]
    asyncio.run(backend.close())


def test_a_reward_model_scores_but_cannot_generate(classifier_dir: Path) -> None:
    backend = hf(classifier_dir)
    backend.check_score("classifier")
    with pytest.raises(ConfigError, match=r"is a LlamaForSequenceClassification checkpoint, not a \*ForCausalLM"):
        backend.check_score("lm-token0")
    with pytest.raises(ConfigError, match="LlamaForSequenceClassification checkpoint: a reward model scores"):
        asyncio.run(backend.generate([GenerateRequest(user_chat("Hello"), SamplingParams(max_tokens=2))]))
    with pytest.raises(ConfigError, match="cannot generate text or next-token logprobs"):
        asyncio.run(backend.next_token_logprobs([LogprobRequest(user_chat("Hello"))], ["Yes"]))
    with pytest.raises(ConfigError, match=r"not a \*ForCausalLM one as head=lm-token0 needs"):
        asyncio.run(backend.score(requests("lm-token0")))
    assert all(r.ok for r in asyncio.run(backend.score(requests())))  # the refusals broke nothing
    asyncio.run(backend.close())


def test_a_causal_lm_refuses_the_classifier_head(causal_dir: Path) -> None:
    backend = hf(causal_dir)
    with pytest.raises(ConfigError, match=r"LlamaForCausalLM checkpoint, not a \*ForSequenceClassification.*lm-token0"):
        backend.check_score("classifier")
    with pytest.raises(ConfigError, match=r"not a \*ForSequenceClassification one as head=classifier needs"):
        asyncio.run(backend.score(requests()))
    asyncio.run(backend.close())


def test_a_conversation_the_template_rejects_fails_alone(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = build_tiny_rm(tmp_path / "strict")
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    tok.save_pretrained(str(path))
    backend = hf(path)
    system = ScoreRequest((Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello")))
    bad, good = asyncio.run(backend.score([system, requests()[0]]))
    assert not bad.ok and bad.score is None and "cannot render the conversation" in bad.error.message
    assert good.ok and bad.tokens is None
    asyncio.run(backend.close())


def test_score_requests_check_their_fields() -> None:
    chat = (Message("user", "Hi"), Message("assistant", "Hello"))
    with pytest.raises(ValueError, match="unknown score head"):
        ScoreRequest(chat, "pooler")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length"):
        ScoreRequest(chat, max_length=1)
    with pytest.raises(ValueError, match="must end with the assistant turn"):
        ScoreRequest(chat[:1])
