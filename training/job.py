"""One training job: checked and bound to its output dir before any model call (`prepare`), then run (`run`).

`prepare` checks everything that can be known before a model is called: the kind's required fields, the backend
options, TRL's own checks of the GRPO settings (and that each process's batch holds whole groups), the model to
train, the data file, and the identity of every model the job starts from or is rewarded by. From these it builds
the job's *settings* (`job_settings`) and compares them with what the output dir holds (`training.checkpoint`).
`run` refuses a dir trained with other settings (naming every difference) unless `overwrite` discards it, reads the
data, writes the manifest with status `running`, trains (`training.fit`) and writes the manifest's end and the
figure of its curves (`training.plots`). A rerun of the same settings keeps a finished checkpoint (`overwrite`
trains it again) and resumes an unfinished one from its latest `checkpoint-N` (with `grpo.save_steps`; else from
the start): the generator's response sets (`sets.jsonl`) resume, and the call cache answers the frozen models'
repeated calls.

`evaluate_base` evaluates the job's starting weights, no step taken, on the held-out streams of given steps (a
learning comparison's base arm, `training.learning`).

`dry_run` reads and filters the data and says what the job would train on (each rule's drops, the rows, the
steps and the passes over the data they make) without loading a model: `harness train generator|policy
--dry-run`.

Under `accelerate launch --num_processes N` every process runs the same job (`training.ranks`): all of them check
it, the main process alone writes the manifest, samples the response sets, saves the checkpoint and writes the
logs; the others wait for the sets and read them, and each process rewards its own share of every batch. A frozen
model loaded in-process by `vllm:` would start one engine per process beside TRL's: it is refused; serve it. So is
one beside TRL's colocated vLLM (`grpo.use_vllm` with `vllm_mode: colocate`) in a single process: TRL starts its
engine with `distributed_executor_backend="external_launcher"`, which turns vLLM's multiprocessing off for the
whole process (`vllm/config/parallel.py:1031-1033`), and an engine without it cannot be freed (vLLM issue 21073).

On a GPU machine the job must fit one GPU before anything loads (`harness.plan.check_training`): the trained
model's ZeRO-3 share, TRL's colocated vLLM, frozen models loaded in-process, and the activations of one
micro-batch (`harness.plan.activation_gib`: `per_device_train_batch_size` sequences of the longest prompt plus
`max_completion_length`, with or without gradient checkpointing; TRL does not cut prompts). `prepare` assumes a
Nectar prompt of `NECTAR_PROMPT_TOKENS`; `run` checks again with the longest prompt its rows hold, counted with
the trained model's tokenizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import ConfigError, HarnessError, Interrupted
from training import checkpoint
from training.grpo import GRPOSettings, TrainConfig

log = logging.getLogger("harness.train")
Kind = Literal["generator", "policy"]
NECTAR_PROMPT_TOKENS = 2048
"""The Nectar prompt assumed before the rows are read (`prepare`, `harness plan --train`); `run` checks again with
the longest one its rows hold."""
CHAT_TOKENS = 32
"""The chat template's markup around the one user message of a training prompt."""
SETS = "sets.jsonl"
"""The generator's response sets, in its output dir."""


@dataclass(frozen=True, slots=True)
class Job:
    """A training job that passed every check `prepare` makes."""

    kind: Kind
    config: TrainConfig
    options: Any
    """The frozen models' `BackendOptions`."""
    endpoints: dict[str, Any]
    """Model spec -> where it is served (`harness.endpoints`)."""
    nectar: Path | None
    """The Nectar file (None: the Hub split)."""
    parents: dict[str, dict[str, Any]]
    """Role (`model`, `verifier`, `generator` or `policy`) -> `{spec, identity}`."""
    settings: dict[str, Any]
    """What the checkpoint is bound to (`job_settings`)."""
    binding: checkpoint.Binding
    """How the output dir stands against `settings`."""


def roles(kind: Kind, config: TrainConfig) -> dict[str, str]:
    """Role -> model spec of every model the job starts from or is rewarded by: the model, and the generator's
    verifier and set policy, or the models of the policy's reward (`generator` and `verifier` of a rubric,
    `reward_model` of a scalar RM).

    Raises:
        ConfigError: for a missing role, or a reward spec the registry refuses.
    """
    found = {"model": config.model}
    if kind == "generator":
        if config.reward is not None:
            raise ConfigError("reward: the generator's reward is R_disc and R_anchor; `reward` is for policy jobs")
        if config.verifier is None:
            raise ConfigError("verifier: generator training needs the frozen DR-Verifier's model spec")
        if config.data.sets is None:
            raise ConfigError("data.sets: generator training needs the policy whose response sets it rates")
        return {**found, "verifier": config.verifier, "policy": config.data.sets.policy}
    from training.fit import policy_reward_spec

    return {**found, **reward_models(policy_reward_spec(config))}


def reward_models(spec: str) -> dict[str, str]:
    """Role -> model spec of the models an evaluator spec names (`generator` and `verifier` of a rubric evaluator,
    `reward_model` of a scalar RM), as the evaluator will ask its pool for them.

    Raises:
        ConfigError: for an unknown evaluator kind.
    """
    import sys

    from harness.registry import lookup
    from judges.base import parse_evaluator_spec

    kind, settings = parse_evaluator_spec(spec)
    module = sys.modules[lookup("evaluator", kind).__module__]
    explicit = getattr(module, "explicit_settings", dict)(settings)
    named = {"generator": "generator", "verifier": "verifier", "model": "reward_model"}
    return {role: explicit[key] for key, role in named.items() if explicit.get(key)}


def identify(spec: str, options: Any, endpoints: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A model's identity (weights fingerprint, hub commit, or its servers'), without loading it."""
    from harness.backends import load_backend
    from harness.endpoints import served_backend
    from training.grpo import backend_spec

    built = (served_backend(spec, endpoints[spec], options) if endpoints and spec in endpoints
             else load_backend(backend_spec(spec), options))
    check = getattr(built, "preflight", None)
    if check is not None:  # a key variable named but unset, vLLM missing: before any call
        check()
    return built.identity()


def job_settings(kind: Kind, config: TrainConfig, *, parents: Mapping[str, Mapping[str, Any]],
                 data: str) -> dict[str, Any]:
    """Everything that changes what a job trains: its kind, its config (less the output dir, the data dir's path
    and the runtime knobs: the backend's options, whose output-changing choices are in the models' identities,
    `GRPOSettings.RUNTIME`, and `eval_every`, `data.eval_train` and `heldout_rubrics`: the evaluation draws on a
    random stream of its own and leaves the training unchanged), the identities of its parents and the data's fingerprint."""
    values = config.model_dump(mode="json", exclude={
        "output_dir": True, "backend": True, "models": True, "devices": True, "eval_every": True,
        "heldout_rubrics": True,
        "data": {"data_dir": True, "eval_train": True}, "grpo": {name: True for name in GRPOSettings.RUNTIME}})
    identities = {role: parent["identity"] for role, parent in parents.items()}
    return {"kind": kind, **values, "parents": identities, "data_source": data}


def prepare(kind: Kind, config: TrainConfig, *, known: Mapping[str, dict[str, Any]] | None = None) -> Job:
    """Check a job and compare it with its output dir, calling no model and writing nothing.

    Args:
        kind: `generator` or `policy`.
        config: The resolved config.
        known: Model spec -> identity for models that need not (or cannot yet) be identified from their weights:
            `coevolve` passes the earlier stages' checkpoints this way.

    Raises:
        ConfigError: for a bad config value, a missing data file, or a model that cannot be identified.
    """
    from benchmarks.nectar import local_file
    from harness.plan import check_training, resolve_devices
    from training.data import source_fingerprint

    parent_specs, options, endpoints = check(kind, config)
    nectar = local_file(Path(config.data.data_dir)) if config.data.data_dir is not None else None
    known = known or {}
    parents = {role: {"spec": spec, "identity": known[spec] if spec in known else identify(spec, options, endpoints)}
               for role, spec in parent_specs.items()}
    settings = job_settings(kind, config, parents=parents, data=source_fingerprint(nectar))
    devices = resolve_devices(config.devices, gpus=None, gpu_memory=None)
    if devices is not None:  # a GPU machine: the job must fit one before anything loads (run checks the rows')
        check_training(load(kind, config, options, endpoints, devices), devices)
    return Job(kind, config, options, endpoints, nectar, parents, settings,
               checkpoint.check(config.output_dir, settings))


def check(kind: Kind, config: TrainConfig) -> tuple[dict[str, str], Any, dict[str, Any]]:
    """The checks of a job's settings that read no data and no weights (`prepare` and `dry_run` alike): roles,
    backend options, the `models:` entries, the held-out evaluation, TRL's settings, the model path, the frozen
    engines and the policy's reward. Returns (role -> spec, backend options, endpoints).

    Raises:
        ConfigError: naming the setting.
    """
    from harness.config import backend_options
    from harness.endpoints import parse_endpoints
    from training.grpo import grpo_config, model_path

    parent_specs = roles(kind, config)
    options = backend_options(config.backend, where="backend")
    endpoints = parse_endpoints(config.models, where="training config")
    if config.eval_every is not None and not config.data.heldout:
        raise ConfigError("eval_every: the held-out evaluation needs data.heldout rows (the last N rows that pass "
                          "the rules are held out)")
    if config.data.eval_train and config.eval_every is None:
        raise ConfigError("data.eval_train: the training prompts are evaluated beside the held-out split; set "
                          "eval_every (or --eval-every)")
    grpo_config(config.grpo, Path(config.output_dir), eval_every=config.eval_every)
    model_path(config.model)
    _check_frozen_engines(kind, config, endpoints)
    if kind == "policy":
        _check_reward(config)
    return parent_specs, options, endpoints


def _check_reward(config: TrainConfig) -> None:
    """The policy's reward evaluator, built from its spec over stand-in models: its settings are checked before any
    model is located (an earlier co-evolution stage has no weights yet); `make_reward` builds it on the real ones.

    Raises:
        ConfigError: naming the spec and what its evaluator refuses.
    """
    from harness.backends.base import BaseBackend
    from judges import load_evaluator
    from training.fit import policy_reward_spec

    class StandIn(BaseBackend):
        kind = "stand-in"

        def __init__(self, spec: str) -> None:
            self.model = spec

        def check_score(self, head: str) -> None:
            """Any head: the model's fitness is checked when the reward is built on it."""

        async def generate(self, requests: Any) -> Any:
            raise AssertionError("a stand-in only checks how the reward is built; it is never called")

    class Pool:
        def get(self, spec: str, *, overrides: Any = None) -> Any:
            return StandIn(spec)

    spec = policy_reward_spec(config)
    try:
        load_evaluator(spec, Pool())  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(f"reward {spec}: {exc}") from None


def _check_frozen_engines(kind: Kind, config: TrainConfig, endpoints: Mapping[str, Any], *,
                          world: int | None = None) -> None:
    """Refuse a frozen model that would run as an in-process vLLM engine beside TRL's colocated one (module
    docstring), or that each of several processes (`world`; default: this launch's) would load.

    Raises:
        ConfigError: naming the model and the way out.
    """
    from training.ranks import current

    world = world or current().world
    colocated = config.grpo.use_vllm and config.grpo.vllm_mode == "colocate"
    if world < 2 and not colocated:
        return
    for role, spec in roles(kind, config).items():
        if role not in ("verifier", "generator", "reward_model") or not spec.startswith("vllm:") or spec in endpoints:
            continue
        if colocated:
            raise ConfigError(f"{role} {spec}: an in-process vLLM engine cannot run beside TRL's colocated vLLM "
                              "(grpo.use_vllm with vllm_mode: colocate turns off vLLM's multiprocessing for the whole "
                              "process, and such an engine cannot be freed: vLLM issue 21073); serve it (harness "
                              "serve, or models: / --endpoints)")
        raise ConfigError(f"{role} {spec}: under {world} training processes each would start a vLLM "
                          f"engine of its own; serve it (harness serve, or models: / --endpoints)")


def prompt_tokens(kind: Kind, config: TrainConfig, counter: Any, *, prompts: list[str] | None = None) -> int:
    """The longest prompt the trained model reads, in tokens (`counter`, a `harness.contexts.TokenCounter`): the
    policy's is the longest Nectar prompt of `prompts` (None: `NECTAR_PROMPT_TOKENS`); the generator's is its
    request over that prompt and a set of `set_size` responses of up to `max_tokens` each."""
    from harness.contexts import longest_tokens

    longest = (longest_tokens([(p,) for p in prompts], counter) if prompts is not None else NECTAR_PROMPT_TOKENS)
    if kind == "generator" and config.data.sets is not None:
        from judges.dynamic import dynamic_generator_prompt

        sets = config.data.sets
        frame = dynamic_generator_prompt("", [""] * sets.set_size, range(sets.set_size))
        longest += counter.count([frame])[0] + sets.set_size * sets.max_tokens
    return longest + CHAT_TOKENS


def load(kind: Kind, config: TrainConfig, options: Any, endpoints: Mapping[str, Any], devices: Any,
         *, processes: int | None = None, prompts: list[str] | None = None) -> Any:
    """What one training process puts on its GPU (`harness.plan.training_load`): the trained model's ZeRO-3 share
    over `processes` (default: the launch's `WORLD_SIZE`), TRL's colocated vLLM, each frozen model this process
    loads (a served one costs none), and the activations of one micro-batch (`harness.plan.activation_gib`) of
    the longest prompt (`prompt_tokens` over the rows' `prompts`; None: the assumed one) and the completion.

    Raises:
        ConfigError: a model whose config cannot be read or counted.
    """
    import os

    from harness.backends import load_backend
    from harness.contexts import token_counter
    from harness.plan import activation_gib, training_load
    from harness.weights import model_size, read_config
    from training.grpo import backend_spec, model_path

    path = model_path(config.model)
    shape = read_config(path)
    trained = model_size(shape).params.total
    grpo = config.grpo
    counter = token_counter(path)
    prompt = prompt_tokens(kind, config, counter, prompts=prompts)
    activations = activation_gib(shape, batch=grpo.per_device_train_batch_size, prompt_tokens=prompt,
                                 completion_tokens=grpo.max_completion_length,
                                 checkpointing=grpo.gradient_checkpointing)
    longest = ("the rows' longest prompt" if prompts is not None
               else f"a Nectar prompt of {NECTAR_PROMPT_TOKENS} tokens assumed: train checks the rows' longest")
    described = (f"{grpo.per_device_train_batch_size} sequence(s) of {prompt} prompt + {grpo.max_completion_length} "
                 f"completion tokens, gradient checkpointing {'on' if grpo.gradient_checkpointing else 'off'}; "
                 f"{longest}, counted with {counter.counted_with}")
    frozen = {}
    for role, spec in roles(kind, config).items():
        if role in ("model", "policy") or spec in endpoints or spec.startswith("openai:"):
            continue  # the trained model is counted apart; the set sampler is closed before training starts
        source = load_backend(backend_spec(spec), options).source
        frozen[f"{role} {spec}"] = model_size(read_config(source.path, revision=source.revision),
                                              dtype=options.dtype).gib + devices.kv_cache_gib
    colocated = grpo.vllm_gpu_memory_utilization if grpo.use_vllm and grpo.vllm_mode == "colocate" else 0.0
    ranks = processes or int(os.environ.get("WORLD_SIZE", "1"))
    return training_load(trained, processes=ranks, colocated_share=colocated, frozen=frozen, devices=devices,
                         activations_gib=activations, activations_for=described)


def run(job: Job, *, overwrite: bool = False) -> dict[str, Any]:
    """Train a prepared job into its output dir; returns the manifest written there (on every process).

    Raises:
        ConfigError: for an output dir trained with other settings (without `overwrite`), malformed data, data
            that leaves nothing to train on, or a model that cannot be loaded.
    """
    from training import ranks
    from training.data import fingerprint
    from training.grpo import plan_steps, read_rows

    if job.binding.state == "other" and (job.binding.foreign or not overwrite):
        raise checkpoint.refusal([job.binding])
    if job.binding.state == "finished" and not overwrite:  # the same command again: the checkpoint stands
        log.info("%s is trained with these settings; --overwrite trains it again", job.config.output_dir)
        return checkpoint.read(job.config.output_dir)
    rows, heldout, report = read_rows(job.config.data, job.nectar, policy=job.kind == "policy")
    _check_rows_fit(job, rows + heldout)
    me = ranks.current()
    for line in report.lines() if me.main else ():
        log.info("nectar: %s", line)
    if me.main:
        log.info("training: %s", plan_steps(job.config.grpo, rows=len(rows), processes=me.world).line(job.config.grpo))
    ranks.barrier()  # every process has compared the dir before the main process changes it
    out = Path(job.config.output_dir)
    resume = job.binding.state == "unfinished" and not overwrite
    manifest: dict[str, Any] = {}
    if me.main:
        if overwrite and job.binding.state != "new":
            checkpoint.discard(job.binding)
        manifest = checkpoint.start(out, kind=job.kind, settings=job.settings,
                                    config=job.config.model_dump(mode="json"), parents=job.parents)
    ranks.barrier()  # the dir is ready (discarded, its manifest written) before any process writes into it
    try:
        rows, history, weights, steps = _train(job, rows, heldout, resume=resume)
    except BaseException as exc:
        if me.main:
            _record_failure(out, manifest, exc)
        raise
    if me.main:
        data = {"fingerprint": fingerprint(rows), "rows": len(rows), "heldout": len(heldout),
                "heldout_fingerprint": fingerprint(heldout) if heldout else None,
                "filter": {"seen": report.seen, "kept": report.kept, "dropped": report.dropped}}
        manifest = checkpoint.finish(out, manifest, status="finished", data=data, reward_history=history,
                                     processes={"count": me.world, "weights": weights},
                                     steps={"max_steps": steps.max_steps, "epochs": steps.epochs,
                                            "prompts_per_step": steps.prompts_per_step, "rows": steps.rows})
        _plot(out)
    ranks.barrier()
    return manifest if me.main else checkpoint.read(out)


def _check_rows_fit(job: Job, rows: list) -> None:
    """On a GPU machine, refuse a job whose longest prompt among `rows` makes it exceed a GPU (`prepare` assumed
    one of `NECTAR_PROMPT_TOKENS`), before any model loads.

    Raises:
        ConfigError: with the numbers (`harness.plan.check_training`).
    """
    from harness.plan import check_training, resolve_devices

    devices = resolve_devices(job.config.devices, gpus=None, gpu_memory=None)
    if devices is None:
        return
    found = load(job.kind, job.config, job.options, job.endpoints, devices, prompts=[r.prompt for r in rows])
    check_training(found, devices)


def _record_failure(out: Path, manifest: dict[str, Any], exc: BaseException) -> None:
    interrupted = isinstance(exc, (KeyboardInterrupt, Interrupted, asyncio.CancelledError))
    try:
        checkpoint.finish(out, manifest, status="interrupted" if interrupted else "failed",
                          error=f"{type(exc).__name__}: {exc}")
    except HarnessError:
        pass  # the first error is the one to report; this one (often the same full disk) only repeats it


def _plot(out: Path) -> None:
    """The run's curves as `training_curves.png` (said and skipped where matplotlib is missing)."""
    from training.plots import plot_run

    try:
        log.info("curves: %s", plot_run(out))
    except ConfigError as exc:
        log.warning("no figure of the curves: %s", exc)


def train(kind: Kind, config: TrainConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """`prepare` and `run` one job; returns the manifest it writes."""
    return run(prepare(kind, config), overwrite=overwrite)


def dry_run(kind: Kind, config: TrainConfig, *, processes: int | None = None) -> list[str]:
    """What a job would train on, in lines, with no model loaded or called: each rule's drops on the data given,
    the training and held-out rows, the reward, and the steps with `processes` (default: this launch's, so
    `WORLD_SIZE=N` asks for N) and the passes over the rows they make. The generator's rows whose sets fail to
    sample are not known yet.

    Raises:
        ConfigError: for a bad config (`check`: what `train` refuses before it reads a row), a missing or
            malformed data file, or data that leaves nothing to train on.
    """
    from benchmarks.nectar import local_file
    from training import ranks
    from training.fit import policy_reward_spec
    from training.grpo import plan_steps, read_rows

    world = processes or ranks.current().world
    with _one_process():  # TRL's settings are checked as one process's: `WORLD_SIZE=N` alone starts no group
        parents, _, _ = check(kind, config)
    nectar = local_file(Path(config.data.data_dir)) if config.data.data_dir is not None else None
    rows, heldout, report = read_rows(config.data, nectar, policy=kind == "policy")
    objective = {"both": f"z(R_disc) + {config.lam} z(R_anchor)", "disc": "R_disc alone",
                 "anchor": "R_anchor alone"}[config.objective]
    reward = (f"{objective}, verifier {config.verifier}, {config.verify_mode} verdicts" if kind == "generator"
              else policy_reward_spec(config))
    return [f"{kind} job: {config.model} -> {config.output_dir}",
            *(f"  {role}: {spec}" for role, spec in parents.items() if role != "model"),
            f"reward: {reward}",
            "nectar: " + report.lines()[0], *report.lines()[1:],
            f"training rows: {len(rows)}, held out: {len(heldout)}"
            + (f", evaluated: the held-out rows and the first {min(config.data.eval_train, len(rows))} training rows"
               if config.data.eval_train else ""),
            "steps: " + plan_steps(config.grpo, rows=len(rows), processes=world).line(config.grpo)]


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """The launch's rank variables hidden: TRL's `GRPOConfig` would otherwise set up a process group (and want
    `MASTER_ADDR`) for a dry run that asked for N processes with `WORLD_SIZE=N`."""
    import os

    hidden = {k: os.environ.pop(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
              if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


def _train(job: Job, rows: list, heldout: list, *, resume: bool
           ) -> tuple[list, list[dict[str, Any]], list[str] | None, Any]:
    """Sample the generator's sets (generator jobs: the main process), train, save; returns the rows trained on,
    the reward's per-step history (this process's share), every process's weights digest and the steps."""
    from harness.cache import CallCache
    from harness.pool import BackendPool
    from training import ranks
    from training.fit import fit, make_reward
    from training.grpo import sample_sets

    config, out = job.config, Path(job.config.output_dir)
    if job.kind == "generator":
        if ranks.current().main:
            sets_pool = BackendPool(options=job.options, cache=CallCache(), endpoints=job.endpoints)
            sets_seed = config.grpo.seed if config.data.sets.seed is None else config.data.sets.seed
            sample_sets(rows + heldout, config.data.sets, out / SETS, sets_pool, seed=sets_seed)
        ranks.barrier()  # the other processes wait for the sets, then read them
    rows, dataset, evaluated, seen, rollouts = _datasets(job, rows, heldout, out / SETS)
    if job.kind == "policy" and config.heldout_rubrics is not None and ranks.current().main:
        copy_rubrics(Path(config.heldout_rubrics), out)
    ranks.barrier()
    pool = BackendPool(options=job.options, cache=CallCache(), endpoints=job.endpoints)
    reward = make_reward(job.kind, config, pool, heldout_dir=out)
    try:
        fitted = fit(config.model, config.grpo, dataset, reward, out, heldout=evaluated,
                     eval_every=config.eval_every, rollouts=rollouts, resume=resume, seen=seen)
    finally:
        asyncio.run(pool.close())
    return rows, reward.history, list(fitted.weights) if fitted.weights is not None else None, fitted.steps


def copy_rubrics(source: Path, out: Path) -> None:
    """Fixed held-out rubrics from `source` into the dir `out` (`training.heldout`), unless it has its own (a
    resumed run keeps them); a missing `source` is said, and the run makes its own."""
    import shutil

    from training.heldout import RUBRICS

    target = Path(out) / RUBRICS
    if target.is_file():
        return
    if not source.is_file():
        log.warning("heldout_rubrics: %s does not exist; this run makes its own held-out rubrics", source)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _datasets(job: Job, rows: list, heldout: list, sets_file: Path) -> tuple[list, list, list, list, Any]:
    """(rows, training dataset, held-out dataset, the first `data.eval_train` training rows as an evaluation
    dataset (split `seen`), rollout grammar) of a job; the generator's rows are those whose sets `sets_file`
    holds."""
    from training.grpo import generator_dataset, policy_dataset, read_sets
    from training.rollouts import rollout_constraint

    config = job.config
    n = config.data.eval_train
    if job.kind != "generator":
        return (rows, policy_dataset(rows), policy_dataset(heldout, split="heldout"),
                policy_dataset(rows[:n], split="seen"), None)
    seed = config.grpo.seed
    rows, sets = read_sets(rows, config.data.sets, sets_file)
    heldout, held_sets = read_sets(heldout, config.data.sets, sets_file)
    rollouts = rollout_constraint(config.grpo.max_completion_length) if config.structured else None
    return (rows, generator_dataset(rows, sets, seed=seed),
            generator_dataset(heldout, held_sets, seed=seed, split="heldout"),
            generator_dataset(rows[:n], sets[:n], seed=seed, split="seen"), rollouts)


def evaluate_base(job: Job, *, steps: list[int], out: Path, sets_from: Path) -> Path:
    """The job's model as it starts (the base weights, no step taken) evaluated on the held-out split at each of
    `steps`' evaluation streams (`training.fit.evaluate_at`: the samples a run of this job draws when it evaluates
    at that step) into `out`: `train_log.jsonl` and `eval_scores.jsonl` (replaced), the fixed rubrics read from
    `out/heldout_rubrics.jsonl` where it exists. The generator's held-out sets are read from `sets_from`'s
    `sets.jsonl` (the trained run's). Returns the per-prompt scores' path.

    Raises:
        ConfigError: for malformed data, or a model that cannot be loaded.
    """
    from harness.cache import CallCache
    from harness.pool import BackendPool
    from training.fit import evaluate_at, make_reward
    from training.grpo import read_rows
    from training.heldout import SCORES

    config = job.config
    rows, heldout, _ = read_rows(config.data, job.nectar, policy=job.kind == "policy")
    rows, dataset, evaluated, seen, rollouts = _datasets(job, rows, heldout, Path(sets_from) / SETS)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SCORES).unlink(missing_ok=True)
    pool = BackendPool(options=job.options, cache=CallCache(), endpoints=job.endpoints)
    reward = make_reward(job.kind, config.model_copy(update={"shuffle_rewards": False}), pool, heldout_dir=out)
    try:
        evaluate_at(config.model, config.grpo, dataset, reward, out, heldout=evaluated, steps=steps,
                    eval_every=config.eval_every or 1, rollouts=rollouts, seen=seen)
    finally:
        asyncio.run(pool.close())
    return out / SCORES
