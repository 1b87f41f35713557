"""The DR-Generator's rollouts decode under the rubric's grammar, on every generation path the trainer uses.

A rollout is a rubric the model being trained writes; unconstrained, a small model rarely closes the JSON within
its budget (SmolLM2-135M: none of its rubrics parsed within 96 tokens), every group is unscored and every
advantage 0. The grammar is the one the `dynamic-rubric` evaluator decodes under (`judges.dynamic.
rubric_constraint`: a JSON list of `{criterion, weight}` items whose count and criteria are bounded in tokens by
the completion budget, so that a rubric always closes within it), compiled by `harness.backends.grammar.lark_grammar`:

- **transformers** (`use_vllm: false`): TRL 1.16 builds a `GenerationConfig` from its generation kwargs and passes
  no logits processor. `training.trainer.DRGRPOTrainer` overrides TRL's one generation step
  (`_generate_single_turn`) for this path only and runs TRL's own `model.generate` call with our llguidance mask
  (`harness.backends.hf_rows.RowConstraint`, over the `hf` backend's batched masks) as its logits processor: it runs before the
  temperature and top-p warpers, so sampling draws from the tokens the grammar allows next, and once the rubric is
  complete only end-of-sequence. (TRL's other seam, the experimental `rollout_func`, would move prompt rendering
  and every rollout concern out of TRL; the override keeps TRL's tokenisation, batching and EOS handling.)
- **vLLM** (`use_vllm: true`, colocated or `trl vllm-serve`): TRL passes `generation_kwargs["structured_outputs"]`
  to vLLM (`StructuredOutputsParams` in colocate mode, the request body in server mode); `vllm_generation_kwargs`
  puts the same Lark grammar there (vLLM compiles it with llguidance, its `guidance` backend).

**The logprobs GRPO trains on are the model's own.** The mask changes which tokens get sampled, never the numbers
the loss uses: TRL recomputes the log-probabilities of the sampled tokens with its own forward pass of the model
(`_get_per_token_logps_and_entropies`: log-softmax of the logits over the whole vocabulary, divided by the
temperature), and the policy ratio, its clipping and the KL term all use those; the transformers path returns no
sampling logprobs at all. The vLLM path's *importance-sampling correction* (`vllm_importance_sampling_correction`,
TRL's default on) would compare them with vLLM's processed logprobs, which are the masked, renormalised
distribution: every rubric would be weighted by the product over its tokens of the mask's share of the model's
mass (at most 1, tiny early in training), so `training.grpo.grpo_config` switches the correction off for masked
rollouts (`grpo.extra` can switch it back on).
"""

from __future__ import annotations

from typing import Any

from harness.backends.base import Constraint


def rollout_constraint(max_completion_length: int) -> Constraint:
    """The grammar of the generator's rollouts: the evaluator's rubric constraint for a budget of
    `max_completion_length` tokens."""
    from judges.dynamic import rubric_constraint

    return rubric_constraint(max_completion_length)


def vllm_generation_kwargs(constraint: Constraint) -> dict[str, Any]:
    """TRL's `generation_kwargs` for vLLM generation under `constraint`: its Lark grammar as vLLM's structured
    outputs (a dict: TRL builds `StructuredOutputsParams` from it in colocate mode and sends it as the request's
    field in server mode)."""
    from harness.backends.grammar import lark_grammar

    return {"structured_outputs": {"grammar": lark_grammar(constraint)}}


def grammar_processor(tokenizer_mask: Any, constraint: Constraint, rows: int, width: int, eos_ids: list[int]) -> Any:
    """A `transformers.LogitsProcessor` masking `rows` sequences (prompts left-padded to `width` tokens) under
    `constraint`: the `hf` backend's `RowConstraint`, one llguidance matcher per row."""
    from harness.backends.hf_rows import Row, RowConstraint

    masked = [Row(i, 0, [], 0, 0.0, 1.0, None, (), constraint=constraint) for i in range(rows)]
    return RowConstraint(width, masked, tokenizer_mask, eos_ids)
