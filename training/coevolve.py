"""`harness train coevolve`: the DR-Generator and the DR-Policy trained in alternating rounds.

Round r (1..R): `G_r` = the generator `G_{r-1}` trained on response sets of the policy `P_{r-1}`; then `P_r` = the
policy `P_{r-1}` trained on `G_r`'s rubric scores. With R = 2: G0 -> G1 (on P0's sets) -> P1 (with G1) -> G2 (on
P1's sets) -> P2 (with G2). Figure 2's stale controls (`stale_controls: true`), from round 2 on: `G_r~` = `G_{r-1}`
trained on the sets of `P_{r-2}` (the policy it already saw: G1 -> G2~ on P0), and `P_r~` = `P_{r-1}` trained with
`G_{r-1}` (the generator that did not co-evolve: P1 -> P2~ with G1). Table 3's ablations are the generator's
`objective` (`disc`, `anchor`).

Every stage is one `training.grpo.train` job with its own output dir (`G1`, `P1`, `G2`, `P2`, `G2-stale`,
`P2-stale` under `output_dir`), and `coevolve.json` lists them with their parents, so a table config can point rows
at them (`rows: {DR-Generator-8B: "dynamic-rubric:generator=hf:OUT/G2,..."}`). A rerun skips stages whose
checkpoint is complete (its `dr_manifest.json` written) and trains the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.grpo import DataConfig, GRPOSettings, SetSampling, TrainConfig, train


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
    verify_mode: str = "logprob"
    structured: bool = True
    lam: float = Field(1.0, ge=0)
    objective: str = "both"
    gen_max_tokens: int = Field(512, ge=16)
    set_size: int = Field(4, ge=2)
    set_temperature: float = Field(1.0, ge=0)
    set_max_tokens: int = Field(512, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    generator_grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    policy_grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    backend: dict[str, Any] = Field(default_factory=dict)


def load_coevolve_config(path: Path, *, rounds: int | None = None) -> CoevolveConfig:
    """The YAML file's settings, `--rounds` on top.

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    from harness.config import load_config_file

    return load_config_file(path, CoevolveConfig, what="co-evolution config", overrides={"rounds": rounds})


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


def coevolve(config: CoevolveConfig) -> dict[str, Any]:
    """Run every stage of `plan` (skipping finished ones) and write `coevolve.json`; returns it."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = {"G0": config.generator, "P0": config.policy}
    done = []
    for stage in plan(config):
        target = out / stage["name"]
        if stage["kind"] == "generator":
            job = TrainConfig(
                model=specs[stage["model"]], output_dir=target, verifier=config.verifier,
                verify_mode=config.verify_mode, structured=config.structured, lam=config.lam,
                objective=config.objective, grpo=config.generator_grpo, backend=config.backend,
                data=config.data.model_copy(update={"sets": SetSampling(
                    policy=specs[stage["sets_from"]], set_size=config.set_size,
                    temperature=config.set_temperature, max_tokens=config.set_max_tokens)}),
            )
        else:
            job = TrainConfig(
                model=specs[stage["model"]], output_dir=target, verifier=config.verifier,
                generator=specs[stage["generator"]], verify_mode=config.verify_mode, structured=config.structured,
                gen_max_tokens=config.gen_max_tokens, grpo=config.policy_grpo, backend=config.backend,
                data=config.data,
            )
        if not (target / "dr_manifest.json").is_file():
            train(stage["kind"], job)  # type: ignore[arg-type]
        specs[stage["name"]] = f"hf:{target}"
        done.append({**stage, "checkpoint": str(target), "spec": specs[stage["name"]],
                     "parents": {k: specs[v] for k, v in stage.items() if k in ("model", "sets_from", "generator")}})
    manifest = {"rounds": config.rounds, "stale_controls": config.stale_controls, "base": {"G0": config.generator,
                "P0": config.policy}, "stages": done, "config": config.model_dump(mode="json")}
    (out / "coevolve.json").write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    return manifest
