"""The generator's rollouts decode under the rubric grammar: on the transformers path through our trainer's
generation step (TRL's `model.generate` with our llguidance mask), on the vLLM path through TRL's
`generation_kwargs`. The mask changes which tokens are sampled; the logprobs GRPO trains on stay the model's own
(TRL's forward pass over the whole vocabulary), never the masked distribution's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")
torch = pytest.importorskip("torch")

from harness.backends.base import Constraint  # noqa: E402
from judges.rubric import RubricParseError, parse_rubric, rubric_schema  # noqa: E402

SMALL = Constraint.json_schema(rubric_schema(max_items=2, max_chars=20), name="rubric")
"""A rubric grammar a byte-level tiny model completes within 128 tokens (at most ~110 characters)."""
PROMPT = [{"role": "user", "content": "Write a rubric."}]


def _trainer(model: Path, out: Path, *, rollouts: Constraint | None, **extra):
    from datasets import Dataset

    from training.grpo import GRPOSettings, grpo_config
    from training.trainer import DRGRPOTrainer

    settings = GRPOSettings(num_generations=4, per_device_train_batch_size=4, max_completion_length=128,
                            max_steps=1, seed=0, report_to=[], extra=extra)
    args = grpo_config(settings, out, rollouts=rollouts)
    return DRGRPOTrainer(model=str(model), reward_funcs=[lambda prompts, **_: [0.0] * len(prompts)], args=args,
                         train_dataset=Dataset.from_list([{"prompt": PROMPT}] * 4), rollout_constraint=rollouts)


def _parses(ids: list[int], tokenizer) -> bool:
    try:
        parse_rubric(tokenizer.decode(ids, skip_special_tokens=True))
    except RubricParseError:
        return False
    return True


def _rollouts(trainer) -> list[list[int]]:
    prompt_ids, images, fields = trainer._tokenize_prompts([PROMPT] * 4)  # TRL's own rendering
    torch.manual_seed(0)
    completions, logprobs = trainer._generate_single_turn(prompt_ids, images, fields, 4)
    assert logprobs is None  # no sampling logprobs: TRL computes the model's own
    return completions


def test_the_mask_makes_every_rollout_a_rubric_and_changes_the_tokens(tmp_path: Path, tiny_lm: Path):
    masked = _trainer(tiny_lm, tmp_path / "m", rollouts=SMALL)
    free = _trainer(tiny_lm, tmp_path / "f", rollouts=None)
    with_mask, without = _rollouts(masked), _rollouts(free)
    tok = masked.processing_class
    assert all(_parses(ids, tok) for ids in with_mask), [tok.decode(ids) for ids in with_mask]
    assert not any(_parses(ids, tok) for ids in without)
    assert with_mask != without
    assert all(ids[-1] in masked.eos_token_ids for ids in with_mask)  # the grammar closed, then end-of-sequence


def _allowed(mask, constraint: Constraint, tokens: list[int], vocab: int) -> list[torch.Tensor]:
    """The tokens the grammar allowed at each position of `tokens` (replayed with a fresh matcher)."""
    matcher = mask.matcher(constraint)
    row = torch.zeros(mask.words, dtype=torch.int32)
    out = []
    for token in tokens:
        if matcher.is_stopped():
            break
        mask.fill(matcher, row)
        bits = ((row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(-1).bool()[:vocab]
        out.append(torch.nn.functional.pad(bits, (0, max(0, vocab - bits.numel()))))
        assert matcher.consume_token(token)
    return out


def test_the_logprobs_grpo_uses_are_the_models_own_not_the_masked_ones(tmp_path: Path, tiny_lm: Path):
    """With `num_iterations: 2` TRL keeps the sampling step's per-token logprobs (`old_per_token_logps`, the
    ratio's denominator), from its own forward pass: they equal the full-vocabulary log-softmax of the model's
    logits at the sampled tokens, and lie below the masked distribution's wherever the mask cut mass away."""
    trainer = _trainer(tiny_lm, tmp_path / "t", rollouts=SMALL, num_iterations=2)
    trainer.model.train()
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([{"prompt": PROMPT} for _ in range(4)])
    assert "sampling_per_token_logps" not in batch and "importance_sampling_ratio" not in batch
    old = batch["old_per_token_logps"]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1].float()
    own = torch.log_softmax(logits / trainer.temperature, dim=-1)
    sampled = batch["completion_ids"].unsqueeze(-1)
    expected = own.gather(-1, sampled).squeeze(-1)
    keep = batch["completion_mask"].bool()
    assert torch.allclose(old[keep], expected[keep], atol=1e-5)
    below = 0
    vocab = logits.shape[-1]
    for row in range(ids.shape[0]):
        tokens = batch["completion_ids"][row][keep[row]].tolist()
        for t, allowed in enumerate(_allowed(trainer._mask, SMALL, tokens, vocab)):
            assert allowed[tokens[t]], "a sampled token the grammar did not allow"
            masked = own[row, t].masked_fill(~allowed, float("-inf")).log_softmax(-1)[tokens[t]]
            assert old[row, t] <= masked + 1e-6
            below += bool(old[row, t] < masked - 1e-3)
    assert below > 0  # the mask's renormalisation is not in the logprobs GRPO uses


def test_vllm_generation_gets_the_same_grammar_and_no_importance_correction(tmp_path: Path):
    from harness.backends.grammar import lark_grammar
    from training.grpo import GRPOSettings, grpo_config
    from training.rollouts import rollout_constraint

    grammar = rollout_constraint(96)
    settings = GRPOSettings(num_generations=2, per_device_train_batch_size=2, use_vllm=True, report_to=[],
                            extra={"generation_kwargs": {"seed": 3}})
    args = grpo_config(settings, tmp_path, rollouts=grammar)
    assert args.generation_kwargs == {"structured_outputs": {"grammar": lark_grammar(grammar)}, "seed": 3}
    assert args.vllm_importance_sampling_correction is False
    kept = grpo_config(settings.model_copy(update={"extra": {"vllm_importance_sampling_correction": True}}),
                       tmp_path, rollouts=grammar)
    assert kept.vllm_importance_sampling_correction is True
    plain = grpo_config(settings, tmp_path, rollouts=None)
    assert plain.generation_kwargs == {"seed": 3} and plain.vllm_importance_sampling_correction is True
    transformers = grpo_config(settings.model_copy(update={"use_vllm": False}), tmp_path, rollouts=grammar)
    assert not (transformers.generation_kwargs or {}).get("structured_outputs")  # masked by the trainer instead
