"""GRPO smoke tests on CPU: a tiny random causal LM (built from a config here) trains 2 steps as DR-Generator and 2
as DR-Policy with a scripted verifier; the loss is finite, every trainable tensor moves, and the logged reward
components equal values recomputed here from the completions (a group holds an unscorable completion)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")
torch = pytest.importorskip("torch")

from harness.backends.base import BaseBackend, Completion, LogprobResult, Usage  # noqa: E402
from judges.rubric import aggregate, anchor_reward, disc_reward, parse_rubric  # noqa: E402
from training.rewards import GeneratorReward, PolicyReward, binary_verdicts, group_standardise  # noqa: E402

RUBRIC = '[{"criterion": "Is it clear?", "weight": 2}, {"criterion": "Is it brief?", "weight": 3}]'
# Rubric-shaped texts the tiny model is taught first, so that its samples are often rubrics (some are not: those
# are the unscorable completions the test needs).
TEACH = [
    '[{"criterion": "Is it clear?", "weight": 2}]',
    '[{"criterion": "Is it brief?", "weight": 5}]',
    '[{"criterion": "Is it polite?", "weight": 1}, {"criterion": "Is it clear?", "weight": 4}]',
    '[{"criterion": "Is it correct?", "weight": 3}]',
]


def p_yes(response: str, criterion: str) -> float:
    """The scripted verifier's P(yes) for one (response, criterion): a hash, in 0.05 .. 0.95."""
    digest = hashlib.sha256(f"{response}\x00{criterion}".encode()).digest()
    return 0.05 + 0.9 * digest[0] / 255


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class ScriptedVerifier(BaseBackend):
    """Answers logprob verifications by `p_yes`, and rubric requests (the frozen generator's) with `RUBRIC`."""

    kind = "scripted"
    model = "scripted-verifier"

    def __init__(self) -> None:
        self.logprob_requests = 0

    async def generate(self, requests):
        return [Completion((RUBRIC,), Usage(10, 10)) for _ in requests]

    async def next_token_logprobs(self, requests, candidates):
        out = []
        for request in requests:
            self.logprob_requests += 1
            branches = []
            for context in request.contexts():
                text = context[-1].content
                p = p_yes(_between(text, "[Response]\n", "\n[End of Response]"),
                          _between(text, "\nCriterion: ", "\n"))
                found = {"Yes": math.log(p), "No": math.log(1 - p)}
                branches.append({c: found.get(c, -math.inf) for c in candidates})
            out.append(LogprobResult({}, branches=tuple(branches), usage=Usage(10, 0)))
        return out


def teach(path: Path, texts: list[str], steps: int = 200) -> None:
    """A few teacher-forced steps on `texts` as assistant turns, saved back into `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    batch = [tok.apply_chat_template([{"role": "user", "content": "rubric"}, {"role": "assistant", "content": t}],
                                     tokenize=False) for t in texts]
    enc = tok(batch, return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _settings(**change):
    from training.grpo import GRPOSettings

    values = dict(num_generations=2, per_device_train_batch_size=4, max_completion_length=24, learning_rate=5e-2,
                  max_steps=2, temperature=1.0, seed=0, report_to=[])
    return GRPOSettings(**{**values, **change})


def _losses(log: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in log.read_text().splitlines() if "loss" in json.loads(line)]


def test_generator_trains_two_steps_and_its_logged_rewards_recompute(tmp_path: Path):
    from tiny_models import CORPUS, build_tiny_lm

    from training.fit import fit

    model = build_tiny_lm(tmp_path / "g0", context=512, corpus=(*CORPUS, *TEACH))
    teach(model, TEACH)
    before = _tensors(model)
    rows = [{"prompt": [{"role": "user", "content": "rubric"}], "row": f"r{i}", "question": f"Question {i}?",
             "responses": [f"answer {i} one", f"answer {i} two", f"answer {i} three"],
             "anchor": [f"best {i}", f"middle {i}", f"worst {i}"]} for i in range(4)]
    verifier = ScriptedVerifier()
    reward = GeneratorReward(verifier, group_size=8, lam=1.0, mode="logprob")
    log = fit(str(model), _settings(num_generations=8, per_device_train_batch_size=16, max_completion_length=40),
              rows, reward, tmp_path / "g1").log

    losses = _losses(log)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    after = _tensors(tmp_path / "g1")
    unchanged = [name for name, t in before.items() if torch.equal(t, after[name])]
    assert not unchanged, f"parameters that did not move: {unchanged}"
    assert (tmp_path / "g1" / "tokenizer_config.json").is_file()

    # Recompute every logged component from the completions the reward saw.
    saw_none = False
    for call, stats in zip(reward.calls, reward.history):
        disc, anchor = [], []
        for text, question, responses, ranked in zip(call["texts"], call["question"], call["responses"],
                                                     call["anchor"]):
            try:
                rubric = parse_rubric(text)
            except ValueError:
                disc.append(None)
                anchor.append(None)
                continue
            on_set = np.array([[p_yes(r, c) for r in responses] for c in rubric.criteria])
            on_anchor = np.array([[p_yes(r, c) for r in ranked] for c in rubric.criteria])
            disc.append(disc_reward(rubric.weights, binary_verdicts(on_set)))  # logprob: R_disc on P(yes) > 0.5
            anchor.append(anchor_reward(aggregate(rubric.weights, on_anchor)))
        saw_none |= None in disc
        z_disc, z_anchor = group_standardise(disc, 8), group_standardise(anchor, 8)
        expected = [None if d is None else d + a for d, a in zip(z_disc, z_anchor)]
        assert call["rewards"] == pytest.approx(expected)
        found = [d for d in disc if d is not None]
        if found:
            assert stats["disc_mean"] == pytest.approx(np.mean(found))
        assert stats["unscored_parse"] == disc.count(None)
    assert saw_none, "the test needs an unparsable rubric among the samples"
    assert verifier.logprob_requests > 0
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert any("dr/reward_seconds" in line and "step_time" in line for line in logged)
    # The reward is the paper's advantage already: TRL scales it by nothing more.
    assert torch.load(tmp_path / "g1" / "training_args.bin", weights_only=False).scale_rewards == "none"


def test_policy_trains_two_steps_on_the_frozen_generators_rubric_scores(tmp_path: Path):
    from tiny_models import build_tiny_lm

    from judges.dynamic import RubricEvaluator
    from training.fit import fit

    model = build_tiny_lm(tmp_path / "p0", context=512)
    before = _tensors(model)
    scripted = ScriptedVerifier()
    evaluator = RubricEvaluator("dynamic-rubric:generator=scripted", generator=scripted, verifier=scripted,
                                dynamic=True, mode="logprob")
    reward = PolicyReward(evaluator, group_size=2)
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "row": f"r{i}",
             "question": f"Say something {i}."} for i in range(4)]
    log = fit(str(model), _settings(max_completion_length=12), rows, reward, tmp_path / "p1").log
    assert all(math.isfinite(x) for x in _losses(log))
    after = _tensors(tmp_path / "p1")
    assert not [name for name, t in before.items() if torch.equal(t, after[name])]
    rubric = parse_rubric(RUBRIC)
    for call in reward.calls:
        for start in range(0, len(call["texts"]), 2):
            group = call["texts"][start:start + 2]
            verdicts = np.array([[p_yes(r, c) for r in group] for c in rubric.criteria])
            assert call["rewards"][start:start + 2] == pytest.approx(list(aggregate(rubric.weights, verdicts)))
    # GRPO as the paper cites it: the score centred and divided by its group's standard deviation.
    assert torch.load(tmp_path / "p1" / "training_args.bin", weights_only=False).scale_rewards == "group"


def test_one_epoch_covers_every_row_once_whatever_the_batch(tmp_path: Path):
    """`grpo.epochs: 1`: the steps follow from the rows, the group size and the batch, and the reward sees every
    row's group exactly once (4 rows, 2 prompts a step: 2 steps; 1 prompt a step: 4 steps)."""
    from tiny_models import build_tiny_lm

    from training.fit import fit

    model = build_tiny_lm(tmp_path / "p0", context=512)
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "row": f"r{i}",
             "question": f"Say something {i}."} for i in range(4)]
    for batch, steps in ((4, 2), (2, 4)):
        evaluator = RecordingEvaluator()
        reward = PolicyReward(evaluator, group_size=2)
        settings = _settings(max_steps=None, epochs=1, per_device_train_batch_size=batch, max_completion_length=4,
                             learning_rate=1e-6)
        fitted = fit(str(model), settings, rows, reward, tmp_path / f"p{batch}")
        assert (fitted.steps.max_steps, fitted.steps.epochs) == (steps, 1.0)
        assert sorted(evaluator.prompts) == [f"Say something {i}." for i in range(4)]


class RecordingEvaluator:
    """Scores every completion 0 or 1 by its parity of length; records each group's prompt."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def score_set(self, prompt, responses, *, seed):
        from judges.base import SetScores, Trace

        self.prompts.append(prompt)
        return SetScores(tuple(float(len(r) % 2) for r in responses), Trace())


def test_the_paper_combination_against_trls_normalize_then_sum():
    """Our reward z(disc) + z(anchor) is the paper's advantage with TRL's `scale_rewards="none"`; TRL's own
    `normalize_then_sum` standardises the sum once more over the batch (rescaling every group's advantages by one
    batch-wide factor), which this shows on a fixed reward matrix."""
    disc = [0.1, 0.2, 0.05, 0.25, 0.2, 0.2]
    anchor = [-1.0, -0.5, -2.0, -0.1, -0.3, -0.9]
    ours = np.array([d + a for d, a in zip(group_standardise(disc, 2), group_standardise(anchor, 2))])
    # TRL 1.16 `normalize_then_sum`, line for line on a (B, 2) reward matrix.
    grouped = torch.tensor([disc, anchor]).T.reshape(-1, 2, 2)
    mean_k = grouped.mean(dim=1, keepdim=True)
    std_k = grouped.std(dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).reshape(-1, 2)
    summed = reward_k.sum(dim=1)
    trl = ((summed - summed.mean()) / (summed.std() + 1e-4)).numpy()
    assert np.allclose(summed.numpy(), ours, atol=1e-5)  # before TRL's batch step the two agree
    assert not np.allclose(trl, ours, atol=1e-3)  # after it they do not ...
    assert np.allclose(trl, ours / (summed.std().item() + 1e-4), atol=1e-5)  # ... by one batch-wide factor
    # TRL's sum_then_normalize with scale_rewards="none" (what we train with) leaves ours unchanged:
    centred = ours.reshape(-1, 2) - ours.reshape(-1, 2).mean(axis=1, keepdims=True)
    assert np.allclose(centred.ravel(), ours, atol=1e-9)


@pytest.mark.slow
def test_coevolve_two_rounds_with_stale_controls_on_tiny_models(tmp_path: Path, nectar_dir: Path):
    """Real models end to end (tiny random ones, the generator's rubrics decoded under the rubric schema): G1, P1,
    G2, P2 and the stale G2~, P2~ land in coevolve.json with their parents, each a loadable checkpoint."""
    import subprocess
    import sys

    from tiny_models import build_tiny_lm

    base = build_tiny_lm(tmp_path / "base", context=4096, byte_level=True)
    config = tmp_path / "co.yaml"
    tiny = {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 16, "max_steps": 1,
            "learning_rate": 1e-3}
    config.write_text(json.dumps({
        "policy": f"hf:{base}", "generator": f"hf:{base}", "verifier": f"hf:{base}", "output_dir": str(tmp_path / "co"),
        "stale_controls": True, "gen_max_tokens": 96, "set_size": 2, "set_max_tokens": 12,
        "data": {"generator_limit": 2, "policy_limit": 3,  # each kind of stage keeps its own number of rows
                 "generator_rules": {"max_prompt_chars": 300, "min_useful": 2},
                 "policy_rules": {"max_prompt_chars": 300}},
        # A generator's rollouts decode under the rubric grammar, whose smallest budget is 43 tokens.
        "generator_grpo": {**tiny, "max_completion_length": 44}, "policy_grpo": tiny,
    }))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "coevolve", "--config", str(config), "--rounds",
                           "2", "--data-dir", str(nectar_dir)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    co = tmp_path / "co"
    # Each stage is printed as it ends: what it trained, from what, and where it is.
    assert f"G1         trained generator from hf:{base} on the sets of hf:{base} -> {co / 'G1'}" in done.stdout
    assert f"P2-stale   trained policy from hf:{co / 'P1'} with the rubrics of hf:{co / 'G1'} -> {co / 'P2-stale'}" \
        in done.stdout
    manifest = json.loads((tmp_path / "co" / "coevolve.json").read_text())
    stages = {s["name"]: s for s in manifest["stages"]}
    assert list(stages) == ["G1", "P1", "G2", "G2-stale", "P2", "P2-stale"]
    assert stages["G1"]["parents"] == {"model": f"hf:{base}", "sets_from": f"hf:{base}"}
    assert stages["P1"]["parents"] == {"model": f"hf:{base}", "generator": f"hf:{co / 'G1'}"}
    assert stages["G2"]["parents"] == {"model": f"hf:{co / 'G1'}", "sets_from": f"hf:{co / 'P1'}"}
    assert stages["G2-stale"]["parents"] == {"model": f"hf:{co / 'G1'}", "sets_from": f"hf:{base}"}
    assert stages["P2"]["parents"] == {"model": f"hf:{co / 'P1'}", "generator": f"hf:{co / 'G2'}"}
    assert stages["P2-stale"]["parents"] == {"model": f"hf:{co / 'P1'}", "generator": f"hf:{co / 'G1'}"}
    for name in stages:
        checkpoint = json.loads((co / name / "dr_manifest.json").read_text())
        assert (co / name / "model.safetensors").is_file() and (co / name / "tokenizer_config.json").is_file()
        assert checkpoint["data"]["rows"] == (2 if name.startswith("G") else 3)
        assert len(checkpoint["data"]["fingerprint"]) == 16
    assert json.loads((co / "G2" / "dr_manifest.json").read_text())["parents"]["policy"]["spec"] == f"hf:{co / 'P1'}"
    # A rerun finds every stage done, bound to the same settings, and trains nothing.
    written = {name: (co / name / "model.safetensors").read_bytes() for name in stages}
    again = subprocess.run([sys.executable, "-m", "harness", "train", "coevolve", "--config", str(config),
                            "--data-dir", str(nectar_dir)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "G2-stale   kept" in again.stdout
    assert [s["status"] for s in json.loads((co / "coevolve.json").read_text())["stages"]] == ["kept"] * 6
    assert {name: (co / name / "model.safetensors").read_bytes() for name in stages} == written


@pytest.mark.slow
def test_one_policy_step_with_smollm2_then_harness_generate_loads_the_checkpoint(tmp_path: Path, nectar_dir: Path):
    import subprocess
    import sys

    out = tmp_path / "p1"
    done = subprocess.run([sys.executable, "-m", "harness", "train", "policy", "--config",
                           "training/configs/policy-cpu.yaml", "--data-dir", str(nectar_dir), "--output-dir", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "dr_manifest.json").read_text())
    assert manifest["kind"] == "policy" and manifest["parents"]["generator"]["spec"] == "smollm2-135m"
    assert manifest["data"]["filter"]["kept"] == 2 and len(manifest["reward_history"]) == 1
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any(math.isfinite(line.get("loss", math.nan)) for line in log)
    assert len(list(out.glob("runs/*/events.out.tfevents.*"))) == 1  # the shipped configs report to TensorBoard
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Name a colour."}) + "\n")
    gen = subprocess.run([sys.executable, "-m", "harness", "generate", "--model", f"hf:{out}", "--prompts",
                          str(prompts), "--max-tokens", "8", "--out", str(tmp_path / "g.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr[-2000:]
    record = json.loads((tmp_path / "g.jsonl").read_text().splitlines()[0])
    assert record["text"] and record["error"] is None


@pytest.mark.slow
def test_the_cpu_generator_configs_rollouts_parse(tmp_path: Path, nectar_dir: Path):
    """`generator-cpu.yaml` as shipped: SmolLM2's rubrics decode under the rubric grammar, so they parse (free text
    within the same 96 tokens: none did); the parse rate is logged with the step."""
    import subprocess
    import sys

    out = tmp_path / "g1"
    done = subprocess.run([sys.executable, "-m", "harness", "train", "generator", "--config",
                           "training/configs/generator-cpu.yaml", "--data-dir", str(nectar_dir), "--output-dir",
                           str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()
             if "dr/parse_rate" in json.loads(line)]
    assert steps and all(line["dr/parse_rate"] >= 0.95 for line in steps)
    assert all(line["dr/unscored_parse"] == 0 for line in steps)
    assert (out / "training_curves.png").is_file()
    assert len(list(out.glob("runs/*/events.out.tfevents.*"))) == 1  # the shipped configs report to TensorBoard
