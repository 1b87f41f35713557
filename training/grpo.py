"""`harness train generator|policy`: the job's config, its data and TRL's `GRPOConfig` built from it.

One config (YAML, unknown keys are errors; `TrainConfig`) names the model to train, the frozen models of its
reward (the verifier; for the policy also the generator), the data (Nectar, filtered by Appendix B's rules,
`training.data`) and TRL's GRPO settings. `training.job` checks a job before any model call (the config, TRL's
own checks included, the data file, the models' identities, the output dir's binding) and then runs it:

1. reads and filters the Nectar rows (the per-rule drop counts are logged and kept in the manifest); with
   `data.heldout: N` the last N kept rows are a held-out split, never trained on;
2. generator: the main process samples each row's response set from the current policy with the harness's own
   generation (`harness.generation`: any backend, cached, resumable; `sets.jsonl` in the output dir is bound to
   the policy's identity), the other ranks read it, and each row becomes the DR-Generator's prompt over its set
   (`judges.dynamic.dynamic_generator_prompt`, responses in a seeded order);
3. trains with `training.trainer.DRGRPOTrainer` (TRL's `GRPOTrainer`, the generator's rollouts under the rubric
   grammar: `training.rollouts`) and the reward of `training.rewards`, evaluating the held-out split at step 0
   and every `eval_every` steps (`training.fit`), for `grpo.epochs` passes over the rows (`plan_steps`: the
   steps follow from the rows, the group size, the accumulation and the processes at launch) or `grpo.max_steps`;
4. saves the model and tokenizer into `output_dir` (so `hf:DIR` and `vllm:DIR` load it), `train_log.jsonl`
   (TRL's per-step metrics with the reward's own), TensorBoard events (`runs/`), `training_curves.png` and
   `dr_manifest.json` (the settings it is bound to, kind, parents with their identities, the data fingerprint,
   the filter counts, the resolved config, versions, status).

**GRPO's advantage** is the paper's by default (`grpo.scale_rewards: null`): for the policy the rubric score
centred and divided by its group's standard deviation (TRL's `scale_rewards="group"`, GRPO as Shao et al. define it
and the paper cites it); for the generator its reward already is the advantage (`z(disc) + lambda * z(anchor)`,
each component standardised in its group), so TRL scales it by nothing more (`"none"`). Setting `scale_rewards`
(`group`, `batch`, `none`) overrides this for either trainer: a deviation from the paper (`"none"` is Dr. GRPO's
choice; `"batch"` the PPO-Lite one).

**Verification** is `per_item` by default, as the evaluation tables verify: binary verdicts, the paper's `R_disc`.
`verify_mode: logprob` reads P(yes) instead (K requests per rubric instead of M x K); `R_disc` then takes each
P(yes) thresholded at 0.5 (`training.rewards`).

**Thinking** never reaches a frozen model: the response sets (`read_sets`) and the policy's completions
(`training.rewards.PolicyReward`) lose their `<think>` blocks (`judges.thinking.strip_thinking`, the policy tables'
rule) before the generator, the verifier or a reward model reads them. A chat template's thinking is switched
off in TRL's rollouts by `grpo.extra: {chat_template_kwargs: {enable_thinking: false}}` (the paper-scale Qwen3
configs set it: their budgets are tight for a reasoning trace).

Defaults are TRL's unless a field says otherwise; the paper gives no hyper-parameters we could check offline, so the
paper-scale configs under `training/configs/` are ours and say so.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.config import DevicesConfig
from harness.errors import ConfigError
from judges.verify import VerifyMode
from training.data import FilterReport, GeneratorRules, NectarRow, PolicyRules, filter_rows
from training.rewards import Objective

log = logging.getLogger("harness.train")
LossType = Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
"""TRL's `GRPOConfig.loss_type` values."""


class GRPOSettings(BaseModel):
    """TRL `GRPOConfig` fields the trainers set (others through `extra`, checked against `GRPOConfig`)."""

    model_config = ConfigDict(extra="forbid")
    RUNTIME: ClassVar[frozenset[str]] = frozenset({
        "logging_steps", "save_steps", "gradient_checkpointing", "vllm_server_base_url", "vllm_gpu_memory_utilization",
        "report_to"})
    """Fields that change how a job runs, not what it trains: a checkpoint is not bound to them."""

    num_generations: int = Field(8, ge=2)
    """Completions per prompt (a group)."""
    max_completion_length: int = Field(1024, ge=1)
    per_device_train_batch_size: int = Field(8, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    learning_rate: float = Field(1e-6, ge=0)
    epochs: float | None = Field(None, gt=0)
    """Passes over the training rows; the steps follow at launch (`plan_steps`). Unset with `max_steps` unset: 1."""
    max_steps: int | None = Field(None, ge=1)
    """Optimizer steps, instead of `epochs` (the launch logs how much of the data they cover)."""
    scale_rewards: Literal["group", "batch", "none"] | None = None
    """None: the paper's advantage (the policy's reward scaled by its group's std, the generator's by nothing
    more; see the module docstring). Any value is TRL's `scale_rewards` for either trainer: a deviation."""
    beta: float = Field(0.0, ge=0)
    """KL weight (TRL's default 0: no reference model)."""
    loss_type: LossType = "dapo"
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    bf16: bool | None = None
    """None: on when CUDA is present (TRL's default is on; CPUs train in float32)."""
    gradient_checkpointing: bool = False
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """`colocate`: vLLM in the training process (loads the model by path); `server`: `trl vllm-serve` elsewhere."""
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    logging_steps: int = Field(1, ge=1)
    save_steps: int | None = Field(None, ge=1)
    """Intermediate checkpoints every N steps (None: only the final one); an interrupted job resumes from the
    latest one (TRL's `resume_from_checkpoint`: optimizer, scheduler, random state and data order)."""
    report_to: list[str] = Field(default_factory=lambda: ["tensorboard"])
    """TRL's `report_to` (TensorBoard events under `OUTPUT/runs/`; `[]`: none)."""
    seed: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_length(self) -> GRPOSettings:
        if self.epochs is not None and self.max_steps is not None:
            raise ValueError("set epochs or max_steps, not both")
        return self


@dataclass(frozen=True, slots=True)
class Steps:
    """How long a job trains, and how much of its data that covers."""

    rows: int
    """Training rows (prompts)."""
    processes: int
    prompts_per_step: float
    """Prompts one optimizer step consumes over all processes: per-device batch x processes x accumulation /
    completions per prompt (divided by TRL's `num_iterations` reuses of a generation)."""
    max_steps: int
    epochs: float
    """Passes over the rows these steps make."""

    def line(self, settings: GRPOSettings) -> str:
        """The arithmetic in words, for the log and `--dry-run`."""
        return (f"{self.max_steps} steps x {self.prompts_per_step:g} prompts per step "
                f"({settings.per_device_train_batch_size} completions per process x {self.processes} processes x "
                f"{settings.gradient_accumulation_steps} accumulation / {settings.num_generations} per prompt) = "
                f"{self.epochs:.3g} epochs of {self.rows} rows")


def plan_steps(settings: GRPOSettings, *, rows: int, processes: int) -> Steps:
    """The steps of `settings.epochs` passes over `rows` with `processes` training processes (TRL's sampler: each
    optimizer step takes `per_device_train_batch_size * processes * gradient_accumulation_steps` completions,
    `num_generations` per prompt, and each generation serves `num_iterations` steps), or `settings.max_steps` and
    the passes they make.

    Raises:
        ConfigError: for no rows.
    """
    if rows < 1:
        raise ConfigError("no training rows")
    reuse = int(settings.extra.get("num_iterations", 1))
    per_step = (settings.per_device_train_batch_size * processes * settings.gradient_accumulation_steps
                / settings.num_generations / reuse)
    if settings.max_steps is not None:
        steps = settings.max_steps
    else:
        steps = max(1, math.ceil((settings.epochs or 1.0) * rows / per_step - 1e-9))
    return Steps(rows, processes, per_step, steps, steps * per_step / rows)


def with_steps(settings: GRPOSettings, steps: Steps) -> GRPOSettings:
    """`settings` training for `steps.max_steps` (what TRL runs)."""
    return settings.model_copy(update={"max_steps": steps.max_steps, "epochs": None})


class SetSampling(BaseModel):
    """How the generator's response sets are sampled from the current policy."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    """The current policy's model spec (P0: the base policy)."""
    set_size: int = Field(4, ge=2)
    temperature: float = Field(1.0, ge=0)
    max_tokens: int = Field(512, ge=1)
    seed: int | None = None
    """The sampling's run seed (each prompt's derives from it); None: `grpo.seed`. Two jobs that rate the same
    policy's sets with different seeds rate fresh samples (`coevolve`'s stages do)."""


class NectarData(BaseModel):
    """Where the Nectar rows come from and how they are filtered: a job's `data` but its limit (`DataConfig` adds
    one, `training.coevolve.CoevolveData` one per kind of stage)."""

    model_config = ConfigDict(extra="forbid")

    data_dir: Path | None = None
    """A data dir holding Nectar where the `nectar_lmsys` benchmark reads it (`DIR/nectar/data/rlaif.parquet`,
    `rlaif.parquet` or `rlaif.jsonl`); None reads the Hub split."""
    generator_rules: GeneratorRules = Field(default_factory=GeneratorRules)
    policy_rules: PolicyRules = Field(default_factory=PolicyRules)
    heldout: int = Field(0, ge=0)
    """The last N rows that pass the rules (after the first `limit`) form the held-out split: never trained on,
    evaluated with `eval_every`."""
    eval_train: int = Field(0, ge=0)
    """The first N training rows are also evaluated at every held-out evaluation, the same way (split `seen`: fixed
    rubrics, per-prompt scores): does the policy climb its own objective on prompts it trains on?"""
    sets: SetSampling | None = None
    """Generator training: the policy whose response sets the rubrics are for."""


class DataConfig(NectarData):
    """A job's `data`: where the Nectar rows come from, how they are filtered, and how many are kept."""

    limit: int | None = Field(None, ge=1)
    """Keep the first N rows that pass the rules."""


class TrainConfig(BaseModel):
    """`harness train generator|policy --config FILE` (written, resolved, into the checkpoint's manifest)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    """What to train: an alias (`smollm2-135m`), `hf:DIR`, a checkpoint dir or a Hub id."""
    output_dir: Path
    verifier: str | None = None
    """The frozen DR-Verifier's model spec (the generator's reward; the policy's default dynamic rubric)."""
    generator: str | None = None
    """Policy training: the frozen DR-Generator's model spec (the default dynamic rubric)."""
    reward: str | None = None
    """Policy training: any registered evaluator as the reward, by its spec (`harness list evaluators`):
    `scalar-rm:model=SPEC[,with_responses=true]`, `static-rubric:generator=SPEC,verifier=SPEC`,
    `dynamic-rubric:...`. None: the dynamic rubric of `generator`, `verifier`, `verify_mode`, `gen_max_tokens`."""
    verify_mode: VerifyMode = "per_item"
    """`per_item`: the paper's binary verdicts; `logprob`: P(yes), thresholded at 0.5 for R_disc."""
    structured: bool = True
    lam: float = Field(1.0, ge=0)
    """Generator: the anchor advantage's weight (the paper's lambda)."""
    objective: Objective = "both"
    """Generator: Table 3's ablations (`disc`: without the anchor, `anchor`: without discriminability)."""
    gen_max_tokens: int = Field(512, ge=16)
    """Policy: the frozen generator's rubric budget."""
    eval_every: int | None = Field(None, ge=1)
    """Evaluate the held-out split (`data.heldout`) at step 0, every N steps and at the end (`training.fit`)."""
    shuffle_rewards: bool = False
    """The shuffled control (`--control shuffled`, `training.learning`): each training batch's rewards permuted
    before the advantages (`training.rewards.ShuffledReward`)."""
    heldout_rubrics: Path | None = None
    """Policy: fixed held-out rubrics to start from (`training.heldout`), copied into the output dir when it has
    none; a learning comparison points its shuffled runs at the trained run's. None: the run makes its own."""
    data: DataConfig = Field(default_factory=DataConfig)
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    backend: dict[str, Any] = Field(default_factory=dict)
    """BackendOptions of the frozen models (base_url, concurrency, batch_size, ...)."""
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Model spec -> where it is served (`harness.endpoints`: base_url or replicas, served name, key variable,
    concurrency, identity): each frozen model on its own server."""
    devices: DevicesConfig | None = None
    """The GPUs each training process gets one of (`harness.plan`): the job is checked to fit one before anything
    loads; None: what nvidia-smi lists (none on a CPU machine: not checked)."""


    @model_validator(mode="after")
    def _reward_named_once(self) -> TrainConfig:
        if self.reward is not None:
            given = sorted(k for k in {"generator", "verifier", "verify_mode", "gen_max_tokens"} & self.model_fields_set
                           if getattr(self, k) is not None)
            if given:
                raise ValueError(f"reward names the evaluator; {', '.join(given)} would be ignored: drop them or "
                                 f"put them in the reward's spec")
        return self


def load_train_config(path: Path, *, output_dir: Path | None = None, data_dir: Path | None = None,
                      max_steps: int | None = None, eval_every: int | None = None) -> TrainConfig:
    """The YAML file's settings with the command line's non-None values on top (`output_dir`, `data.data_dir`,
    `grpo.max_steps`, `eval_every`).

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    from harness.config import load_config_file

    config = load_config_file(path, TrainConfig, what="training config",
                              overrides={"output_dir": output_dir, "eval_every": eval_every})
    return config.model_copy(update={"data": with_data_dir(config.data, data_dir),
                                     "grpo": with_max_steps(config.grpo, max_steps)})


_Data = TypeVar("_Data", bound=NectarData)


def with_data_dir(data: _Data, data_dir: Path | None) -> _Data:
    """`data` with `data_dir` in place of its own (unchanged for None)."""
    return data if data_dir is None else data.model_copy(update={"data_dir": data_dir})


def with_max_steps(grpo: GRPOSettings, max_steps: int | None) -> GRPOSettings:
    """`grpo` with `max_steps` in place of its own and of `epochs` (unchanged for None)."""
    return grpo if max_steps is None else grpo.model_copy(update={"max_steps": max_steps, "epochs": None})


def backend_spec(spec: str) -> str:
    """A model to train (or a frozen one) as a backend spec: a checkpoint dir or Hub id named bare
    (`Qwen/Qwen3-8B`, `ckpt/g1`) is `hf:` on it; aliases and `KIND:NAME` specs stay."""
    from harness.backends import names

    return spec if ":" in spec or spec in names("model") else f"hf:{spec}"


def model_path(spec: str) -> str:
    """A local checkpoint dir (or Hub id) for `from_pretrained`: aliases resolve (converting once), `hf:`/`vllm:`
    prefixes drop."""
    from harness.backends import parse_spec

    if spec.startswith(("openai:",)):
        raise ConfigError(f"cannot train {spec!r}: an API model has no weights here")
    kind, name = parse_spec(backend_spec(spec))
    if kind not in ("hf", "vllm"):
        raise ConfigError(f"cannot train {spec!r}: not a local model")
    return name


def read_rows(config: DataConfig, nectar: Path | None, *, policy: bool
              ) -> tuple[list[NectarRow], list[NectarRow], FilterReport]:
    """The Nectar rows of the file `nectar` (None: the Hub split) that pass the generator's (or the policy's)
    rules: the training rows, the held-out rows (the last `config.heldout` kept) and the report.

    Raises:
        ConfigError: for a malformed file or row (naming it), when no row passes the rules, or when the rules
            leave too few rows for the held-out split.
    """
    from benchmarks.nectar import HUB_ID, HUB_SPLIT
    from training.data import read_nectar, row_from_nectar

    if nectar is not None:
        rows = read_nectar(nectar)
    else:
        from benchmarks.base import load_hub

        hub = load_hub(HUB_ID, split=HUB_SPLIT)
        rows = (row_from_nectar(r, i, f"{HUB_ID}[{HUB_SPLIT}] row {i}") for i, r in enumerate(hub))
    rules = (config.policy_rules if policy else config.generator_rules).rules()
    report = FilterReport()
    wanted = None if config.limit is None else config.limit + config.heldout
    kept = []
    for row in filter_rows(rows, rules, report):
        kept.append(row)
        if wanted is not None and len(kept) >= wanted:
            break
    if len(kept) <= config.heldout:
        found = "no Nectar row passed the rules" if not kept else (
            f"{len(kept)} Nectar rows passed the rules, too few for data.heldout {config.heldout} and training")
        raise ConfigError(found + ":\n" + "\n".join(report.lines()))
    split = len(kept) - config.heldout
    return kept[:split], kept[split:], report


def sample_sets(rows: list[NectarRow], sampling: SetSampling, out: Path, pool: Any, *, seed: int) -> dict[str, str]:
    """Sample each row's response set from the current policy into `out` (`harness generate`'s machinery:
    resumable and cached, bound to the policy's identity); returns the policy's identity. The main process's
    job: `read_sets` reads the file on every rank."""
    from harness.backends.base import user_chat
    from harness.generation import GenerateConfig, PromptRecord, run_generate

    backend = pool.get(sampling.policy)
    prompts = [PromptRecord(r.id, user_chat(r.prompt)) for r in rows]
    config = GenerateConfig(model=sampling.policy, source="nectar", n=sampling.set_size,
                            temperature=sampling.temperature, max_tokens=sampling.max_tokens, seed=seed)

    async def go():
        try:
            return await run_generate(backend, prompts, config, out, parallel=64)
        finally:
            await pool.close()

    asyncio.run(go())
    return backend.identity()


def read_sets(rows: list[NectarRow], sampling: SetSampling, out: Path) -> tuple[list[NectarRow], list[list[str]]]:
    """The rows whose whole set `sample_sets` wrote into `out`, and their sets, each response's thinking stripped
    (`judges.thinking.strip_thinking`: the generator and the verifier read the answers only; read only: every rank
    may read it); rows with a failed sample are left out, and responses with nothing left once stripped (a budget
    spent thinking) are counted in the log."""
    from harness.records import GenerationRecord
    from harness.runstore import RecordLog
    from judges.thinking import strip_thinking

    found: dict[str, dict[int, str]] = {}
    for record in RecordLog(out, GenerationRecord).records():
        if record.text is not None:
            found.setdefault(record.id, {})[record.sample] = record.text
    kept, sets = [], []
    for row in rows:
        samples = found.get(row.id, {})
        if len(samples) == sampling.set_size:
            kept.append(row)
            sets.append([strip_thinking(samples[i]) for i in range(sampling.set_size)])
    if len(kept) < len(rows):
        log.info("%d of %d rows left out: some of their samples failed (see %s)", len(rows) - len(kept), len(rows),
                 out)
    empty = sum(not text for found_set in sets for text in found_set)
    if empty:
        log.info("%d of %d sampled responses are empty once their thinking is stripped (the budget ran out while "
                 "thinking)", empty, sum(map(len, sets)))
    return kept, sets


def generator_dataset(rows: list[NectarRow], sets: list[list[str]], *, seed: int, split: str = "train"
                      ) -> list[dict[str, Any]]:
    """One GRPO prompt per row: the DR-Generator's request over the row's set, in a seeded order."""
    from harness.seeds import derive_seed
    from judges.dynamic import dynamic_generator_prompt, presentation_order

    out = []
    for row, responses in zip(rows, sets):
        order = presentation_order(len(responses), derive_seed(seed, row.id))
        text = dynamic_generator_prompt(row.prompt, responses, order)
        out.append({"prompt": [{"role": "user", "content": text}], "row": row.id, "question": row.prompt,
                    "responses": list(responses), "anchor": list(row.responses), "split": split})
    return out


def policy_dataset(rows: list[NectarRow], *, split: str = "train") -> list[dict[str, Any]]:
    """One GRPO prompt per row: the user's prompt."""
    return [{"prompt": [{"role": "user", "content": r.prompt}], "row": r.id, "question": r.prompt, "split": split}
            for r in rows]


def grpo_config(settings: GRPOSettings, output_dir: Path, *, rollouts: Any = None, eval_every: int | None = None,
                scale_rewards: str = "group") -> Any:
    """TRL's `GRPOConfig` from our settings (CPU: float32, `use_cpu`).

    Args:
        settings: The job's GRPO settings (`max_steps` unset: TRL's `num_train_epochs` = `epochs`; `training.fit`
            resolves the steps first, `plan_steps`).
        output_dir: Where TRL writes.
        scale_rewards: The trainer's paper default (the reward's `scale_rewards`), unless `settings` sets one.
        rollouts: The rollouts' grammar (`training.rollouts.rollout_constraint`), or None. With vLLM generation it
            becomes TRL's `generation_kwargs["structured_outputs"]`, and the vLLM importance-sampling correction is
            off unless `extra` sets it (`training.rollouts` says why).
        eval_every: Evaluate every N steps and at step 0 (the eval batches hold whole groups, as the train ones).

    Raises:
        ConfigError: for an `extra` key that is no `GRPOConfig` field, values TRL refuses (e.g. a batch that
            does not divide into groups), or a process's batch that would split a group between processes.
    """
    import dataclasses

    import torch
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(settings.extra) - fields)
    if unknown:
        raise ConfigError(f"grpo.extra: {', '.join(unknown)} are not GRPOConfig fields")
    values = settings.model_dump(exclude={"extra", "bf16", "save_steps", "vllm_server_base_url", "epochs",
                                          "scale_rewards", "max_steps"})
    values.update(
        output_dir=str(output_dir),
        max_steps=settings.max_steps if settings.max_steps is not None else -1,
        num_train_epochs=settings.epochs or 1.0,
        bf16=cuda if settings.bf16 is None else settings.bf16,
        use_cpu=not cuda,
        scale_rewards=settings.scale_rewards or scale_rewards,
        report_to=list(settings.report_to) or "none",
        save_strategy="steps" if settings.save_steps else "no",
        save_steps=settings.save_steps or 500,
        disable_tqdm=True,
    )
    if settings.vllm_server_base_url:
        values["vllm_server_base_url"] = settings.vllm_server_base_url
    if "activation_checkpointing" in fields:  # transformers 5's name; the old one warns on every config built
        values["activation_checkpointing"] = values.pop("gradient_checkpointing")
    if eval_every is not None:
        values.update(eval_strategy="steps", eval_steps=eval_every, eval_on_start=True,
                      per_device_eval_batch_size=settings.per_device_train_batch_size)
    extra = dict(settings.extra)
    if rollouts is not None and settings.use_vllm:
        from training.rollouts import vllm_generation_kwargs

        extra["generation_kwargs"] = {**vllm_generation_kwargs(rollouts), **(extra.get("generation_kwargs") or {})}
        extra.setdefault("vllm_importance_sampling_correction", False)
    values.update(extra)
    try:
        args = GRPOConfig(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"grpo: {exc}") from None
    _check_local_groups(args)
    return args


def _check_local_groups(args: Any) -> None:
    """Each process rewards its own share of a batch, group by group: every process's share must hold whole
    groups (TRL checks only the batch over all processes).

    Raises:
        ConfigError: naming the sizes.
    """
    local = args.per_device_train_batch_size * args.steps_per_generation
    if local % args.num_generations:
        raise ConfigError(f"grpo: a process's generation batch (per_device_train_batch_size x steps_per_generation "
                          f"= {local}) must hold whole groups of num_generations ({args.num_generations}): each "
                          f"process rewards its own groups")
    groups = args.num_generations_eval or args.num_generations
    if args.eval_strategy != "no" and args.per_device_eval_batch_size % groups:
        raise ConfigError(f"grpo: per_device_eval_batch_size ({args.per_device_eval_batch_size}) must hold whole "
                          f"groups of {groups}")
