"""Does training learn: the held-out evaluation (`--eval-every`) logs the reward's own numbers to `train_log.jsonl`
and TensorBoard and draws on a random stream of its own (an evaluated run trains exactly as an unevaluated one, and
the base weights replay any step's stream); the policy's held-out rubrics are made once and reused; the shuffled
control permutes each batch's rewards; the paired bootstrap and the pre-registered rule compute as documented; each
run of a comparison is a child process whose peak memory is recorded; the curves are drawn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")
torch = pytest.importorskip("torch")

from judges.rubric import RubricParseError, aggregate, disc_reward, parse_rubric  # noqa: E402
from training.rewards import GeneratorReward, anchor_order_accuracy, binary_verdicts  # noqa: E402

ROWS = [{"prompt": [{"role": "user", "content": f"rubric {i}"}], "row": f"r{i}", "question": f"Question {i}?",
         "responses": [f"answer {i} one", f"answer {i} two", f"answer {i} three"],
         "anchor": [f"best {i}", f"middle {i}", f"worst {i}"]} for i in range(4)]


def _heldout() -> list[dict]:
    return [{**row, "row": f"h{i}", "question": f"Held {i}?", "split": "heldout"} for i, row in enumerate(ROWS[:2])]


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LM taught to write short rubrics (its samples mostly parse under the grammar), built once for
    the module (the tests train copies of it into their own dirs)."""
    from test_grpo_smoke import TEACH, teach
    from tiny_models import CORPUS, build_tiny_lm

    model = build_tiny_lm(tmp_path_factory.mktemp("taught") / "base", context=1024, byte_level=True,
                          corpus=(*CORPUS, *TEACH))
    teach(model, TEACH, steps=120)
    return model


def _fit(model: Path, out: Path, *, learning_rate: float = 5e-2, eval_every: int | None = 1,
         report_to: tuple[str, ...] = ()) -> GeneratorReward:
    from test_grpo_smoke import ScriptedVerifier
    from test_rollouts import SMALL

    from training.fit import fit
    from training.grpo import GRPOSettings

    reward = GeneratorReward(ScriptedVerifier(), group_size=2, mode="logprob")
    settings = GRPOSettings(num_generations=2, per_device_train_batch_size=4, max_completion_length=128,
                            learning_rate=learning_rate, max_steps=2, seed=0, report_to=list(report_to))
    fit(str(model), settings, ROWS, reward, out, heldout=_heldout() if eval_every else None, eval_every=eval_every,
        rollouts=SMALL)
    return reward


def _recompute(call: dict) -> tuple[list[float], list[float]]:
    """disc (on the verdicts P(yes) > 0.5) and anchor order accuracy of a call's parsed rubrics, from the
    scripted verifier's P(yes)."""
    from test_grpo_smoke import p_yes

    disc, order = [], []
    for text, responses, anchor in zip(call["texts"], call["responses"], call["anchor"]):
        try:
            rubric = parse_rubric(text)
        except RubricParseError:
            continue
        disc.append(disc_reward(rubric.weights, binary_verdicts(np.array([[p_yes(r, c) for r in responses]
                                                                          for c in rubric.criteria]))))
        scores = aggregate(rubric.weights, np.array([[p_yes(r, c) for r in anchor] for c in rubric.criteria]))
        order.append(anchor_order_accuracy(scores))
    return disc, order


def test_heldout_numbers_are_the_rewards_own_and_reach_the_log_and_tensorboard(tmp_path: Path, taught: Path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "g1"
    reward = _fit(taught, out, report_to=("tensorboard",))
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    evaluated = [line for line in lines if "eval_dr/parse_rate" in line]
    assert [line["step"] for line in evaluated] == [0, 1, 2]  # step 0, every step, and the end once
    held = [call for call in reward.calls if call["split"] == "heldout"]
    assert len(held) == 3 and len(reward.eval_history) == 3 and len(reward.history) == 2
    for line, call in zip(evaluated, held):
        disc, order = _recompute(call)
        assert line["eval_dr/parse_rate"] == pytest.approx(len(disc) / len(call["texts"]))
        if disc:
            assert line["eval_dr/disc_mean"] == pytest.approx(np.mean(disc), rel=1e-5)
            assert line["eval_dr/anchor_pair_acc"] == pytest.approx(np.mean(order), rel=1e-5)
    assert any("eval_dr/disc_mean" in line for line in evaluated)
    events = list(out.glob("runs/*/events.out.tfevents.*"))
    assert len(events) == 1
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    for tag in ("train/dr/disc_mean", "train/dr/parse_rate", "train/reward", "eval/dr/disc_mean",
                "eval/dr/anchor_pair_acc", "eval/dr/parse_rate"):
        assert tag in scalars, f"{tag} not in the TensorBoard events ({sorted(scalars)})"
    written = {e.step: e.value for e in accumulator.Scalars("eval/dr/disc_mean")}
    assert written == pytest.approx({line["step"]: line["eval_dr/disc_mean"] for line in evaluated
                                     if "eval_dr/disc_mean" in line}, rel=1e-6)
    assert (out / "training_curves.png").exists() is False  # fit trains; the job draws (test below)


def test_evaluation_leaves_training_unchanged(tmp_path: Path, taught: Path):
    from safetensors.torch import load_file

    _fit(taught, tmp_path / "evaluated")
    _fit(taught, tmp_path / "plain", eval_every=None)
    weights = {name: load_file(str(tmp_path / name / "model.safetensors")) for name in ("evaluated", "plain")}
    base = load_file(str(taught / "model.safetensors"))
    assert all(torch.equal(weights["evaluated"][k], weights["plain"][k]) for k in base)
    assert not all(torch.equal(weights["plain"][k], base[k]) for k in base)


def test_train_plot_draws_the_curves_of_a_run(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 0.1 * s, "reward": s / 10, "dr/disc_mean": 0.1 + s / 100,
                    "dr/parse_rate": 1.0}) + "\n" for s in range(1, 5))
        + json.dumps({"step": 4, "eval_dr/disc_mean": 0.2}) + "\n")
    done = subprocess.run([sys.executable, "-m", "harness", "train", "plot", str(run)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    png = run / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"curves: {png}" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "harness", "train", "plot", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no training log (train_log.jsonl) there" in missing.stderr


@pytest.mark.parametrize(("content", "message"), [
    (b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": "\xff\xfe"}\n', ":2: not UTF-8 text"),
    (b'{"step": 1, "loss": 0.5}\n[1, 2]\n', ":2: a log line is a JSON object, not [1, 2]"),
    (b'{"step": 1, "loss": 0.5}\n"loss"\n', ':2: a log line is a JSON object, not "loss"'),
    (b'{"loss": 0.5}\n', ":1: a log line holds its step, an integer >= 0 (found None)"),
    (b'{"step": "two", "loss": 0.5}\n', ":1: a log line holds its step, an integer >= 0 (found 'two')"),
    (b'{"step": 1, "loss": 0.5}\n{"step": 2\n', ":2: invalid JSON"),
])
def test_train_plot_refuses_a_malformed_log_in_one_line(tmp_path: Path, content: bytes, message: str):
    (tmp_path / "train_log.jsonl").write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "harness", "train", "plot", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"error: {tmp_path / 'train_log.jsonl'}{message}") and done.stderr.count("\n") == 1
    assert not (tmp_path / "training_curves.png").exists()


# The new design: fixed held-out rubrics, the shuffled control, the base weights' stream, the paired rule.

POLICY_ROWS = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "row": f"r{i}",
                "question": f"Say something {i}."} for i in range(4)]


def _policy_heldout() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Tell me about {i}."}], "row": f"h{i}",
             "question": f"Tell me about {i}.", "split": "heldout"} for i in range(2)]


class _State:
    def __init__(self, step: int) -> None:
        self.global_step = step


def _counting_evaluator():
    """A dynamic rubric evaluator over the scripted verifier, counting the frozen generator's rubric requests."""
    from test_grpo_smoke import ScriptedVerifier

    from judges.dynamic import RubricEvaluator

    class Counting(ScriptedVerifier):
        def __init__(self) -> None:
            super().__init__()
            self.rubric_requests = 0

        async def generate(self, requests):
            """RUBRIC, except for a prompt asking about "Q1?": no rubric at all."""
            from harness.backends.base import Completion, Usage

            self.rubric_requests += len(requests)
            found = await super().generate(requests)
            return [Completion(("no rubric",), Usage(1, 1)) if "Q1?" in repr(r) else c for r, c in zip(requests, found)]

    scripted = Counting()
    return scripted, RubricEvaluator("dynamic-rubric:generator=scripted", generator=scripted, verifier=scripted,
                                     dynamic=True, mode="logprob")


def test_the_heldout_rubrics_are_generated_once_stored_and_reused(tmp_path: Path):
    """The first held-out evaluation generates one rubric per prompt and stores it; later evaluations, and a new
    reward over the same dir (a resumed run, a control), only verify against it; a prompt whose rubric did not
    parse then stays unscored (counted), never gets one from later completions; a training batch still gets a
    rubric per group; every evaluation writes one line per prompt with its mean score."""
    import asyncio

    from test_grpo_smoke import RUBRIC, p_yes

    from training.heldout import read_eval_scores
    from training.rewards import PolicyReward

    scripted, evaluator = _counting_evaluator()
    reward = PolicyReward(evaluator, group_size=2, eval_group_size=3, heldout_dir=tmp_path)
    rows, questions = ["h0"] * 3 + ["h1"] * 3 + ["h2"] * 3, ["Q0?"] * 3 + ["Q1?"] * 3 + ["Q2?"] * 3
    texts = [f"answer {i}" for i in range(9)]
    for step in (0, 2, 4):
        asyncio.run(reward([None] * 9, [t + f" at {step}" for t in texts], question=questions, row=rows,
                           split=["heldout"] * 9, trainer_state=_State(step)))
    assert scripted.rubric_requests == 4  # at step 0: one per held-out prompt, and Q1's retry
    stored = [json.loads(line) for line in (tmp_path / "heldout_rubrics.jsonl").read_text().splitlines()]
    assert [(line["row"], line["step"]) for line in stored] == [("h0", 0), ("h2", 0)]
    rubric = parse_rubric(RUBRIC)
    for step, call in zip((0, 2, 4), reward.calls):
        expected = [float(aggregate(rubric.weights, np.array([[p_yes(t, c)] for c in rubric.criteria]))[0])
                    for t in call["texts"]]
        assert call["rewards"] == pytest.approx(expected[:3] + [None] * 3 + expected[6:])
    assert [h["unscored_parse"] for h in reward.eval_history] == [3.0, 3.0, 3.0]
    scores = read_eval_scores(tmp_path / "eval_scores.jsonl")
    assert sorted(scores) == [0, 2, 4] and set(scores[2]) == {"h0", "h1", "h2"} and scores[2]["h1"] is None
    assert scores[2]["h2"] == pytest.approx(np.mean(reward.calls[1]["rewards"][6:]))
    again = PolicyReward(evaluator, group_size=2, eval_group_size=3, heldout_dir=tmp_path)
    asyncio.run(again([None] * 9, texts, question=questions, row=rows, split=["heldout"] * 9,
                      trainer_state=_State(6)))
    assert scripted.rubric_requests == 4 and again.fixed.generated == 0
    asyncio.run(again([None] * 4, texts[:4], question=["T?"] * 4, row=["t0", "t0", "t1", "t1"],
                      trainer_state=_State(7)))
    assert scripted.rubric_requests == 6  # training groups: a rubric each, as before
    assert len((tmp_path / "heldout_rubrics.jsonl").read_text().splitlines()) == 2


def test_the_shuffled_control_permutes_each_batchs_rewards(tmp_path: Path):
    """Training batches: the rewards permuted within the batch (the same multiset, another order, seeded by the
    step); held-out batches untouched; `shuffle_rewards` in the config is what makes a job's reward shuffled."""
    import asyncio

    from training.fit import make_reward
    from training.grpo import TrainConfig
    from training.rewards import ShuffledReward

    class Fixed:
        __name__ = "fixed"
        scale_rewards = "group"
        history: list = []

        async def __call__(self, prompts, completions, **kwargs):
            return [float(i) for i in range(len(completions))] + [None]

    shuffled = ShuffledReward(Fixed(), seed=3)
    batch = [None] * 11
    first = asyncio.run(shuffled(batch, batch, trainer_state=_State(1)))
    assert first != list(range(11)) + [None] and sorted(first, key=str) == sorted(list(range(11)) + [None], key=str)
    assert first == [([float(i) for i in range(11)] + [None])[j] for j in shuffled.permutations[0]]
    assert asyncio.run(shuffled(batch, batch, trainer_state=_State(1))) == first  # seeded by the step
    assert asyncio.run(shuffled(batch, batch, trainer_state=_State(2))) != first
    held = asyncio.run(shuffled(batch, batch, split=["heldout"] * 11, trainer_state=_State(2)))
    assert held == [float(i) for i in range(11)] + [None] and len(shuffled.permutations) == 3
    assert shuffled.scale_rewards == "group" and shuffled.history is Fixed.history and shuffled.__name__ == "fixed"

    class Pool:
        def get(self, spec, *, overrides=None):
            from test_grpo_smoke import ScriptedVerifier

            return ScriptedVerifier()

    config = TrainConfig(model="m", output_dir=tmp_path, generator="scripted", verifier="scripted")
    assert not isinstance(make_reward("policy", config, Pool()), ShuffledReward)
    control = make_reward("policy", config.model_copy(update={"shuffle_rewards": True}), Pool())
    assert isinstance(control, ShuffledReward) and control.seed == config.grpo.seed


def test_the_base_weights_replay_a_runs_evaluation_stream(tmp_path: Path, taught: Path):
    """`evaluate_at` on the starting weights at the steps a run evaluated: at step 0 its per-prompt scores are the
    run's own (the same samples: the stream depends on the weights and the step only); the fixed rubrics are the
    run's, verified again without a new one."""
    import shutil

    from test_grpo_smoke import _settings

    from training.fit import evaluate_at, fit
    from training.heldout import read_eval_scores
    from training.rewards import PolicyReward

    scripted, evaluator = _counting_evaluator()
    settings = _settings(max_completion_length=12, max_steps=2, learning_rate=5e-1)
    run = tmp_path / "run"
    reward = PolicyReward(evaluator, group_size=2, heldout_dir=run)
    fit(str(taught), settings, POLICY_ROWS, reward, run, heldout=_policy_heldout(), eval_every=1)
    trained = read_eval_scores(run / "eval_scores.jsonl")
    assert sorted(trained) == [0, 1, 2] and scripted.rubric_requests == 2 + 2 * 2  # 2 held-out, 2 per train step
    base = tmp_path / "base"
    base.mkdir()
    shutil.copyfile(run / "heldout_rubrics.jsonl", base / "heldout_rubrics.jsonl")
    again = PolicyReward(evaluator, group_size=2, heldout_dir=base)
    evaluate_at(str(taught), settings, POLICY_ROWS, again, base, heldout=_policy_heldout(), steps=[0, 2],
                eval_every=1)
    replayed = read_eval_scores(base / "eval_scores.jsonl")
    assert sorted(replayed) == [0, 2] and replayed[0] == trained[0]
    assert again.calls[0]["texts"] == [c for c in reward.calls if c["split"] == "heldout"][0]["texts"]
    assert scripted.rubric_requests == 6 and again.fixed.generated == 0
    log = [json.loads(line) for line in (base / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log if "eval_dr/reward_mean" in line] == [0, 2]


def test_the_paired_bootstrap_against_a_hand_computation():
    from training.learning import paired_bootstrap

    # Two prompts, d = 1 and 3: a resampled mean is 1, 2 or 3 with chances 1/4, 1/2, 1/4, so the 2.5% and 97.5%
    # quantiles of many resamples are 1 and 3.
    assert paired_bootstrap([1.0, 3.0], rounds=4000) == (2.0, 1.0, 3.0)
    assert paired_bootstrap([0.25]) == (0.25, 0.25, 0.25)
    d = np.array([0.3, -0.1, 0.2, 0.05, 0.4, -0.05, 0.1])
    rng = np.random.default_rng(7)
    means = [float(np.mean([d[rng.integers(0, len(d))] for _ in range(len(d))])) for _ in range(500)]
    mean, low, high = paired_bootstrap(d, rounds=500, seed=7)
    assert mean == pytest.approx(d.mean()) and (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    with pytest.raises(ValueError):
        paired_bootstrap([])


def _scores(path: Path, by_step: dict[int, dict[str, float | None]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "eval_scores.jsonl").write_text("".join(
        json.dumps({"step": step, "row": row, "score": score, "n": 4, "n_unscored": 0 if score is not None else 4})
        + "\n" for step, rows in by_step.items() for row, score in rows.items()))
    return path


def test_the_rule_pairs_each_prompts_gain_against_the_shuffled_controls(tmp_path: Path):
    from training.learning import lines, paired_bootstrap, summarise

    rows = [f"h{i}" for i in range(6)]
    base = {t: {r: 0.5 + 0.01 * i + 0.001 * t for i, r in enumerate(rows)} for t in (0, 2, 4)}
    lift = [0.10, 0.12, 0.08, 0.11, 0.09, 0.10]
    dirs = {}
    for seed in (0, 1):
        trained = {0: base[0], 2: {r: base[2][r] + lift[i] / 2 for i, r in enumerate(rows)},
                   4: {r: base[4][r] + lift[i] + 0.01 * seed for i, r in enumerate(rows)}}
        shuffled = {0: base[0], 2: base[2], 4: {r: base[4][r] + (0.01 if i % 2 else -0.01) for i, r in enumerate(rows)}}
        dirs[("trained", seed)] = _scores(tmp_path / f"seed{seed}", trained)
        dirs[("shuffled", seed)] = _scores(tmp_path / f"seed{seed}-shuffled", shuffled)
        dirs[("base", seed)] = _scores(tmp_path / f"seed{seed}-base", base)
    (tmp_path / "seed0" / "train_log.jsonl").write_text("".join(
        json.dumps({"step": s, "dr/length_corr": c}) + "\n" for s, c in ((1, 0.2), (2, 0.4))))
    memory = {"runs": {"seed0": 900.0}, "parent_while_running": 90.0, "parent_peak": 150.0, "largest_run": 900.0,
              "comparison": 990.0, "comparison_over_largest_run": 1.1}
    summary = summarise("policy", dirs, learning_rate=1e-5, memory=memory)
    for seed in (0, 1):
        d = [lift[i] + 0.01 * seed - (0.01 if i % 2 else -0.01) for i in range(6)]
        p = summary["paired"][str(seed)]
        assert p["differences"] == pytest.approx(dict(zip(rows, d)))
        assert (p["mean"], p["low"], p["high"]) == pytest.approx(paired_bootstrap(d, seed=seed))
        assert p["n_prompts"] == 6 and p["n_dropped"] == 0 and p["end_step"] == 4
        assert p["gain"]["mean"] == pytest.approx(np.mean(lift) + 0.01 * seed)
    assert summary["verdict"]["learned"] is True
    assert summary["curves"]["base"]["mean"] == pytest.approx([np.mean(list(base[t].values())) for t in (0, 2, 4)])
    assert summary["length_corr"]["trained"]["0"] == {"mean": pytest.approx(0.3), "last": 0.4, "steps": 2}
    assert "verdict: learned" in lines(summary)[-1] and "comparison at most 990 MiB (1.10 x" in lines(summary)[-2]
    # A seed whose trained run gains no more than its control: not learned.
    _scores(tmp_path / "seed1", {0: base[0], 4: {r: base[4][r] + (0.01 if i % 2 else -0.01)
                                                 for i, r in enumerate(rows)}})
    assert summarise("policy", dirs, learning_rate=1e-5)["verdict"]["learned"] is False
    # No shuffled control, or no prompt scored in all four numbers: the verdict stays open, saying why.
    alone = {k: v for k, v in dirs.items() if k[0] != "shuffled"}
    v = summarise("policy", alone, learning_rate=1e-5)["verdict"]
    assert v["learned"] is None and "seed 0: no shuffled control (--control shuffled)" in v["why"]
    _scores(tmp_path / "seed1", {0: base[0], 4: {r: None for r in rows}})
    v = summarise("policy", dirs, learning_rate=1e-5)["verdict"]
    assert v == {"learned": None, "why": "seed 1: no held-out prompt was scored in all of trained, shuffled and base"}


def test_power_per_seed_and_for_every_seed_against_the_normal_arithmetic():
    """The minimum detectable effect at 80% power: per seed (1.96 + 0.8416) SE; every seed passing at once needs
    each seed at sqrt(0.8) for two seeds of one SE, so the all-seeds effect is (1.96 + z(sqrt 0.8)) SE."""
    from statistics import NormalDist

    from training.learning import power

    d = [0.1, -0.1, 0.3, -0.3]  # SD sqrt(0.2 / 3), n = 4
    se = float(np.std(d, ddof=1)) / 2
    found = power({"0": {"differences": dict(enumerate(d))}, "1": {"differences": dict(enumerate(d))}})
    z = NormalDist().inv_cdf(0.975)
    assert found["per_seed"]["0"]["mde"] == pytest.approx((z + NormalDist().inv_cdf(0.8)) * se)
    assert found["all_seeds"] == pytest.approx((z + NormalDist().inv_cdf(0.8 ** 0.5)) * se, rel=1e-6)
    assert found["per_seed_power_at_all_seeds_mde"]["1"] == pytest.approx(0.8 ** 0.5)
    assert power({"0": {"why": "no pairs"}})["all_seeds"] is None


def test_the_verdict_stays_open_when_the_arms_ran_different_code():
    from training.learning import verdict

    paired = {"0": {"low": 0.1}}
    same = {"trained seed 0": {"commit": "a" * 40, "dirty": False}, "base seed 0": {"commit": "a" * 40, "dirty": False}}
    assert verdict(paired, code=same)["learned"] is True
    other = {**same, "shuffled seed 0": {"commit": "b" * 40, "dirty": False}}
    v = verdict(paired, code=other)
    assert v["learned"] is None and "the arms ran different code" in v["why"] and "bbbbbbbbbbbb" in v["why"]


def _allocate(mib: int, path: str) -> None:
    """Touch `mib` MiB and write this process's id to `path` (a child's target)."""
    import os

    block = np.ones(mib * 1024 * 1024 // 8)
    Path(path).write_text(f"{os.getpid()} {block.sum():.0f}")


def _refuse() -> None:
    from harness.errors import ConfigError

    raise ConfigError("data.heldout: too few rows")


def test_each_run_is_a_child_process_whose_memory_goes_with_it(tmp_path: Path):
    """`in_child` runs its target in another process and returns that process's peak RSS; the memory it touched
    is not this process's; a ConfigError in the child is one here, with its message."""
    import os
    import resource

    from harness.errors import ConfigError
    from training.learning import in_child

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = in_child(_allocate, 300, str(tmp_path / "pid"))
    pid = int((tmp_path / "pid").read_text().split()[0])
    assert pid != os.getpid() and peak >= 300
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 < before + 100
    with pytest.raises(ConfigError, match="^data.heldout: too few rows$"):
        in_child(_refuse)


@pytest.mark.slow
def test_the_learning_command_trains_seeds_and_shuffled_controls_and_draws_the_comparison(
        tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    """`harness train policy --eval-every 1 --seeds 2 --control shuffled` on policy-cpu.yaml's settings scaled down,
    the tiny model in every role (real backends, real Nectar rows): per seed a trained run, a shuffled run and the
    base weights' evaluation of the later steps (step 0's lines are the trained run's), each in a child process;
    one rubric file per seed shared by the three; at step 0 the trained and shuffled runs score the same samples;
    learning.json holds the rule's numbers, the length correlation and the memory."""
    import yaml

    from training.heldout import read_eval_scores

    config = yaml.safe_load(Path("training/configs/policy-cpu.yaml").read_text())
    # logprob verdicts (P(yes) from one forward pass): the random model's written verdicts often fail to parse.
    config.update(model=f"hf:{tiny_lm}", generator=f"hf:{tiny_lm}", verifier=f"hf:{tiny_lm}",
                  output_dir=str(tmp_path / "learn"), verify_mode="logprob")
    config["data"].update(limit=2, heldout=2)
    config["grpo"].update(num_generations=2, per_device_train_batch_size=4, max_completion_length=12,
                          learning_rate=1e-3, epochs=None, max_steps=2, report_to=[],
                          extra={"num_generations_eval": 2})
    path = tmp_path / "learn.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "policy", "--config", str(path),
                           "--data-dir", str(nectar_dir), "--eval-every", "1", "--seeds", "2", "--control",
                           "shuffled"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = tmp_path / "learn"
    names = ["seed0", "seed0-base", "seed0-shuffled", "seed1", "seed1-base", "seed1-shuffled"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == names
    summary = json.loads((out / "learning.json").read_text())
    for seed in (0, 1):
        rubrics = {(out / f"seed{seed}{arm}" / "heldout_rubrics.jsonl").read_text() for arm in ("", "-shuffled",
                                                                                                  "-base")}
        assert len(rubrics) == 1 and len(rubrics.pop().splitlines()) <= 2
        manifest = json.loads((out / f"seed{seed}-shuffled" / "dr_manifest.json").read_text())
        assert manifest["settings"]["shuffle_rewards"] is True and manifest["settings"]["grpo"]["seed"] == seed
        p = summary["paired"][str(seed)]
        assert p["end_step"] == 2 and p["n_prompts"] + p["n_dropped"] == 2
    for seed in (0, 1):  # step 0: the same weights on the same stream, scored on the same rubrics
        found = {arm: read_eval_scores(out / f"seed{seed}{arm}" / "eval_scores.jsonl")
                 for arm in ("", "-shuffled", "-base")}
        assert all(sorted(steps) == [0, 1, 2] for steps in found.values())
        assert found["-base"][0] == found[""][0]
        for arm in ("-shuffled",):
            assert set(found[arm][0]) == set(found[""][0])
            for row, score in found[""][0].items():
                if score is not None and found[arm][0][row] is not None:  # batching may move a float's last digits
                    assert found[arm][0][row] == pytest.approx(score, abs=1e-3)
    assert summary["verdict"]["learned"] in (True, False, None)
    rss = summary["peak_rss_mib"]
    assert sorted(rss["runs"]) == names and all(v > 50 for v in rss["runs"].values())
    # The parent imports neither torch nor TRL: beside a run it holds a fraction of one.
    assert rss["parent_while_running"] < 0.5 * rss["largest_run"]
    assert rss["comparison"] <= rss["largest_run"] + rss["parent_while_running"] + 1e-6
    assert set(summary["length_corr"]) == {"trained", "shuffled"}
    assert (out / "learning.png").read_bytes()[:4] == b"\x89PNG"
    assert "peak RSS" in done.stdout and "verdict:" in done.stdout
    # The same command again keeps every finished run, and reports no memory for runs it did not train.
    again = subprocess.run(done.args, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("finished before; kept") == 4 and again.stdout.count("evaluation; kept") == 2
    rerun = json.loads((out / "learning.json").read_text())
    assert rerun["peak_rss_mib"]["runs"] == {} and "peak RSS" not in again.stdout
    assert rerun["paired"] == summary["paired"]


@pytest.mark.slow
def test_a_rule_rewarded_comparison_with_an_lr0_arm_replays_the_base_weights_prompt_by_prompt(
        tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    """The positive control's machinery, scaled down: a `rule` reward (no model call), `--control shuffled,lr0` and
    `data.eval_train`. The lr0 run trains with its weights unmoved, so its every evaluation (held-out and the
    training prompts) equals the base arm's on the same stream, prompt by prompt; every arm records the code it ran
    (one version); the training prompts' pairs, the power and the clipped share are in learning.json."""
    import yaml

    from training.heldout import read_eval_scores

    config = {"model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "learn"), "reward": "rule:contains=e",
              "data": {"limit": 4, "heldout": 2, "eval_train": 2, "policy_rules": {"max_prompt_chars": 300}},
              "grpo": {"num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 8,
                       "learning_rate": 1e-3, "max_steps": 2, "report_to": [], "extra": {"num_generations_eval": 2}}}
    path = tmp_path / "learn.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "policy", "--config", str(path), "--data-dir",
                           str(nectar_dir), "--eval-every", "1", "--control", "shuffled,lr0"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = tmp_path / "learn"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["seed0", "seed0-base", "seed0-lr0",
                                                                   "seed0-shuffled"]
    for split in ("heldout", "seen"):
        lr0 = read_eval_scores(out / "seed0-lr0" / "eval_scores.jsonl", split=split)
        base = read_eval_scores(out / "seed0-base" / "eval_scores.jsonl", split=split)
        trained = read_eval_scores(out / "seed0" / "eval_scores.jsonl", split=split)
        assert sorted(lr0) == sorted(base) == sorted(trained) == [0, 1, 2]
        assert lr0 == base and all(len(rows) == 2 for rows in base.values())
        assert all(v is not None for rows in lr0.values() for v in rows.values())  # a rule scores every answer
    manifest = json.loads((out / "seed0-lr0" / "dr_manifest.json").read_text())
    assert manifest["settings"]["grpo"]["learning_rate"] == 0.0
    summary = json.loads((out / "learning.json").read_text())
    assert summary["replay"]["0"]["equal"] is True and summary["replay"]["0"]["compared"] == 12
    assert len({json.dumps(v, sort_keys=True) for v in summary["code"].values()}) == 1
    assert sorted(summary["code"]) == ["base seed 0", "lr0 seed 0", "shuffled seed 0", "trained seed 0"]
    assert summary["paired_seen"]["0"]["n_prompts"] == 2 and "mde" in summary["power"]["per_seed"]["0"]
    assert summary["clipped"]["trained"]["0"]["steps"] == 2
    assert set(summary["curves_seen"]) == {"trained", "shuffled", "lr0", "base"}
    log = [json.loads(line) for line in (out / "seed0" / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log if "eval_seen/dr/reward_mean" in line] == [0, 1, 2]
    assert "lr0 run vs base weights: 12 of 12 prompt scores equal" in done.stdout


@pytest.mark.slow
def test_the_generators_comparison_scores_each_heldout_row_by_its_rubrics_discriminability(
        tmp_path: Path, taught: Path, nectar_dir: Path):
    """`harness train generator --eval-every 1 --seeds 1 --control shuffled` on the taught tiny model: a row's held-out
    score is the mean discriminability reward of its rubrics (as the log's `eval_dr/disc_mean` over the rows); the
    base evaluation reads the trained run's sets and evaluates the later steps' streams."""
    from training.heldout import read_eval_scores

    config = tmp_path / "learn.yaml"
    config.write_text(json.dumps({
        "model": f"hf:{taught}", "output_dir": str(tmp_path / "learn"), "verifier": f"hf:{taught}",
        "verify_mode": "logprob", "objective": "disc",
        "data": {"limit": 2, "heldout": 2, "generator_rules": {"max_prompt_chars": 300, "min_useful": 2},
                 "sets": {"policy": f"hf:{taught}", "set_size": 2, "max_tokens": 8}},
        "grpo": {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 192,
                 "learning_rate": 1e-3, "max_steps": 2, "report_to": []}}))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "generator", "--config", str(config),
                           "--data-dir", str(nectar_dir), "--eval-every", "1", "--control", "shuffled"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = tmp_path / "learn"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["seed0", "seed0-base", "seed0-shuffled"]
    trained = read_eval_scores(out / "seed0" / "eval_scores.jsonl")
    log = [json.loads(line) for line in (out / "seed0" / "train_log.jsonl").read_text().splitlines()]
    assert sorted(trained) == [0, 1, 2] and all(len(rows) == 2 for rows in trained.values())
    base = read_eval_scores(out / "seed0-base" / "eval_scores.jsonl")
    assert sorted(base) == [0, 1, 2] and base[0] == trained[0]  # step 0: the trained run's own lines
    shuffled = read_eval_scores(out / "seed0-shuffled" / "eval_scores.jsonl")
    assert set(shuffled[0]) == set(trained[0])
    for line in log:
        if "eval_dr/disc_mean" in line and all(v is not None for v in trained[line["step"]].values()):
            n = [json.loads(x) for x in (out / "seed0" / "eval_scores.jsonl").read_text().splitlines()
                 if json.loads(x)["step"] == line["step"]]
            weighted = sum(x["score"] * (x["n"] - x["n_unscored"]) for x in n) / sum(x["n"] - x["n_unscored"]
                                                                                    for x in n)
            assert line["eval_dr/disc_mean"] == pytest.approx(weighted, rel=1e-5)
    summary = json.loads((out / "learning.json").read_text())
    assert summary["kind"] == "generator" and set(summary["curves"]) <= {"trained", "shuffled", "base"}
    assert "verdict:" in done.stdout


def test_control_takes_shuffled_and_lr0_and_nothing_else(tmp_path: Path, nectar_dir: Path):
    """`--control` names its arms: `shuffled` plans a shuffled run per seed, `shuffled,lr0` an lr0 run too (the dry
    run lists them); lr0 alone, or any other value, is one error line before anything loads."""
    argv = [sys.executable, "-m", "harness", "train", "policy", "--config", "training/configs/policy-cpu-learn.yaml",
            "--data-dir", str(nectar_dir), "--output-dir", str(tmp_path / "out"), "--eval-every", "12", "--dry-run"]
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    planned = subprocess.run([*argv, "--seeds", "2", "--control", "shuffled"], capture_output=True, text=True,
                             timeout=300, env=env)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert (f"shuffled seed 1 -> {tmp_path / 'out' / 'seed1-shuffled'}" in planned.stdout
            and "then the base weights evaluated per seed" in planned.stdout)
    both = subprocess.run([*argv, "--control", "shuffled,lr0"], capture_output=True, text=True, timeout=300, env=env)
    assert both.returncode == 0, both.stderr[-2000:]
    assert f"lr0 seed 0 -> {tmp_path / 'out' / 'seed0-lr0'}" in both.stdout
    refused = subprocess.run([*argv, "--control", "lr0"], capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and "write --control shuffled,lr0" in refused.stderr
    refused = subprocess.run([*argv, "--control", "drift"], capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: --control drift: expected shuffled, lr0 or both, comma-separated")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_noise_pilot_scores_two_streams_of_the_base_weights_on_one_set_of_rubrics(tmp_path: Path,
                                                                                       tiny_lm: Path,
                                                                                       nectar_dir: Path):
    """`harness train policy --noise-pilot`: the base weights on two steps' held-out streams, one set of fixed
    rubrics (made at the first), the per-prompt differences' interval printed and in noise.json."""
    import os

    import yaml

    from training.heldout import read_eval_scores
    from training.learning import paired_bootstrap

    config = {"model": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}", "verifier": f"hf:{tiny_lm}",
              "verify_mode": "logprob", "output_dir": str(tmp_path / "out"),
              "data": {"limit": 1, "heldout": 3, "policy_rules": {"max_prompt_chars": 300}},
              "grpo": {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 8,
                       "report_to": [], "extra": {"num_generations_eval": 2}}}
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "harness", "train", "policy", "--config", str(tmp_path / "pilot.yaml"),
            "--data-dir", str(nectar_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    refused = subprocess.run([*argv, "--noise-pilot", "--seeds", "2"], capture_output=True, text=True, timeout=300,
                             env=env)
    assert refused.returncode == 2 and "--noise-pilot evaluates the base weights alone" in refused.stderr
    done = subprocess.run([*argv, "--noise-pilot"], capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    pilot = tmp_path / "out" / "noise-pilot"
    found = json.loads((pilot / "noise.json").read_text())
    scores = read_eval_scores(pilot / "eval_scores.jsonl")
    assert sorted(scores) == [0, 1] and found["n_prompts"] + found["n_dropped"] == 3
    d = [scores[1][r] - s for r, s in scores[0].items() if s is not None and scores[1][r] is not None]
    if d:
        assert (found["mean"], found["low"], found["high"]) == pytest.approx(paired_bootstrap(d))
        assert f"per-prompt difference mean {found['mean']:+.4f}" in done.stdout
    rubrics = (pilot / "heldout_rubrics.jsonl").read_text().splitlines()
    assert all(json.loads(line)["step"] == 0 for line in rubrics)
    assert f"over {found['n_prompts']} prompts" in done.stdout and str(pilot / "noise.json") in done.stdout
