"""Learning, shown: the held-out evaluation (`--eval-every`) logs the reward's own numbers to `train_log.jsonl` and
TensorBoard, draws on a random stream of its own (an evaluated run trains exactly as an unevaluated one), a control
run (learning rate 0) moves nothing, the comparison's verdict is computed as documented, and the curves are drawn."""

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


def test_evaluation_leaves_training_unchanged_and_a_control_moves_nothing(tmp_path: Path, taught: Path):
    from safetensors.torch import load_file

    _fit(taught, tmp_path / "evaluated")
    _fit(taught, tmp_path / "plain", eval_every=None)
    _fit(taught, tmp_path / "control", learning_rate=0.0)
    weights = {name: load_file(str(tmp_path / name / "model.safetensors"))
               for name in ("evaluated", "plain", "control")}
    base = load_file(str(taught / "model.safetensors"))
    assert all(torch.equal(weights["evaluated"][k], weights["plain"][k]) for k in base)
    assert all(torch.equal(weights["control"][k], base[k]) for k in base)
    assert not all(torch.equal(weights["plain"][k], base[k]) for k in base)


def _log(path: Path, steps: list[int], values: list[float], key: str = "eval_dr/disc_mean") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, key: v}) + "\n" for s, v in zip(steps, values)))
    return path


def test_the_verdict_compares_each_trained_rise_with_the_controls_spread(tmp_path: Path):
    from training.learning import lines, summarise

    logs = {("trained", 0): _log(tmp_path / "t0" / "l.jsonl", [0, 2, 4], [0.10, 0.14, 0.20]),
            ("trained", 1): _log(tmp_path / "t1" / "l.jsonl", [0, 2, 4], [0.12, 0.15, 0.18]),
            ("control", 0): _log(tmp_path / "c0" / "l.jsonl", [0, 2, 4], [0.10, 0.13, 0.09]),
            ("control", 1): _log(tmp_path / "c1" / "l.jsonl", [0, 2, 4], [0.12, 0.11, 0.14])}
    summary = summarise("generator", logs, learning_rate={"trained": 1e-5, "control": 0.0})
    trained = summary["metrics"]["disc_mean"]["trained"]
    assert trained["steps"] == [0, 2, 4] and trained["mean"] == pytest.approx([0.11, 0.145, 0.19])
    assert trained["min"] == pytest.approx([0.10, 0.14, 0.18]) and trained["max"] == pytest.approx([0.12, 0.15, 0.20])
    v = summary["verdict"]
    assert v["trained_rise"] == pytest.approx({"0": 0.10, "1": 0.06})
    assert v["control_spread"] == pytest.approx(0.03)  # control seed 0 at step 2: 0.13 - 0.10
    assert v["control_rise"] == pytest.approx({"0": -0.01, "1": 0.02})
    assert v["end_seed_spread"] == pytest.approx(0.02) and v["rises"] is True
    assert summary["metrics"]["anchor_pair_acc"] == {}
    assert "rises beyond the control" in lines(summary)[-1]
    logs[("trained", 1)] = _log(tmp_path / "t1" / "l.jsonl", [0, 2, 4], [0.12, 0.15, 0.14])
    assert summarise("generator", logs, learning_rate={"trained": 1e-5, "control": 0.0})["verdict"]["rises"] is False


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


@pytest.mark.slow
def test_the_learning_command_trains_seeds_and_controls_and_draws_the_comparison(tmp_path: Path, taught: Path,
                                                                                  nectar_dir: Path):
    """`harness train generator --eval-every 1 --seeds 2 --control` on the taught tiny model (real backends): four
    checkpoints, the controls' weights the base model's, learning.json and learning.png, the numbers printed."""
    from safetensors.torch import load_file

    config = tmp_path / "learn.yaml"
    config.write_text(json.dumps({
        "model": f"hf:{taught}", "output_dir": str(tmp_path / "learn"), "verifier": f"hf:{taught}",
        "verify_mode": "logprob", "objective": "disc",
        "data": {"limit": 2, "heldout": 2, "generator_rules": {"max_prompt_chars": 300, "min_useful": 2},
                 "sets": {"policy": f"hf:{taught}", "set_size": 2, "max_tokens": 8}},
        "grpo": {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 192,
                 "learning_rate": 1e-3, "max_steps": 2, "report_to": []}}))
    done = subprocess.run([sys.executable, "-m", "harness", "train", "generator", "--config", str(config),
                           "--data-dir", str(nectar_dir), "--eval-every", "1", "--seeds", "2", "--control"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = tmp_path / "learn"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["seed0", "seed0-control", "seed1",
                                                                   "seed1-control"]
    base = load_file(str(taught / "model.safetensors"))
    for name in ("seed0-control", "seed1-control"):
        control = load_file(str(out / name / "model.safetensors"))
        assert all(torch.equal(control[k], base[k]) for k in base)
    summary = json.loads((out / "learning.json").read_text())
    assert summary["learning_rate"] == {"trained": 1e-3, "control": 0.0}
    for arm in ("trained", "control"):
        assert summary["metrics"]["disc_mean"][arm]["steps"] == [0, 1, 2]
        assert summary["metrics"]["disc_mean"][arm]["seeds"] == [0, 1]
    # Step 0: the control is the trained run before its first step, evaluated on the same samples.
    first = {arm: summary["metrics"]["disc_mean"][arm]["by_seed"] for arm in ("trained", "control")}
    assert all(first["trained"][s][0] == first["control"][s][0] for s in ("0", "1"))
    assert (out / "learning.png").read_bytes()[:4] == b"\x89PNG"
    assert "held-out disc_mean, trained" in done.stdout and "control spread" in done.stdout
    assert (out / "seed0" / "training_curves.png").is_file()


def test_a_heldout_evaluation_that_scored_nothing_is_named_in_the_verdict(tmp_path: Path):
    """Logs whose evaluations ran but parsed no rubric hold `eval_dr/parse_rate: 0.0` and the unscored counts, no
    `eval_dr/disc_mean`: the verdict says the evaluation ran and scored nothing, not that there was none."""
    from training.learning import lines, summarise

    def dead(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"step": s, "eval_dr/parse_rate": 0.0, "eval_dr/unscored_parse": 2.0,
                                            "eval_dr/unscored_verify": 0.0}) + "\n" for s in (0, 2, 4)))
        return path

    rate = {"trained": 1e-5, "control": 0.0}
    logs = {("trained", 0): dead(tmp_path / "t0" / "l.jsonl"), ("trained", 1): dead(tmp_path / "t1" / "l.jsonl"),
            ("control", 0): _log(tmp_path / "c0" / "l.jsonl", [0, 2, 4], [0.10, 0.13, 0.09])}
    summary = summarise("generator", logs, learning_rate=rate)
    why = ("the trained runs' held-out evaluation (seeds 0, 1) ran at steps 0, 2, 4 but scored nothing: parse rate "
           "0.0, 12 unscored (parse), 0 unscored (verify)")
    assert summary["verdict"] == {"rises": None, "why": why}
    assert lines(summary)[-1] == f"verdict: {why}"
    # One trained seed scored nothing: no verdict on the others alone.
    logs[("trained", 0)] = _log(tmp_path / "t0" / "l.jsonl", [0, 2, 4], [0.10, 0.14, 0.20])
    v = summarise("generator", logs, learning_rate=rate)["verdict"]
    assert v["rises"] is None and v["trained_rise"] == pytest.approx({"0": 0.10})
    assert v["why"].startswith("the trained runs' held-out evaluation (seed 1) ran at steps 0, 2, 4 but scored")
    # A control that scored nothing is named as such, not as a missing control run.
    logs[("trained", 1)] = _log(tmp_path / "t1" / "l.jsonl", [0, 2, 4], [0.12, 0.15, 0.18])
    logs[("control", 0)] = dead(tmp_path / "c0" / "l.jsonl")
    v = summarise("generator", logs, learning_rate=rate)["verdict"]
    assert v["rises"] is None and v["why"].startswith("the control runs' held-out evaluation (seed 0) ran at steps")
    # With no evaluation at all the verdict still says so.
    plain = {("trained", 0): _log(tmp_path / "p0" / "l.jsonl", [1, 2], [0.5, 0.4], key="loss")}
    assert summarise("generator", plain, learning_rate=rate)["verdict"]["why"] == \
        "no held-out evaluation in the trained runs' logs"


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
