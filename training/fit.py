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
  strict: a tie is wrong), for the policy the mean rubric score under the frozen generator (`eval_dr/reward_mean`).
- **The processes agree.** After the last step every process hashes its weights (`weights_digest`) and the main
  process records them by rank in the manifest (`processes.weights`): DDP keeps them equal.
- **Length.** `grpo.epochs` passes over the rows become TRL's `max_steps` here, from the rows, the group size,
  the accumulation and the number of processes of this launch (`training.grpo.plan_steps`); `Fitted.steps` says
  how much of the data the run covers (with `grpo.max_steps` too).
- **The reward's advantage.** TRL scales the reward as the reward says the paper does (its `scale_rewards`: the
  generator's by nothing more, the policy's by its group's std) unless `grpo.scale_rewards` overrides it.
- **Resuming.** With `save_steps`, TRL writes `checkpoint-N` dirs (weights, optimizer, scheduler, each rank's random
  state, the trainer state); an unfinished job resumes from the latest complete one (`resume_from_checkpoint`:
  TRL skips the batches already trained, so the data order is the same), keeping the log lines up to it.
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


def make_reward(kind: str, config: TrainConfig, pool: Any) -> Any:
    """The TRL reward function of a generator or policy job, its frozen models from `pool`: the generator's
    `GeneratorReward`; the policy's `PolicyReward` over the evaluator `policy_reward_spec` names (RaR's static
    rubric seeded per row: one rubric per prompt, reused every epoch).

    Raises:
        ConfigError: for an evaluator spec the registry refuses.
    """
    from judges import load_evaluator
    from judges.base import parse_evaluator_spec
    from training.rewards import GeneratorReward, PolicyReward

    g = config.grpo.num_generations
    if kind == "generator":
        return GeneratorReward(pool.get(config.verifier), group_size=g, lam=config.lam, objective=config.objective,
                               mode=config.verify_mode, structured=config.structured)
    spec = policy_reward_spec(config)
    evaluator = load_evaluator(spec, pool)
    static = parse_evaluator_spec(spec)[0] == "static-rubric"
    return PolicyReward(evaluator, group_size=g, seed=config.grpo.seed, per_row=static)


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


def _keep_log_until(log: Path, step: int | None) -> None:
    """Drop the log lines after `step` (all of them for None): what a resumed run writes again."""
    if step is None or not log.is_file():
        log.unlink(missing_ok=True)
        return
    kept = [line for line in log.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] <= step]
    log.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


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
        resume: bool = False) -> Fitted:
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

    Raises:
        ConfigError: when the model cannot be loaded.
    """
    from datasets import Dataset

    from training.ranks import current
    from training.trainer import DRGRPOTrainer

    steps = plan_steps(settings, rows=len(dataset), processes=current().world)
    settings = with_steps(settings, steps)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / LOG
    checkpoint = latest_checkpoint(out) if resume else None
    if current().main:
        _keep_log_until(log, _step_of(checkpoint))
    evaluate = bool(heldout) and eval_every is not None
    args = grpo_config(settings, out, rollouts=rollouts, eval_every=eval_every if evaluate else None,
                       scale_rewards=getattr(reward, "scale_rewards", "group"))
    if checkpoint is not None:
        args.eval_on_start = False  # the resumed step was evaluated before the interruption
    # TRL warns with the whole row for every completion no reward could score; the reward counts those itself
    # (`dr/unscored_*` in the log).
    logging.getLogger("trl.trainer.grpo_trainer").setLevel(logging.ERROR)
    callbacks = _callbacks(log, evaluate=evaluate)
    try:
        trainer = DRGRPOTrainer(model=model_path(model), reward_funcs=[reward], args=args,
                                train_dataset=Dataset.from_list(dataset),
                                eval_dataset=Dataset.from_list(heldout) if evaluate else None,
                                callbacks=callbacks, rollout_constraint=rollouts)
    except OSError as exc:
        raise ConfigError(f"cannot load the model to train {model!r}: {exc}") from None
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    trainer.save_model(str(out))
    if trainer.args.should_save:
        trainer.processing_class.save_pretrained(str(out))
    return Fitted(log, _weights_by_rank(trainer), steps)


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
