"""`DRGRPOTrainer`: TRL's `GRPOTrainer` with the generator's rollouts under the rubric grammar and an evaluation
that draws its samples from a random stream of its own.

Three overrides, nothing else of TRL's changes:

- `_generate_single_turn`, TRL's one generation step: on the transformers path with a rollout constraint it runs
  TRL's `model.generate` call (the same prompt ids, padding, generation config, model unwrapping and EOS rule) with
  our llguidance mask as its logits processor (`training.rollouts`); the vLLM path and unconstrained jobs are TRL's
  own (vLLM gets the grammar through TRL's `generation_kwargs`). It returns no sampling logprobs: TRL recomputes the
  model's own with its forward pass.
- `evaluate`: the held-out evaluation (`--eval-every`) samples under `torch.random.fork_rng`, seeded from the run
  seed, the step and the rank. Its samples depend on the weights and the step only, and the training run's random
  stream is the same with or without evaluation: an evaluated run trains exactly as an unevaluated one, and the base
  weights evaluated at a step's stream (`training.fit.evaluate_at`, a learning comparison's base arm) draw the
  samples a run of the same seed drew there with its own weights (at step 0, the very same ones). With
  `seen_dataset` (the training prompts evaluated, `data.eval_train`) a second pass follows on a stream of its own
  (the held-out stream is unchanged by it), its TRL metrics logged as `eval_seen/...` (`log`), not as held-out ones.

This module imports torch and TRL: import it inside functions.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import pad

from harness.backends.base import Constraint
from harness.errors import ConfigError
from harness.seeds import derive_seed


class DRGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` plus `rollout_constraint` (None: TRL's generation unchanged); see the module docstring."""

    def __init__(self, *args: Any, rollout_constraint: Constraint | None = None, seen_dataset: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rollout_constraint = rollout_constraint
        self.seen_dataset = seen_dataset
        """The training prompts evaluated after the held-out split at every evaluation (None: none)."""
        self._pass: str | None = None
        """`seen` while the training prompts' evaluation runs: its metrics are logged under that name."""
        self._mask: Any = None
        if rollout_constraint is not None and not self.use_vllm:
            self._mask = _token_mask(self.processing_class)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._mask is None or images is not None or multimodal_fields or self.use_transformers_continuous_batching:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        return self._masked_generate(prompt_ids), None

    def _masked_generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """TRL's transformers generation of `prompt_ids` (its padding, generation config and unwrapping), each row
        masked by the rollout grammar; every completion ends at its first end-of-sequence token (kept)."""
        from transformers import LogitsProcessorList

        from training.rollouts import grammar_processor

        device = self.accelerator.device
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        multiple = self.pad_to_multiple_of
        ids = pad(tensors, padding_value=self._tokenizer.pad_token_id, padding_side="left", pad_to_multiple_of=multiple)
        mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left",
                   pad_to_multiple_of=multiple)
        masker = grammar_processor(self._mask, self.rollout_constraint, len(prompt_ids), ids.shape[1],
                                   list(self.eos_token_ids))
        with (
            profiling_context(self, "transformers.generate"),
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            out = unwrapped.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     generation_config=self.generation_config,
                                     logits_processor=LogitsProcessorList([masker]))
        eos = set(self.eos_token_ids)
        completions = []
        for row in out[:, ids.shape[1]:].tolist():
            end = next((i for i, token in enumerate(row) if token in eos), len(row) - 1)
            completions.append(row[:end + 1])
        return completions

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
                 ) -> dict[str, float]:
        """TRL's evaluation, its samples drawn from a forked random stream seeded by (seed, step, rank); then, with
        `seen_dataset` and no dataset asked for, the training prompts' on a stream of their own."""
        metrics = self._forked("eval", super().evaluate, eval_dataset, ignore_keys, metric_key_prefix)
        if self.seen_dataset is not None and eval_dataset is None:
            self._pass = "seen"
            try:
                metrics.update(self._forked("eval-seen", super().evaluate, self.seen_dataset, ignore_keys,
                                            f"{metric_key_prefix}_seen"))
            finally:
                self._pass = None
        return metrics

    def _forked(self, stream: str, evaluate: Any, *args: Any) -> dict[str, float]:
        device = self.accelerator.device
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(derive_seed(self.args.seed, stream, self.state.global_step,
                                          self.accelerator.process_index))
            return evaluate(*args)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log; the training prompts' evaluation pass names its metrics `seen/...` (logged `eval_seen/...`)."""
        if self._pass is not None and not self.model.training:
            found = self._metrics["eval"]
            renamed = {f"{self._pass}/{key}": values for key, values in found.items()}
            found.clear()
            found.update(renamed)
        super().log(logs, start_time)


def _token_mask(tokenizer: Any) -> Any:
    """The llguidance token table of the trained model's tokenizer.

    Raises:
        ConfigError: when llguidance cannot read it (the rollouts could not be masked).
    """
    from harness.backends.grammar import TokenMask

    try:
        return TokenMask(getattr(tokenizer, "tokenizer", tokenizer))
    except ValueError as exc:
        raise ConfigError(f"the generator's rollouts cannot decode under the rubric grammar: llguidance cannot read "
                          f"this tokenizer ({exc}); set structured: false to train on free text") from None
