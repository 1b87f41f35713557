"""The shipped training configs and what they name: every config loads and names its models; the paper-scale ones
train exactly the checkpoints the report tables read (each Table 2, 3, 7 and 8 row has one); a policy's reward is any
registered evaluator, trained end to end with a scalar reward model; `--dry-run` prints each rule's drops and the
steps; the steps follow from the data and the processes; and co-evolution's stale generator rates a fresh sample."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from training.grpo import GRPOSettings, TrainConfig, load_train_config, plan_steps
from training.job import roles

CONFIGS = sorted(p for p in (Path(__file__).parents[2] / "training" / "configs").glob("*.yaml")
                 if not p.name.startswith("accelerate"))
_CHECKPOINT = re.compile(r"checkpoints/(?!coevolve/)[\w.\-]+")
"""A checkpoint a table row reads (`checkpoints/coevolve/G2` and the like are `harness train coevolve`'s stages)."""


def _kind(path: Path) -> str:
    return "policy" if path.name.startswith("policy") else "generator"


def _expected() -> dict[str, set[str]]:
    """Checkpoint dir -> the kinds of row that read it (`policy`: a policy table's row; `generator`: a rubric
    evaluator's generator), from every table the registry lists."""
    from harness.registry import lookup, names

    found: dict[str, set[str]] = {}
    for name in names("table"):
        spec = lookup("table", name)
        for row in spec.rows:
            text = row.spec("paper")
            for checkpoint in _CHECKPOINT.findall(text):
                kind = "generator" if f"generator=vllm:{checkpoint}" in text else "policy"
                found.setdefault(checkpoint, set()).add(kind)
    return found


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_names_its_models(path: Path):
    config = load_train_config(path)
    found = roles(_kind(path), config)
    assert found["model"] == config.model
    # every frozen model the reward calls is named beside the trained one; a rule reward calls none
    rule = (config.reward or "").startswith("rule:")
    assert len(found) == 1 if rule else len(found) >= 2, found


def test_the_paper_scale_configs_train_the_checkpoints_the_tables_read():
    expected = _expected()
    trained = {}
    for path in CONFIGS:
        out = str(load_train_config(path).output_dir)
        if "cpu" not in path.name:
            assert out in expected, f"{path.name} trains {out}, which no table reads"
            assert _kind(path) in expected[out], f"{path.name} trains a {_kind(path)} the tables read otherwise"
            trained[out] = path.name
    missing = sorted(set(expected) - set(trained))
    assert not missing, f"no shipped config trains {missing}"
    for row in ("policy-skywork-27b", "policy-skywork-27b-responses", "policy-nemotron-70b",
                "policy-nemotron-70b-responses", "policy-rar-235b", "dr-policy-llama-3.1-8b",
                "dr-generator-llama-3.1-8b"):
        assert f"checkpoints/{row}" in trained


def test_table_2s_baseline_rewards_are_their_evaluators():
    by_name = {p.name: load_train_config(p) for p in CONFIGS}
    assert by_name["policy-skywork-27b.yaml"].reward.startswith("scalar-rm:")
    assert "with_responses=true" in by_name["policy-skywork-27b-responses.yaml"].reward
    assert "head=lm-token0" in by_name["policy-nemotron-70b.yaml"].reward
    assert by_name["policy-rar-235b.yaml"].reward.startswith("static-rubric:")
    rar = by_name["policy-rar-235b.yaml"]
    assert roles("policy", rar)["generator"] == "vllm:Qwen/Qwen3-235B-A22B-Instruct-2507"  # the paper's generator
    assert set(rar.models) == {"vllm:Qwen/Qwen3-235B-A22B-Instruct-2507", "vllm:Qwen/Qwen3-30B-A3B"}
    # Appendix F.3 repeats the full pipeline on Llama: its policy is supervised by the Llama DR-Generator.
    llama = by_name["policy-llama-3.1-8b.yaml"]
    llama_generator = f"vllm:{by_name['generator-llama-3.1-8b.yaml'].output_dir}"
    assert llama_generator == "vllm:checkpoints/dr-generator-llama-3.1-8b"
    assert roles("policy", llama)["generator"] == llama.generator == llama_generator
    assert set(llama.models) == {llama_generator, "vllm:Qwen/Qwen3-30B-A3B"}
    for name, config in by_name.items():  # the paper's verdicts and advantage unless a config says otherwise
        assert config.verify_mode == "per_item" and config.grpo.scale_rewards is None, name
        if "8b" in name and "llama" not in name:
            assert config.grpo.extra.get("chat_template_kwargs") == {"enable_thinking": False}, name


def test_a_reward_spec_replaces_the_dynamic_rubrics_settings(tmp_path: Path):
    with pytest.raises(ValidationError, match="reward names the evaluator; generator, verify_mode would be ignored"):
        TrainConfig(model="m", output_dir=tmp_path, reward="scalar-rm:model=rm", generator="g", verify_mode="logprob")
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="`reward` is for policy jobs"):
        roles("generator", TrainConfig(model="m", output_dir=tmp_path, reward="scalar-rm:model=rm"))
    with pytest.raises(ConfigError, match="needs a reward"):
        roles("policy", TrainConfig(model="m", output_dir=tmp_path))
    pytest.importorskip("trl")
    from training.job import prepare

    bogus = TrainConfig(model="m", output_dir=tmp_path, reward="scalar-rm:model=rm,bogus=1")
    with pytest.raises(ConfigError, match=r"reward scalar-rm:model=rm,bogus=1: evaluator 'scalar-rm': unknown "
                                          r"setting\(s\) bogus"):
        prepare("policy", bogus)


def test_the_steps_follow_from_the_data_and_the_processes():
    """The paper-scale batch (8 completions a process, accumulation 4, groups of 8): one epoch of 24K sets is 750
    steps on 8 processes and 1000 on the 6 of the documented launch; `max_steps` says what it covers."""
    grpo = GRPOSettings(num_generations=8, per_device_train_batch_size=8, gradient_accumulation_steps=4, epochs=1)
    assert plan_steps(grpo, rows=24000, processes=8).max_steps == 750
    six = plan_steps(grpo, rows=24000, processes=6)
    assert (six.max_steps, six.epochs, six.prompts_per_step) == (1000, 1.0, 24)
    assert plan_steps(grpo.model_copy(update={"epochs": 2.0}), rows=36000, processes=6).max_steps == 3000
    reused = grpo.model_copy(update={"extra": {"num_iterations": 2}})
    assert plan_steps(reused, rows=24000, processes=6).max_steps == 2000  # each generation trains two steps
    fixed = plan_steps(grpo.model_copy(update={"epochs": None, "max_steps": 750}), rows=24000, processes=6)
    assert fixed.epochs == 0.75 and "750 steps x 24 prompts per step" in fixed.line(grpo)
    assert GRPOSettings().epochs is None and GRPOSettings().max_steps is None  # unset: one epoch
    assert plan_steps(GRPOSettings(), rows=10, processes=1).epochs == 1.0
    with pytest.raises(ValidationError, match="set epochs or max_steps, not both"):
        GRPOSettings(epochs=1, max_steps=10)


def test_dry_run_prints_each_rules_drops_and_the_steps(tmp_path: Path, nectar_dir: Path):
    done = subprocess.run([sys.executable, "-m", "harness", "train", "generator", "--config",
                           "training/configs/generator-8b.yaml", "--data-dir", str(nectar_dir), "--dry-run"],
                          capture_output=True, text=True, timeout=300, env={**_env(), "WORLD_SIZE": "6"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "generator job: Qwen/Qwen3-8B -> checkpoints/dr-generator-8b"
    drops = {m.group(1): int(m.group(2)) for m in map(re.compile(r"  dropped by (\w+): (\d+)").match, lines) if m}
    seen, kept = map(int, re.search(r"nectar: (\d+) rows, (\d+) kept", done.stdout).groups())
    assert seen == 194 and kept == seen - sum(drops.values()) and {"degenerate", "repetitive"} <= set(drops)
    assert f"training rows: {kept}, held out: 0" in lines
    steps = -(-kept * 8 // (2 * 6 * 16))
    assert f"steps: {steps} steps x 24 prompts per step (2 completions per process x 6 processes x 16 accumulation " \
           f"/ 8 per prompt)" in done.stdout
    assert not (Path("checkpoints") / "dr-generator-8b").exists()


def _bad_endpoint(tmp_path: Path, entry: dict) -> tuple[str, ...]:
    path = tmp_path / "endpoints.yaml"
    path.write_text(json.dumps({"models": {"smollm2-135m": entry}}))
    return ("--endpoints", str(path))


@pytest.mark.parametrize(("config", "extra", "said"), [
    ("generator-cpu.yaml", lambda _: ("--eval-every", "4"), "eval_every: the held-out evaluation needs data.heldout"),
    ("generator-cpu-learn.yaml", lambda _: ("--seeds", "2", "--control", "shuffled"),
     "a learning comparison (--seeds, --control) needs --eval-every K"),
    ("policy-cpu.yaml", lambda tmp: _bad_endpoint(tmp, {"base_url": "http://localhost:8001/v1", "served": [1, 2]}),
     "models.smollm2-135m: served must be"),
    ("policy-cpu.yaml", lambda tmp: _bad_endpoint(tmp, {"base_url": "http://"}),
     "models.smollm2-135m: base_url must be an http(s) URL with a host"),
], ids=["eval-every without heldout", "seeds without eval-every", "served not a string", "base_url without host"])
def test_a_dry_run_refuses_what_the_job_refuses_with_the_same_line(tmp_path: Path, nectar_dir: Path, config: str,
                                                                   extra, said: str):
    """`--dry-run` makes every check the job makes before it reads a row, so it never passes what `train`
    refuses."""
    what = _kind(Path(config))
    argv = [sys.executable, "-m", "harness", "train", what, "--config", f"training/configs/{config}", "--data-dir",
            str(nectar_dir), "--output-dir", str(tmp_path / "out"), *extra(tmp_path)]
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=300, env=_env())
    real = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    assert dry.returncode == 2 and real.returncode == 2, (dry.stdout, dry.stderr, real.stderr)
    (line,) = dry.stderr.strip().splitlines()
    assert said in line and line in real.stderr.splitlines()
    assert not (tmp_path / "out").exists()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_the_stale_generator_rates_a_fresh_sample_of_the_same_policy(tmp_path: Path):
    from training.coevolve import CoevolveConfig, plan, stage_config

    config = CoevolveConfig(policy="p0", generator="g0", verifier="v", output_dir=tmp_path, stale_controls=True)
    stages = {s["name"]: s for s in plan(config)}
    specs = {"G0": "g0", "P0": "p0", "G1": "hf:g1", "P1": "hf:p1"}
    g1 = stage_config(config, stages["G1"], specs, tmp_path / "G1").data.sets
    stale = stage_config(config, stages["G2-stale"], specs, tmp_path / "G2-stale").data.sets
    g2 = stage_config(config, stages["G2"], specs, tmp_path / "G2").data.sets
    assert g1.policy == stale.policy == "p0" and g2.policy == "hf:p1"
    assert len({g1.seed, stale.seed, g2.seed}) == 3


def test_each_kind_of_coevolve_stage_keeps_its_own_limit(tmp_path: Path):
    """The paper trains its generator stages on 24K sets and its policy stages on 36K prompts: each kind of stage
    gets its own limit, the rest of `data` shared; the one shared `limit` is refused, naming the two."""
    from harness.errors import ConfigError
    from training.coevolve import CoevolveConfig, load_coevolve_config, plan, stage_config

    config = CoevolveConfig(policy="p0", generator="g0", verifier="v", output_dir=tmp_path, stale_controls=True,
                            data={"generator_limit": 24000, "policy_limit": 36000, "heldout": 5,
                                  "policy_rules": {"max_prompt_chars": 300}})
    specs = {"G0": "g0", "P0": "p0", "G1": "hf:g1", "P1": "hf:p1", "G2": "hf:g2"}
    limits = {}
    for stage in plan(config):
        data = stage_config(config, stage, specs, tmp_path / stage["name"]).data
        limits[stage["name"]] = data.limit
        assert data.heldout == 5 and data.policy_rules.max_prompt_chars == 300
    assert limits == {"G1": 24000, "P1": 36000, "G2": 24000, "G2-stale": 24000, "P2": 36000, "P2-stale": 36000}
    path = tmp_path / "co.yaml"
    path.write_text(json.dumps({"policy": "p0", "generator": "g0", "verifier": "v", "output_dir": str(tmp_path),
                                "data": {"limit": 2}}))
    with pytest.raises(ConfigError, match=r"co\.yaml: data: `limit` is not read by a co-evolution.*"
                                          r"data\.generator_limit .*data\.policy_limit"):
        load_coevolve_config(path)
    with pytest.raises(ConfigError, match="data.generator_limit: Input should be greater than or equal to 1"):
        path.write_text(json.dumps({"policy": "p0", "generator": "g0", "verifier": "v", "output_dir": str(tmp_path),
                                    "data": {"generator_limit": 0}}))
        load_coevolve_config(path)


def test_a_coevolve_stage_reports_its_gap(tmp_path: Path):
    from training.coevolve import stage_gap, stage_line

    log = tmp_path / "train_log.jsonl"
    log.write_text("\n".join(json.dumps(line) for line in (
        {"step": 0, "eval_dr/gap": 0.1}, {"step": 1, "dr/gap": 0.3}, {"step": 2, "eval_dr/gap": 0.2})) + "\n")
    assert stage_gap(tmp_path) == 0.2
    log.write_text(json.dumps({"step": 1, "dr/gap": 0.3}) + "\n")
    assert stage_gap(tmp_path) == 0.3 and stage_gap(tmp_path / "none") is None
    entry = {"name": "G1", "kind": "generator", "status": "trained", "checkpoint": "out/G1", "gap": 0.3,
             "parents": {"model": "g0", "sets_from": "p0"}, "reward": {"disc_mean": 0.1}}
    assert stage_line(entry).endswith("(disc_mean 0.1, gap 0.3)")


@pytest.mark.slow
def test_a_policy_trains_on_a_scalar_reward_model_with_the_responses(tmp_path: Path, tiny_lm: Path,
                                                                    nectar_dir: Path):
    """Table 2's "w/ responses" baseline end to end: `reward: scalar-rm:...,with_responses=true` names a (tiny)
    sequence-classification RM; the job identifies it as a parent, trains a step on its scores and records it."""
    pytest.importorskip("trl")
    from tiny_models import build_tiny_rm

    rm = build_tiny_rm(tmp_path / "rm")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({
        "model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "p"), "reward": f"scalar-rm:model=hf:{rm},"
        "with_responses=true", "data": {"limit": 2, "policy_rules": {"max_prompt_chars": 300}},
        "grpo": {"num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 8,
                 "learning_rate": 1e-3, "epochs": 1, "report_to": []}}))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "policy", "--config", str(config),
                           "--data-dir", str(nectar_dir)], capture_output=True, text=True, timeout=900, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((tmp_path / "p" / "dr_manifest.json").read_text())
    assert manifest["parents"]["reward_model"]["spec"] == f"hf:{rm}" and "generator" not in manifest["parents"]
    assert manifest["steps"] == {"max_steps": 1, "epochs": 1.0, "prompts_per_step": 2.0, "rows": 2}
    rewards = manifest["reward_history"][0]
    assert rewards["unscored_verify"] == 0 and rewards["reward_std"] is not None
