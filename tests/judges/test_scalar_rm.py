"""The `scalar-rm` evaluator on tiny random reward models built in the test.

The models (hidden 32, 2 layers, a ~200-token BPE vocabulary trained here) are random, so their scores mean
nothing; the tests check the mechanics against a direct forward pass: rendering, batching, the "w/ responses"
input, truncation, the call cache, the lm-token0 head, sharing, failures and errors.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiny_models import tiny_tokenizer

from harness.cache import CallCache
from harness.errors import ConfigError, FailureCategory, ModelNotFoundError
from harness.pool import BackendPool
from harness.registry import lookup
from judges.base import parse_evaluator_spec

pytest.importorskip("torch")
pytest.importorskip("transformers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is the answer Yes or No? Yes. No. Maybe.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Other candidate responses for reference: [Candidate 1] [Candidate 2]",
]
PROMPT = "Is the answer Yes or No?"
RESPONSES = [
    "Yes.",
    "No, the answer is no, because the fox is quick.",
    "Maybe. How are you today? I am fine.",
]


def build_rm(
    path: Path, *, chat_template: bool = True, pad: bool = True, causal: bool = False, seed: int = 0
) -> Path:
    """Save a tiny random Llama reward model (sequence classifier, or a causal LM) and its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tok = tiny_tokenizer(
        CORPUS,
        vocab_size=200,
        specials=["<pad>", "<unk>", "<s>", "<|im_start|>", "<|im_end|>"],
        bos="<s>",
        chat_template=chat_template,
    )
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tok.pad_token_id if pad else None,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config) if causal else LlamaForSequenceClassification(config)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_rm(tmp_path_factory.mktemp("rm") / "model")


def load_evaluator(spec: str, pool: BackendPool):
    """Build an evaluator from its spec through the registry (as `judges.load_evaluator` does)."""
    import judges.scalar_rm  # noqa: F401  (registers the kind)

    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, pool)


@functools.lru_cache(maxsize=8)
def _reference(path: Path, causal: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    return AutoTokenizer.from_pretrained(str(path)), auto.from_pretrained(
        str(path), dtype=torch.float32
    ).eval()


def direct_score(
    path: Path, user: str, assistant: str, *, template: bool = True, causal: bool = False
) -> float:
    """The reward of one conversation by a plain, unbatched forward pass."""
    import torch

    tok, model = _reference(path, causal)
    if template:
        chat = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        ids = tok.encode(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
    else:
        ids = tok.encode(f"User: {user}\n\nAssistant: {assistant}", add_special_tokens=True)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits
    return float(logits[0, -1, 0] if causal else logits[0, 0])


def score(
    spec: str, prompt: str = PROMPT, responses=RESPONSES, *, seed: int = 0, cache: CallCache | None = None
):
    async def go():
        evaluator = load_evaluator(spec, BackendPool(cache=cache))
        try:
            return evaluator, await evaluator.score_set(prompt, responses, seed=seed)
        finally:
            await evaluator.close()

    return asyncio.run(go())


# ------------------------------------------------------------------------------------------------------------


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, judges.scalar_rm; assert not {'torch', 'transformers'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scores_equal_a_direct_forward_pass(rm_dir: Path) -> None:
    _, result = score(f"scalar-rm:model={rm_dir},dtype=float32")
    expected = [direct_score(rm_dir, PROMPT, r) for r in RESPONSES]
    assert result.scores == pytest.approx(expected, abs=1e-5)
    assert result.trace.failures == () and result.trace.calls == 3 and result.trace.order is None
    assert len(set(result.scores)) == 3  # the responses really are told apart
    assert all(isinstance(n, int) for n in result.trace.to_json()["raw"]["input_tokens"])


def test_batching_does_not_change_scores(rm_dir: Path) -> None:
    responses = [*RESPONSES, "x", "Hello, world! " * 5, "fine"]
    _, one = score(f"scalar-rm:model={rm_dir},batch_size=1", responses=responses)
    _, many = score(f"scalar-rm:model={rm_dir},batch_size=4", responses=responses)
    assert many.scores == pytest.approx(one.scores, abs=1e-5)


def test_with_responses_shows_the_other_candidates(rm_dir: Path) -> None:
    from judges.scalar_rm import CONTEXT_HEADER, with_responses_prompt

    _, plain = score(f"scalar-rm:model={rm_dir}")
    _, seen = score(f"scalar-rm:model={rm_dir},with_responses=true", seed=7)
    order = seen.trace.order
    assert sorted(order) == [0, 1, 2]
    for i, r in enumerate(RESPONSES):
        others = [RESPONSES[j] for j in order if j != i]
        context = with_responses_prompt(PROMPT, others)
        assert context.startswith(PROMPT + "\n\n" + CONTEXT_HEADER + "\n\n[Candidate 1]\n" + others[0])
        assert seen.scores[i] == pytest.approx(direct_score(rm_dir, context, r), abs=1e-5)
        assert seen.scores[i] != pytest.approx(plain.scores[i], abs=1e-4)
    _, again = score(f"scalar-rm:model={rm_dir},with_responses=true", seed=7)
    assert again.scores == seen.scores and again.trace.order == order

    async def orders_for_seeds():
        evaluator = load_evaluator(f"scalar-rm:model={rm_dir},with_responses=true", BackendPool())
        try:
            return {
                tuple((await evaluator.score_set(PROMPT, RESPONSES, seed=s)).trace.order) for s in range(8)
            }
        finally:
            await evaluator.close()

    orders = asyncio.run(orders_for_seeds())
    assert len(orders) > 1  # the seed shuffles the others' order


def test_single_response(rm_dir: Path) -> None:
    _, plain = score(f"scalar-rm:model={rm_dir}", responses=["Yes."])
    _, seen = score(f"scalar-rm:model={rm_dir},with_responses=true", responses=["Yes."])
    assert plain.scores == seen.scores == pytest.approx((direct_score(rm_dir, PROMPT, "Yes."),), abs=1e-5)
    assert seen.trace.order is None
    assert score(f"scalar-rm:model={rm_dir}", responses=[])[1].scores == ()


def test_truncation_is_noted_and_keeps_the_end(rm_dir: Path) -> None:
    long = "The quick brown fox jumps over the lazy dog. " * 8
    _, result = score(f"scalar-rm:model={rm_dir},max_length=500", responses=[long, "Yes."])
    assert result.trace.raw["max_length"] == 500  # the setting; the model's context (128) clamps it
    (note,) = result.trace.raw["truncated"]
    assert note["response"] == 0 and note["tokens"] > 128 and note["kept"] == 128
    assert result.trace.failures == () and all(math.isfinite(s) for s in result.scores)


def test_call_cache_serves_repeats_and_keys_on_the_input(rm_dir: Path, tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite")
    _, first = score(f"scalar-rm:model={rm_dir}", cache=cache)
    _, second = score(f"scalar-rm:model={rm_dir}", cache=cache, seed=5)
    assert first.trace.calls == 3 and second.trace.calls == 0 and second.scores == first.scores
    assert second.trace.raw == first.trace.raw  # a cached score's trace says what a computed one says
    _, other = score(f"scalar-rm:model={rm_dir},with_responses=true", cache=cache)
    assert other.trace.calls == 3  # a different input is a different entry
    assert cache.stats().entries == 6


def test_a_fully_cached_set_loads_no_model(rm_dir: Path, tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite")
    spec = f"scalar-rm:model={rm_dir}"
    _, first = score(spec, cache=cache)

    async def go():
        evaluator = load_evaluator(spec, BackendPool(cache=cache))
        try:
            result = await evaluator.score_set(PROMPT, RESPONSES, seed=0)
            assert evaluator._rm is None  # every score came from the cache: the weights never loaded
            return result
        finally:
            await evaluator.close()

    again = asyncio.run(go())
    assert again.scores == first.scores and again.trace.calls == 0


def test_forward_failure_is_recorded_not_scored(rm_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import judges.scalar_rm as mod

    real = mod._forward
    calls = []

    def flaky(rm, rows):
        calls.append(rows)
        if len(calls) == 1:  # the longest input goes first
            raise RuntimeError("CUDA out of memory")
        return real(rm, rows)

    monkeypatch.setattr(mod, "_forward", flaky)
    cache = CallCache(tmp_path / "c.sqlite")
    _, result = score(f"scalar-rm:model={rm_dir},batch_size=1", cache=cache)
    assert result.n_unscored == 1 and len(calls) == 3
    (failure,) = result.trace.failures
    assert result.scores[failure.response] is None and failure.stage == "score"
    assert failure.failure.category is FailureCategory.BACKEND and "out of memory" in failure.failure.message
    assert cache.stats().entries == 2  # the failure was not cached


def test_plain_text_fallback_without_chat_template(tmp_path: Path) -> None:
    path = build_rm(tmp_path / "plain", chat_template=False)
    _, result = score(f"scalar-rm:model={path}")
    expected = [direct_score(path, PROMPT, r, template=False) for r in RESPONSES]
    assert result.scores == pytest.approx(expected, abs=1e-5)


def test_classifier_without_pad_token_runs_unbatched(tmp_path: Path) -> None:
    path = build_rm(tmp_path / "nopad", pad=False)
    _, result = score(f"scalar-rm:model={path},batch_size=8")
    assert result.scores == pytest.approx([direct_score(path, PROMPT, r) for r in RESPONSES], abs=1e-5)


def test_lm_token0_head_and_head_mismatch(tmp_path: Path) -> None:
    path = build_rm(tmp_path / "causal", causal=True)
    with pytest.raises(ConfigError, match=r"not a \*ForSequenceClassification.*head=lm-token0"):
        score(f"scalar-rm:model={path}")
    _, result = score(f"scalar-rm:model={path},head=lm-token0,batch_size=3")
    expected = [direct_score(path, PROMPT, r, causal=True) for r in RESPONSES]
    assert result.scores == pytest.approx(expected, abs=1e-5)


def test_evaluators_of_one_model_share_it(rm_dir: Path) -> None:
    import judges.scalar_rm as mod

    async def go():
        pool = BackendPool()
        a = load_evaluator(f"scalar-rm:model={rm_dir},dtype=float32", pool)
        b = load_evaluator(f"scalar-rm:model=hf:{rm_dir},dtype=float32,with_responses=true", pool)
        assert a._rm is None and b._rm is None  # nothing loads until a score is not in the cache
        assert a._held() is b._held() and a._rm.users == 2
        loaded = a._rm
        await a.close()
        assert loaded.model is not None and loaded.users == 1
        await b.close()
        assert loaded.model is None and a._key not in mod._LOADED

    asyncio.run(go())


def test_spec_is_canonical(rm_dir: Path) -> None:
    evaluator, _ = score(f"scalar-rm:with_responses=yes,model=hf:{rm_dir},batch_size=2", responses=["x"])
    # Defaults and runtime-only settings (batch size, device) stay out of the name.
    assert evaluator.spec == f"scalar-rm:model={rm_dir},with_responses=true"
    again, _ = score(evaluator.spec, responses=["x"])
    assert again.spec == evaluator.spec


@pytest.mark.parametrize(
    "settings, error, message",
    [
        ("", ConfigError, "missing required setting"),
        ("model={dir},temperature=0", ConfigError, "unknown setting.*temperature"),
        ("model={dir},with_responses=maybe", ConfigError, "with_responses"),
        ("model={dir},head=pooler", ConfigError, "unknown head"),
        ("model={dir},batch_size=0", ConfigError, "batch_size must be"),
        ("model={missing}", ModelNotFoundError, "scalar-rm: reward model path not found"),
        ("model={dir}/config.json", ModelNotFoundError, "is a file"),
        ("model=nobody/no-such-rm", ModelNotFoundError, "'nobody/no-such-rm' is not in the local Hugging Face cache"),
    ],
)
def test_bad_settings(rm_dir: Path, tmp_path: Path, settings: str, error: type, message: str) -> None:
    spec = "scalar-rm:" + settings.format(dir=rm_dir, missing=tmp_path / "nope")
    with pytest.raises(error, match=message) as info:
        load_evaluator(spec, BackendPool())
    assert "\n" not in str(info.value)


def test_truncate_left_keeps_a_leading_bos() -> None:
    from judges.scalar_rm import truncate_left

    assert truncate_left([9, 1, 2, 3, 4], 3, bos_id=9) == [9, 3, 4]
    assert truncate_left([1, 2, 3, 4], 3, bos_id=9) == [2, 3, 4]
    assert truncate_left([9, 1, 2], 3, bos_id=9) == [9, 1, 2]


def test_bfloat16_scores_are_close_and_named_in_the_identity(rm_dir: Path) -> None:
    evaluator, half = score(f"scalar-rm:model={rm_dir},dtype=bfloat16")
    _, full = score(f"scalar-rm:model={rm_dir},dtype=float32")
    assert evaluator.identity()["dtype"] == "bfloat16" and "weights" in evaluator.identity()
    assert half.scores == pytest.approx(full.scores, abs=0.1)


@pytest.mark.slow
def test_alias_resolves_to_the_embedded_model_and_keeps_its_name() -> None:
    import asyncio
    import math

    from harness.pool import BackendPool
    from judges import load_evaluator

    evaluator = load_evaluator("scalar-rm:model=smollm2-135m,head=lm-token0", BackendPool())
    try:
        assert evaluator.spec == "scalar-rm:head=lm-token0,model=smollm2-135m"
        result = asyncio.run(evaluator.score_set("What is 2+2?", ["4", "five", "The answer is 4."], seed=0))
    finally:
        asyncio.run(evaluator.close())
    assert result.n_unscored == 0 and all(math.isfinite(s) for s in result.scores)
