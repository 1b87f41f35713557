"""`harness train coevolve`: the DR-Generator and the DR-Policy trained in alternating rounds.

Round r (1..R): `G_r` = the generator `G_{r-1}` trained on response sets of the policy `P_{r-1}`; then `P_r` = the
policy `P_{r-1}` trained on `G_r`'s rubric scores. With R = 2: G0 -> G1 (on P0's sets) -> P1 (with G1) -> G2 (on
P1's sets) -> P2 (with G2). Figure 2's stale controls (`stale_controls: true`), from round 2 on: `G_r~` = `G_{r-1}`
trained on the sets of `P_{r-2}` (the policy it already saw: G1 -> G2~ on P0), and `P_r~` = `P_{r-1}` trained with
`G_{r-1}` (the generator that did not co-evolve: P1 -> P2~ with G1). Table 3's ablations are the generator's
`objective` (`disc`, `anchor`). Each generator stage samples its response sets with a seed of its own
(`stage_sets_seed`: the run seed and the stage's name), so G2~ rates a fresh sample of P0's responses, not a second
epoch of G1's sets.

Each stage's entry in `coevolve.json` carries its score gap Δ_gap (`gap`): a generator stage's mean, over its last
held-out evaluation (else its last training step), of the better-ranked Nectar anchor's score minus the
worse-ranked one's under its rubrics (`training.rewards.anchor_gap`); the paper's Theorem 1 ties co-evolution to
keeping it open. A policy stage has no preference to measure it on (null).

Each kind of stage keeps its own number of rows (`data.generator_limit`: the generator stages' response sets, the
paper's 24K; `data.policy_limit`: the policy stages' prompts, the paper's 36K), each after its own Appendix B rules;
the rest of `data` is shared.

Every stage is one `training.job.train` job with its own output dir (`G1`, `P1`, `G2`, `P2`, `G2-stale`,
`P2-stale` under `output_dir`), and `coevolve.json` lists them with their parents, so a table config can point rows
at them (`rows: {DR-Generator-8B: "dynamic-rubric:generator=hf:OUT/G2,..."}`).

Every stage is bound to its settings like any checkpoint (`training.checkpoint`): its resolved `TrainConfig` and
its parents' identities, where an earlier stage's identity is the digest of that stage's settings (so a change
reaches every stage trained from it). Before stage 1 trains, every stage's config is built and checked and its dir
compared (`training.job.prepare`): a bad value stops the run there, and so do stages trained with other settings,
all named in one error, unless `overwrite` discards them. A rerun keeps the finished stages of the same settings
(more `rounds` add stages) and trains the rest. As each stage ends, `report` hears what it trained and where it is
(the command prints it: `stage_line`). Under `accelerate launch` every process runs every stage
(`training.job`); the main process writes `coevolve.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.config import validation_problems
from harness.errors import ConfigError
from judges.verify import VerifyMode
from training import checkpoint
from training.grpo import (
    DataConfig,
    GRPOSettings,
    NectarData,
    SetSampling,
    TrainConfig,
    with_data_dir,
    with_max_steps,
)
from training.job import Job, identify, prepare, run
from training.ranks import current
from training.rewards import Objective


class CoevolveData(NectarData):
    """A co-evolution's `data`: a job's `data` with a limit per kind of stage in place of its one `limit`."""

    generator_limit: int | None = Field(None, ge=1)
    """Generator stages: keep the first N rows that pass `generator_rules` (the paper: 24K sets)."""
    policy_limit: int | None = Field(None, ge=1)
    """Policy stages: keep the first N prompts that pass `policy_rules` (the paper: 36K)."""

    @model_validator(mode="before")
    @classmethod
    def _a_limit_per_kind(cls, values: Any) -> Any:
        if isinstance(values, Mapping) and "limit" in values:
            raise ValueError("`limit` is not read by a co-evolution, whose stages keep limits of their own: set "
                             "data.generator_limit (the generator stages' response sets; the paper: 24K) and "
                             "data.policy_limit (the policy stages' prompts; the paper: 36K)")
        return values

    def for_stage(self, kind: Literal["generator", "policy"]) -> DataConfig:
        """The `data` of one kind of stage: these settings, with that kind's limit as its `limit`."""
        shared = {name: getattr(self, name) for name in NectarData.model_fields}
        return DataConfig(**shared, limit=self.generator_limit if kind == "generator" else self.policy_limit)


class CoevolveConfig(BaseModel):
    """`harness train coevolve --config FILE` (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    """P0: the base policy's model spec."""
    generator: str
    """G0: the base generator's model spec."""
    verifier: str
    """The frozen DR-Verifier (every round)."""
    output_dir: Path
    rounds: int = Field(2, ge=1)
    stale_controls: bool = False
    verify_mode: VerifyMode = "per_item"
    """`per_item`: the paper's binary verdicts; `logprob`: P(yes), thresholded at 0.5 for R_disc."""
    structured: bool = True
    lam: float = Field(1.0, ge=0)
    objective: Objective = "both"
    gen_max_tokens: int = Field(512, ge=16)
    set_size: int = Field(4, ge=2)
    set_temperature: float = Field(1.0, ge=0)
    set_max_tokens: int = Field(512, ge=1)
    data: CoevolveData = Field(default_factory=CoevolveData)
    """Shared by every stage but the limits: `generator_limit` for the generator stages, `policy_limit` for the
    policy stages."""
    generator_grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    policy_grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    backend: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Model spec -> where it is served (`harness.endpoints`), for every stage."""


def load_coevolve_config(path: Path, *, rounds: int | None = None, output_dir: Path | None = None,
                         data_dir: Path | None = None, max_steps: int | None = None) -> CoevolveConfig:
    """The YAML file's settings with the command line's non-None values on top (`rounds`, `output_dir`,
    `data.data_dir`, and `max_steps` for both trainers).

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    from harness.config import load_config_file

    config = load_config_file(path, CoevolveConfig, what="co-evolution config",
                              overrides={"rounds": rounds, "output_dir": output_dir})
    return config.model_copy(update={"data": with_data_dir(config.data, data_dir),
                                     "generator_grpo": with_max_steps(config.generator_grpo, max_steps),
                                     "policy_grpo": with_max_steps(config.policy_grpo, max_steps)})


def plan(config: CoevolveConfig) -> list[dict[str, str]]:
    """The stages in order: name, kind, what it trains from, and the policy (generator) or generator (policy)
    it uses; names of earlier stages (`G0`, `P0` are the base models)."""
    stages = []
    for r in range(1, config.rounds + 1):
        stages.append({"name": f"G{r}", "kind": "generator", "model": f"G{r - 1}", "sets_from": f"P{r - 1}"})
        if config.stale_controls and r >= 2:
            stages.append({"name": f"G{r}-stale", "kind": "generator", "model": f"G{r - 1}",
                           "sets_from": f"P{r - 2}"})
        stages.append({"name": f"P{r}", "kind": "policy", "model": f"P{r - 1}", "generator": f"G{r}"})
        if config.stale_controls and r >= 2:
            stages.append({"name": f"P{r}-stale", "kind": "policy", "model": f"P{r - 1}",
                           "generator": f"G{r - 1}"})
    return stages


def stage_sets_seed(config: CoevolveConfig, stage: dict[str, str]) -> int:
    """The seed a generator stage samples its response sets with: the run seed and the stage's name."""
    from harness.seeds import derive_seed

    return derive_seed(config.generator_grpo.seed, "sets", stage["name"])


def stage_config(config: CoevolveConfig, stage: dict[str, str], specs: dict[str, str], target: Path
                 ) -> TrainConfig:
    """The `TrainConfig` of one stage of `plan`; `specs` maps earlier stages' names to their model specs.

    Raises:
        ConfigError: naming the values its config refuses.
    """
    common = dict(model=specs[stage["model"]], output_dir=target, verifier=config.verifier,
                  verify_mode=config.verify_mode, structured=config.structured, backend=config.backend,
                  models=config.models)
    try:
        if stage["kind"] == "generator":
            sets = SetSampling(policy=specs[stage["sets_from"]], set_size=config.set_size,
                               temperature=config.set_temperature, max_tokens=config.set_max_tokens,
                               seed=stage_sets_seed(config, stage))
            return TrainConfig(**common, lam=config.lam, objective=config.objective, grpo=config.generator_grpo,
                               data=config.data.for_stage("generator").model_copy(update={"sets": sets}))
        return TrainConfig(**common, generator=specs[stage["generator"]], gen_max_tokens=config.gen_max_tokens,
                           grpo=config.policy_grpo, data=config.data.for_stage("policy"))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None


def prepare_stages(config: CoevolveConfig) -> list[tuple[dict[str, str], Job]]:
    """Every stage of `plan` with its prepared job, checked and compared with its dir; no model is called.

    Raises:
        ConfigError: naming the stage whose config is refused.
    """
    from harness.config import backend_options

    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} exists and is not a directory")
    from harness.endpoints import parse_endpoints

    options = backend_options(config.backend, where="backend")
    endpoints = parse_endpoints(config.models, where="co-evolution config")
    known = {spec: identify(spec, options, endpoints) for spec in dict.fromkeys((config.generator, config.policy,
                                                                                  config.verifier))}
    specs = {"G0": config.generator, "P0": config.policy}
    jobs = []
    for stage in plan(config):
        target = out / stage["name"]
        try:
            job_config = stage_config(config, stage, specs, target)
            job = prepare(stage["kind"], job_config, known=known)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"stage {stage['name']}: {exc}") from None
        specs[stage["name"]] = f"hf:{target}"
        # A stage not trained yet has no weights to fingerprint: its settings stand for it.
        known[specs[stage["name"]]] = {"stage": stage["name"], "settings": checkpoint.digest(job.settings)}
        jobs.append((stage, job))
    return jobs


_ROLE = {"model": "model", "sets_from": "policy", "generator": "generator"}
"""A stage's parent key in `plan` -> its role in the stage's job."""


def coevolve(config: CoevolveConfig, *, overwrite: bool = False,
             report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every stage of `plan` and write `coevolve.json` (the main process); returns it.

    Every stage is prepared first; finished stages of the same settings are kept, the others trained in order.

    Args:
        config: The co-evolution config.
        overwrite: Discard (and retrain) the stages trained with other settings instead of refusing them.
        report: Called (main process) with each stage's entry of `coevolve.json` as soon as the stage is trained or
            kept, plus `reward`: its last logged reward stats (`stage_line` says it in one line).

    Raises:
        ConfigError: before any training, for a bad stage config or stages trained with other settings.
    """
    from harness.redact import redact
    from harness.runstore import package_versions, utc_now, write_json_atomic

    jobs = prepare_stages(config)
    refused = [job.binding for _, job in jobs if job.binding.state == "other"]
    if refused and (not overwrite or any(b.foreign for b in refused)):
        raise checkpoint.refusal(refused)
    done = []
    for stage, job in jobs:
        kept = job.binding.state == "finished"
        manifest = checkpoint.read(job.config.output_dir) if kept else run(job, overwrite=job.binding.state == "other")
        done.append({**stage, "checkpoint": str(job.config.output_dir), "spec": f"hf:{job.config.output_dir}",
                     "status": "kept" if kept else "trained", "settings": checkpoint.digest(job.settings),
                     "parents": {k: job.parents[_ROLE[k]]["spec"] for k in stage if k in _ROLE},
                     "gap": stage_gap(job.config.output_dir) if stage["kind"] == "generator" else None})
        if report is not None and current().main:
            history = manifest.get("reward_history") or [{}]
            report({**done[-1], "reward": history[-1]})
    first = jobs[0][1].parents  # G1 starts from G0 and rates P0's sets
    manifest = {"rounds": config.rounds, "stale_controls": config.stale_controls,
                "base": {"G0": first["model"], "P0": first["policy"]}, "stages": done,
                "config": redact(config.model_dump(mode="json")), "versions": package_versions(), "written": utc_now()}
    if current().main:
        Path(config.output_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(config.output_dir) / "coevolve.json", manifest)
    return manifest


def stage_gap(output_dir: Path) -> float | None:
    """A generator stage's Δ_gap on the anchors: its last held-out `eval_dr/gap` in `train_log.jsonl`, else its
    last training `dr/gap`; None where neither was logged."""
    import json

    log = Path(output_dir) / "train_log.jsonl"
    if not log.is_file():
        return None
    held = trained = None
    for line in log.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        held = entry.get("eval_dr/gap", held)
        trained = entry.get("dr/gap", trained)
    return held if held is not None else trained


def stage_line(entry: Mapping[str, Any]) -> str:
    """One stage of `coevolve` in words: what it trained, from what, where it is, and its last reward stats."""
    parents = entry["parents"]
    if entry["kind"] == "generator":
        what = f"generator from {parents['model']} on the sets of {parents['sets_from']}"
    else:
        what = f"policy from {parents['model']} with the rubrics of {parents['generator']}"
    reward = entry.get("reward") or {}
    shown = ", ".join(f"{k} {reward[k]:.4g}" for k in ("reward_mean", "disc_mean", "anchor_mean", "parse_rate")
                      if isinstance(reward.get(k), float))
    if isinstance(entry.get("gap"), float):
        shown += (", " if shown else "") + f"gap {entry['gap']:.4g}"
    return (f"{entry['name']:<10} {entry['status']:<7} {what} -> {entry['checkpoint']}"
            + (f" ({shown})" if shown else ""))
