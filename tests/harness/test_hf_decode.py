"""The `hf` backend's own decode loop (`harness.backends.hf_decode`) against transformers' `generate`, and its
jump-forward under a grammar against decoding the same grammar one token per pass, on the embedded SmolLM2."""

from __future__ import annotations

import asyncio
import random

import pytest

from harness.backends import load_backend
from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat
from judges.dynamic import rubric_constraint
from judges.rubric import parse_rubric

PROMPTS = [
    "Write a rubric to judge answers to: what is the capital of Australia? A) Sydney B) Canberra.",
    "Write a short rubric for a haiku about autumn.",
    "List three criteria for a good apology email, briefly.",
]


@pytest.fixture(scope="module")
def smollm2():
    backends = {}

    def get(jump_forward: bool):
        if jump_forward not in backends:
            backends[jump_forward] = load_backend("smollm2-135m", BackendOptions(jump_forward=jump_forward,
                                                                                  batch_size=4))
        return backends[jump_forward]

    yield get
    for backend in backends.values():
        asyncio.run(backend.close())


def _generate(backend, params: SamplingParams):
    before = dict(backend.decode_counts)
    out = asyncio.run(backend.generate([GenerateRequest(user_chat(p), params) for p in PROMPTS]))
    counts = {k: v - before[k] for k, v in backend.decode_counts.items()}
    assert all(c.error is None for c in out)
    return out, counts


def test_free_text_is_token_for_token_what_generate_decodes(smollm2):
    """Greedy rows of different prompt lengths, batched and left-padded in our loop, against `model.generate` on each
    prompt alone."""
    import torch

    backend = smollm2(True)
    out, _ = _generate(backend, SamplingParams(max_tokens=24))
    for prompt, completion in zip(PROMPTS, out):
        ids = backend.encode(user_chat(prompt))
        with torch.inference_mode():
            ref = backend._lm.generate(torch.tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                                       max_new_tokens=24, do_sample=False)
        expected = ref[0, len(ids):].tolist()
        assert completion.usage.completion_tokens == len(expected)
        assert completion.texts[0] == backend.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_jump_forward_changes_no_output_and_saves_forward_passes(smollm2, temperature):
    """Under the rubric grammar, with jump-forward and without: the same texts (greedy, and sampled with the same
    seeds: a forced token advances the row's generator as a draw would), the same token counts, every text a
    rubric; the forced tokens are fed without passes of their own."""
    params = SamplingParams(max_tokens=96, temperature=temperature, n=2 if temperature else 1, seed=3,
                            constraint=rubric_constraint(96))
    stepped, stepped_counts = _generate(smollm2(False), params)
    jumped, jumped_counts = _generate(smollm2(True), params)
    assert [c.texts for c in jumped] == [c.texts for c in stepped]
    assert [c.usage.completion_tokens for c in jumped] == [c.usage.completion_tokens for c in stepped]
    for completion in jumped:
        for text in completion.texts:
            parse_rubric(text)
    assert stepped_counts["forced_tokens"] == 0 and jumped_counts["forced_tokens"] > 0
    assert jumped_counts["tokens"] == stepped_counts["tokens"]
    assert jumped_counts["forward_passes"] <= stepped_counts["forward_passes"] - jumped_counts["forced_tokens"] // 4


def test_jump_forward_keeps_each_tokens_logprob(smollm2):
    """Logprobs of forced tokens come from the pass that fed them: the same tokens and values, to float rounding."""
    params = SamplingParams(max_tokens=64, logprobs=3, constraint=rubric_constraint(64))
    stepped, _ = _generate(smollm2(False), params)
    jumped, _ = _generate(smollm2(True), params)
    for a, b in zip(stepped, jumped):
        assert [t.token for t in a.logprobs[0]] == [t.token for t in b.logprobs[0]]
        assert "".join(t.token for t in b.logprobs[0]) == b.texts[0]
        for x, y in zip(a.logprobs[0], b.logprobs[0]):
            assert y.logprob == pytest.approx(x.logprob, abs=1e-3)
            assert set(y.top) == set(x.top) or len(y.top) == len(x.top)


def test_the_rubric_grammar_closes_within_every_budget_it_accepts():
    """Random walks over SmolLM2's and Gemma 3's tokenizers under the rubric grammar, at budgets from the smallest
    it accepts: every walk ends (the grammar complete) within the budget, and parses."""
    import llguidance
    import torch

    from harness.backends.grammar import TokenMask

    rng = random.Random(0)
    for name in ("smollm2-135m", "gemma3-270m"):
        backend = load_backend(name)
        tokenizer = backend.tokenizer
        asyncio.run(backend.close())
        mask = TokenMask(tokenizer)
        bits = torch.zeros((1, mask.words), dtype=torch.int32)
        shifts = torch.arange(32, dtype=torch.int32)
        for budget in [43, 44, 50, 63, 64, 65, 96, 160]:
            constraint = rubric_constraint(budget)
            for _ in range(4):
                matcher, tokens = mask.matcher(constraint), []
                while not matcher.is_stopped():
                    assert len(tokens) < budget, (name, budget, tokenizer.decode(tokens))
                    mask.fill(matcher, bits[0])
                    allowed = ((bits[0].unsqueeze(-1) >> shifts) & 1).reshape(-1)[: mask.vocab_size].nonzero()
                    token = int(allowed[rng.randrange(len(allowed))])
                    assert matcher.consume_token(token)
                    tokens.append(token)
                assert isinstance(matcher, llguidance.LLMatcher)
                parse_rubric(tokenizer.decode(tokens))


@pytest.mark.slow
def test_the_embedded_model_never_cuts_a_constrained_rubric(smollm2):
    """SmolLM2 sampling rubrics under the grammar at small budgets: every one parses, none over its budget."""
    backend = smollm2(True)
    for budget in (43, 56, 96):
        params = SamplingParams(max_tokens=budget, temperature=1.0, n=3, seed=11, constraint=rubric_constraint(budget))
        out, _ = _generate(backend, params)
        for completion in out:
            assert completion.usage.completion_tokens <= budget * len(completion.texts)
            for text in completion.texts:
                parse_rubric(text)


def test_masks_computed_beside_the_forward_pass_change_no_output(smollm2):
    """On an accelerator the next masks are computed in a thread while the forward pass runs; on the CPU in turn.
    Both give the same rubrics (sampled, seeded)."""
    from concurrent.futures import ThreadPoolExecutor

    backend = smollm2(True)
    params = SamplingParams(max_tokens=64, temperature=0.8, n=2, seed=5, constraint=rubric_constraint(64))
    inline, _ = _generate(backend, params)
    assert backend._masks_pool is None  # the CPU computes masks in turn
    backend._masks_pool = ThreadPoolExecutor(1, thread_name_prefix="hf-masks")
    try:
        beside, _ = _generate(backend, params)
    finally:
        backend._masks_pool.shutdown()
        backend._masks_pool = None
    assert [c.texts for c in beside] == [c.texts for c in inline]
