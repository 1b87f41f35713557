"""The `scalar-rm` evaluator on tiny random reward models built in the test, through the `hf` backend.

The models (`tiny_models.build_tiny_rm`: hidden 32, 2 layers, a ~200-token BPE vocabulary trained here) are
random, so their scores mean nothing; the tests check the mechanics against a direct forward pass: rendering,
batching, the "w/ responses" input, truncation, the call cache, the lm-token0 head, sharing, failures and errors.
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

from tiny_models import build_tiny_rm

from harness.cache import CallCache
from harness.errors import ConfigError, FailureCategory, ModelNotFoundError
from harness.pool import BackendPool
from harness.registry import lookup
from judges.base import parse_evaluator_spec

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = "Is the answer Yes or No?"
RESPONSES = [
    "Yes.",
    "No, the answer is no, because the fox is quick.",
    "Maybe. How are you today? I am fine.",
]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_rm(tmp_path_factory.mktemp("rm") / "model")


def load_evaluator(spec: str, pool: BackendPool):
    """Build an evaluator from its spec through the registry (as `judges.load_evaluator` does)."""

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
    """Build the evaluator on a fresh pool, score one set, close both; returns (evaluator, SetScores)."""

    async def go():
        pool = BackendPool(cache=cache)
        try:
            evaluator = load_evaluator(spec, pool)
            try:
                return evaluator, await evaluator.score_set(prompt, responses, seed=seed)
            finally:
                await evaluator.close()
        finally:
            await pool.close()

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
        pool = BackendPool()
        evaluator = load_evaluator(f"scalar-rm:model={rm_dir},with_responses=true", pool)
        try:
            return {
                tuple((await evaluator.score_set(PROMPT, RESPONSES, seed=s)).trace.order) for s in range(8)
            }
        finally:
            await pool.close()

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


def test_a_rerun_through_a_fresh_pool_is_all_cache_hits_and_loads_no_model(rm_dir: Path, tmp_path: Path) -> None:
    spec = f"scalar-rm:model={rm_dir},with_responses=true"
    path = tmp_path / "c.sqlite"

    async def run_once(cache: CallCache):
        pool = BackendPool(cache=cache)
        try:
            evaluator = load_evaluator(spec, pool)
            result = await evaluator.score_set(PROMPT, RESPONSES, seed=3)
            return result, pool.calls, pool.hits, evaluator.backend.backend.loads
        finally:
            await pool.close()

    first, calls, hits, loads = asyncio.run(run_once(CallCache(path)))
    assert (calls, hits, loads) == (3, 0, 1) and first.trace.calls == 3
    cache = CallCache(path)  # a new process would open the same file
    again, calls, hits, loads = asyncio.run(run_once(cache))
    assert (calls, hits, loads) == (0, 3, 0)  # every score from the cache: the weights never loaded
    assert again.scores == first.scores and again.trace.calls == 0 and again.trace.raw == first.trace.raw
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (3, 3, 3)
    assert stats.by_model == {f"hf:{rm_dir}": 3}


def test_forward_failure_is_recorded_not_scored(rm_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from harness.backends import hf_reward

    real = hf_reward.classifier_logits
    calls = []

    def flaky(torch, model, rows, pad_id):
        calls.append(rows)
        if len(calls) == 1:  # the longest input goes first
            raise RuntimeError("CUDA out of memory")
        return real(torch, model, rows, pad_id)

    monkeypatch.setattr(hf_reward, "classifier_logits", flaky)
    cache = CallCache(tmp_path / "c.sqlite")
    _, result = score(f"scalar-rm:model={rm_dir},batch_size=1", cache=cache)
    assert result.n_unscored == 1 and len(calls) == 3
    (failure,) = result.trace.failures
    assert result.scores[failure.response] is None and failure.stage == "score"
    assert failure.failure.category is FailureCategory.BACKEND and "out of memory" in failure.failure.message
    assert result.trace.raw["input_tokens"][failure.response] > 0  # rendered, then failed in the forward pass
    assert cache.stats().entries == 2  # the failure was not cached


def test_plain_text_fallback_without_chat_template(tmp_path: Path) -> None:
    path = build_tiny_rm(tmp_path / "plain", chat_template=False)
    _, result = score(f"scalar-rm:model={path}")
    expected = [direct_score(path, PROMPT, r, template=False) for r in RESPONSES]
    assert result.scores == pytest.approx(expected, abs=1e-5)


def test_classifier_without_pad_token_runs_unbatched(tmp_path: Path) -> None:
    path = build_tiny_rm(tmp_path / "nopad", pad=False)
    _, result = score(f"scalar-rm:model={path},batch_size=8")
    assert result.scores == pytest.approx([direct_score(path, PROMPT, r) for r in RESPONSES], abs=1e-5)


def test_lm_token0_head_and_head_mismatch(tmp_path: Path) -> None:
    path = build_tiny_rm(tmp_path / "causal", causal=True)
    with pytest.raises(ConfigError, match=r"not a \*ForSequenceClassification.*head=lm-token0"):
        score(f"scalar-rm:model={path}")
    _, result = score(f"scalar-rm:model={path},head=lm-token0,batch_size=3")
    expected = [direct_score(path, PROMPT, r, causal=True) for r in RESPONSES]
    assert result.scores == pytest.approx(expected, abs=1e-5)


def test_evaluators_of_one_model_share_its_backend(rm_dir: Path) -> None:
    async def go():
        pool = BackendPool()
        a = load_evaluator(f"scalar-rm:model={rm_dir},dtype=float32", pool)
        b = load_evaluator(f"scalar-rm:model=hf:{rm_dir},dtype=float32,with_responses=true", pool)
        backend = a.backend.backend
        assert b.backend is a.backend and backend.loads == 0  # nothing loads until a score is not cached
        await a.score_set(PROMPT, RESPONSES, seed=0)
        await b.score_set(PROMPT, RESPONSES, seed=0)
        assert backend.loads == 1 and pool.calls == 6
        own = load_evaluator(f"scalar-rm:model={rm_dir},dtype=bfloat16", pool)
        assert own.backend is not a.backend  # its own dtype: its own backend
        assert set(pool.identities()) == {f"hf:{rm_dir}[dtype=float32]", f"hf:{rm_dir}[dtype=bfloat16]"}
        await a.close()
        await b.close()
        assert backend._lm is not None  # evaluators do not own the model; the pool does
        await pool.close()
        assert backend._lm is None

    asyncio.run(go())


def test_settings_map_onto_the_pools_backend_options(rm_dir: Path) -> None:
    from harness.backends.base import BackendOptions

    pool = BackendPool(options=BackendOptions(dtype="float32", batch_size=4))
    same = load_evaluator(f"scalar-rm:model={rm_dir},dtype=float32,batch_size=4", pool)
    plain = load_evaluator(f"scalar-rm:model={rm_dir}", pool)
    assert same.backend is plain.backend is pool.get(f"hf:{rm_dir}")  # equal to the pool's options: shared
    assert plain.backend.backend.options.batch_size == 4 and plain.backend.identity()["dtype"] == "float32"
    small = load_evaluator(f"scalar-rm:model={rm_dir},batch_size=1,device=cpu", pool)
    assert small.backend is pool.get(f"hf:{rm_dir}", overrides={"batch_size": 1, "device": "cpu"})
    assert small.backend.backend.options.batch_size == 1 and small.backend.backend.options.dtype == "float32"
    assert small.spec == plain.spec  # batch size and device do not name the evaluator


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


def test_an_openai_server_scores_only_the_classifier_head() -> None:
    """A pooling server returns no LM logits: `lm-token0` is refused before any call; the classifier head is
    served by vLLM's pooling runner, which the first score call finds out (tests/harness/test_openai_served.py)."""
    from harness.backends.base import BackendOptions

    pool = BackendPool(options=BackendOptions(base_url="http://127.0.0.1:1/v1"))
    with pytest.raises(ConfigError, match="scalar-rm: openai:gpt-4.1 cannot score with head=lm-token0"):
        load_evaluator("scalar-rm:model=openai:gpt-4.1,head=lm-token0", pool)
    load_evaluator("scalar-rm:model=openai:gpt-4.1", pool)
    asyncio.run(pool.close())


def test_truncate_left_keeps_a_leading_bos() -> None:
    from harness.backends.local import truncate_left

    assert truncate_left([9, 1, 2, 3, 4], 3, bos_id=9) == [9, 3, 4]
    assert truncate_left([1, 2, 3, 4], 3, bos_id=9) == [2, 3, 4]
    assert truncate_left([9, 1, 2], 3, bos_id=9) == [9, 1, 2]


def test_bfloat16_scores_are_close_and_named_in_the_identity(rm_dir: Path) -> None:
    evaluator, half = score(f"scalar-rm:model={rm_dir},dtype=bfloat16")
    _, full = score(f"scalar-rm:model={rm_dir},dtype=float32")
    identity = evaluator.backend.identity()
    assert identity["dtype"] == "bfloat16" and "weights" in identity and identity["kind"] == "hf"
    assert evaluator.spec == f"scalar-rm:dtype=bfloat16,model={rm_dir}"
    assert half.scores == pytest.approx(full.scores, abs=0.1)


@pytest.mark.slow
def test_alias_resolves_to_the_embedded_model_and_keeps_its_name() -> None:
    import asyncio
    import math

    from harness.pool import BackendPool
    from judges import load_evaluator

    pool = BackendPool()
    evaluator = load_evaluator("scalar-rm:model=smollm2-135m,head=lm-token0", pool)
    try:
        assert evaluator.spec == "scalar-rm:head=lm-token0,model=smollm2-135m"
        assert evaluator.backend is pool.get("smollm2-135m")  # the alias's backend, shared with its other roles
        result = asyncio.run(evaluator.score_set("What is 2+2?", ["4", "five", "The answer is 4."], seed=0))
    finally:
        asyncio.run(pool.close())
    assert result.n_unscored == 0 and all(math.isfinite(s) for s in result.scores)
