"""One GRPO run: the reward of a job, TRL's trainer (ours: `training.trainer.DRGRPOTrainer`), its logs, its
held-out evaluation and resuming.

- **Logs.** Every TRL log line (its metrics next to the reward's `dr/*` components) goes to `train_log.jsonl`,
  written by the main process only, and to TRL's `report_to` (TensorBoard by default: events under
  `OUTPUT/runs/`, our components as named scalars `train/dr/disc_mean`, ...; `eval/dr/...` for the held-out
  split).
- **Held-out evaluation** (`eval_every`): TRL's own evaluation loop over the held-out rows (`split: heldout`) at
  step 0, every `eval_every` steps and after the last step, each rank its share, generating as the training does
  (the generator under the rubric grammar) and scoring with the same reward and frozen models. The reward logs
  what the held-out numbers are (`training.rewards`): for the generator the mean discriminability reward
  (`eval_dr/disc_mean`) and how often its rubric orders the Nectar anchors as annotated (`eval_dr/anchor_pair_acc`,
  strict: a tie is wrong), for the policy the mean rubric score under the frozen generator (`eval_dr/reward_mean`),
  against one fixed rubric per held-out prompt made at the first evaluation. Each evaluation also appends one line
  per held-out prompt to `eval_scores.jsonl` (`training.heldout`), for paired statistics over prompts.
  `evaluate_at` evaluates weights as they are on the streams of given steps (the base weights of a learning
  comparison, `training.learning`).
- **The processes agree.** After the last step every process hashes its weights (`weights_digest`) and the main
  process records them by rank in the manifest (`processes.weights`): DDP keeps them equal.
- **Length.** `grpo.epochs` passes over the rows become TRL's `max_steps` here, from the rows, the group size,
  the accumulation and the number of processes of this launch (`training.grpo.plan_steps`); `Fitted.steps` says
  how much of the data the run covers (with `grpo.max_steps` too).
- **The reward's advantage.** TRL scales the reward as the reward says the paper does (its `scale_rewards`: the
  generator's by nothing more, the policy's by its group's std) unless `grpo.scale_rewards` overrides it.
- **Resuming.** With `save_steps`, TRL writes `checkpoint-N` dirs (weights, optimizer, scheduler, each rank's random
  state, the trainer state); an unfinished job resumes from the latest complete one (`resume_from_checkpoint`:
  TRL skips the batches already trained, so the data order is the same), keeping the log lines (and per-prompt
  held-out scores) up to it, and the fixed held-out rubrics.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from training.grpo import GRPOSettings, Steps, TrainConfig, grpo_config, model_path, plan_steps, with_steps

LOG = "train_log.jsonl"


@dataclass(frozen=True, slots=True)
class Fitted:
    """What one GRPO run left."""

    log: Path
    """`train_log.jsonl` (written by the main process)."""
    weights: tuple[str, ...] | None
    """Each process's digest of its trained weights after the last step, by rank (DDP keeps them equal); None
    where the processes hold shards (DeepSpeed, FSDP)."""
    steps: Steps
    """How long it trained and how much of the data that covered."""


def make_reward(kind: str, config: TrainConfig, pool: Any, *, heldout_dir: Path | None = None) -> Any:
    """The TRL reward function of a generator or policy job, its frozen models from `pool`: the generator's
    `GeneratorReward`; the policy's `PolicyReward` over the evaluator `policy_reward_spec` names (RaR's static
    rubric seeded per row: one rubric per prompt, reused every epoch). With `config.shuffle_rewards` (the
    shuffled control) it is wrapped in `ShuffledReward`. `heldout_dir`: where the held-out evaluation keeps its
    per-prompt record (`training.heldout`: fixed rubrics, per-prompt scores).

    Raises:
        ConfigError: for an evaluator spec the registry refuses.
    """
    from judges import load_evaluator
    from judges.base import parse_evaluator_spec
    from training.rewards import GeneratorReward, PolicyReward, ShuffledReward

    g = config.grpo.num_generations
    if kind == "generator":
        reward: Any = GeneratorReward(pool.get(config.verifier), group_size=g, lam=config.lam,
                                      objective=config.objective, mode=config.verify_mode,
                                      structured=config.structured, heldout_dir=heldout_dir)
    else:
        spec = policy_reward_spec(config)
        evaluator = load_evaluator(spec, pool)
        static = parse_evaluator_spec(spec)[0] == "static-rubric"
        reward = PolicyReward(evaluator, group_size=g, seed=config.grpo.seed, per_row=static,
                              eval_group_size=config.grpo.extra.get("num_generations_eval"), heldout_dir=heldout_dir)
    return ShuffledReward(reward, seed=config.grpo.seed) if config.shuffle_rewards else reward


def policy_reward_spec(config: TrainConfig) -> str:
    """The evaluator spec of a policy job's reward: `reward`, or the dynamic rubric of `generator` and `verifier`.

    Raises:
        ConfigError: when neither names one.
    """
    if config.reward is not None:
        return config.reward
    if config.generator is None or config.verifier is None:
        raise ConfigError("policy training needs a reward: `reward: EVALUATOR-SPEC`, or the dynamic rubric's "
                          "`generator` and `verifier`")
    structured = "true" if config.structured else "false"
    return (f"dynamic-rubric:generator={config.generator},verifier={config.verifier},mode={config.verify_mode},"
            f"gen_max_tokens={config.gen_max_tokens},structured={structured}")


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete `checkpoint-N` dir in `out` (TRL writes `trainer_state.json` last), or None."""
    found = []
    for path in Path(out).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and (path / "trainer_state.json").is_file():
            found.append((int(step), path))
    return max(found)[1] if found else None


def _callbacks(log: Path, *, evaluate: bool) -> list[Any]:
    """TRL callbacks (transformers is imported here, not at module import): every log line to `log` from the main
    process only (TRL's metrics with the reward's `dr/*`), and, when the run evaluates, the held-out evaluation
    after the last step too (when it is not a multiple of `eval_every`), so every evaluated run ends measured."""
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and state.is_world_process_zero:
                with log.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    class FinalEval(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if args.eval_strategy != "no" and state.global_step >= state.max_steps:
                control.should_evaluate = True
            return control

    return [StepLog()] + ([FinalEval()] if evaluate else [])


def fit(model: str, settings: GRPOSettings, dataset: list[dict[str, Any]], reward: Any, out: Path, *,
        heldout: list[dict[str, Any]] | None = None, eval_every: int | None = None, rollouts: Any = None,
        resume: bool = False, seen: list[dict[str, Any]] | None = None) -> Fitted:
    """GRPO on `dataset` with `reward` (a TRL reward function); the model and tokenizer saved into `out`, TRL's log
    lines in `out/train_log.jsonl` (main process).

    Args:
        model: What to train (a spec `model_path` resolves).
        settings: TRL's settings.
        dataset: The training rows (`training.grpo.generator_dataset` / `policy_dataset`).
        reward: The reward function.
        out: The output dir.
        heldout: The held-out rows, evaluated at step 0 and every `eval_every` steps (both or neither).
        eval_every: See `heldout`.
        rollouts: The rollouts' grammar (`training.rollouts`), or None for free text.
        resume: Resume from the latest complete `checkpoint-N` in `out`, if any (else train from the start).
        seen: Training rows (split `seen`) evaluated after `heldout` at every evaluation, or None.

    Raises:
        ConfigError: when the model cannot be loaded.
    """
    from training.heldout import SCORES, keep_until
    from training.ranks import current

    steps = plan_steps(settings, rows=len(dataset), processes=current().world)
    settings = with_steps(settings, steps)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / LOG
    checkpoint = latest_checkpoint(out) if resume else None
    if current().main:
        for written in (log, out / SCORES):  # what a resumed run writes again
            keep_until(written, _step_of(checkpoint))
    evaluate = bool(heldout) and eval_every is not None
    trainer = _trainer(model, settings, dataset, reward, out, heldout=heldout if evaluate else None,
                       eval_every=eval_every if evaluate else None, rollouts=rollouts,
                       seen=seen if evaluate else None)
    if checkpoint is not None:
        trainer.args.eval_on_start = False  # the resumed step was evaluated before the interruption
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    trainer.save_model(str(out))
    if trainer.args.should_save:
        trainer.processing_class.save_pretrained(str(out))
    return Fitted(log, _weights_by_rank(trainer), steps)


def _trainer(model: str, settings: GRPOSettings, dataset: list[dict[str, Any]], reward: Any, out: Path, *,
             heldout: list[dict[str, Any]] | None, eval_every: int | None, rollouts: Any,
             seen: list[dict[str, Any]] | None = None) -> Any:
    """`DRGRPOTrainer` of one run (the log written by the main process), evaluating `heldout` (and then `seen`)
    when given.

    Raises:
        ConfigError: when the model cannot be loaded.
    """
    from datasets import Dataset

    from training.trainer import DRGRPOTrainer

    args = grpo_config(settings, out, rollouts=rollouts, eval_every=eval_every,
                       scale_rewards=getattr(reward, "scale_rewards", "group"))
    # TRL warns with the whole row for every completion no reward could score; the reward counts those itself
    # (`dr/unscored_*` in the log).
    logging.getLogger("trl.trainer.grpo_trainer").setLevel(logging.ERROR)
    try:
        return DRGRPOTrainer(model=model_path(model), reward_funcs=[reward], args=args,
                             train_dataset=Dataset.from_list(dataset),
                             eval_dataset=Dataset.from_list(heldout) if heldout else None,
                             callbacks=_callbacks(out / LOG, evaluate=bool(heldout)), rollout_constraint=rollouts,
                             seen_dataset=Dataset.from_list(seen) if heldout and seen else None)
    except OSError as exc:
        raise ConfigError(f"cannot load the model to train {model!r}: {exc}") from None


def evaluate_at(model: str, settings: GRPOSettings, dataset: list[dict[str, Any]], reward: Any, out: Path, *,
                heldout: list[dict[str, Any]], steps: list[int], eval_every: int, rollouts: Any = None,
                seen: list[dict[str, Any]] | None = None) -> Path:
    """The held-out evaluation of `model`'s weights as they are (no step taken) on the evaluation streams of the
    given steps: at each step TRL's evaluation runs exactly as a run of the same settings evaluates at that step
    (the same rows, order and sampling seeds: `training.trainer`), so the base weights' number sits beside the
    trained run's on the same samples' stream. Log lines go to `out/train_log.jsonl` (replaced) and the reward's
    per-prompt record where the reward keeps it. Returns the log's path.

    Raises:
        ConfigError: when the model cannot be loaded.
    """
    from training.ranks import current

    settings = with_steps(settings, plan_steps(settings, rows=len(dataset), processes=current().world))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if current().main:
        (out / LOG).unlink(missing_ok=True)
    trainer = _trainer(model, settings, dataset, reward, out, heldout=heldout, eval_every=eval_every,
                       rollouts=rollouts, seen=seen)
    for step in steps:
        trainer.state.global_step = step
        trainer.evaluate()
    return out / LOG


def weights_digest(model: Any) -> str:
    """A short sha256 over a model's parameters and buffers (names, dtypes, shapes and bytes, in name order)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _weights_by_rank(trainer: Any) -> tuple[str, ...] | None:
    """Every process's `weights_digest`, gathered (a collective: every process calls it)."""
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        return None
    from accelerate.utils import gather_object

    return tuple(gather_object([weights_digest(trainer.accelerator.unwrap_model(trainer.model))]))


def _step_of(checkpoint: Path | None) -> int | None:
    return None if checkpoint is None else int(checkpoint.name.removeprefix("checkpoint-"))
