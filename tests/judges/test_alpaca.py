"""AlpacaEval 2 metrics by alpaca_eval's own functions: the published leaderboard from the shipped annotations, and
the length-controlled GLM on a seeded stand-in for its Hub file (the real one is not reachable offline)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from harness.errors import ConfigError

pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")

from judges.alpaca import alpaca_metrics, check_alignment, length_controlled  # noqa: E402


@pytest.fixture(scope="module")
def alpaca_dir(shared_data: Path) -> Path:
    return shared_data / "alpaca_eval2"


@pytest.fixture(scope="module")
def instructions(alpaca_dir: Path) -> list[str]:
    rows = json.loads((alpaca_dir / "reference_gpt4_1106_preview_model_outputs.json").read_text())
    return [r["instruction"] for r in rows]


def _annotations(alpaca_dir: Path, model: str) -> list[dict]:
    path = alpaca_dir / "annotations" / f"{model}__weighted_alpaca_eval_gpt4_turbo.json"
    return json.loads(path.read_text())


def _leaderboard(alpaca_dir: Path) -> dict[str, dict[str, str]]:
    path = alpaca_dir / "leaderboards" / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
    with path.open() as f:
        return {row[""]: row for row in csv.DictReader(f)}


@pytest.mark.parametrize("model", ["gpt-3.5-turbo-1106", "alpaca-7b"])
def test_the_shipped_annotations_give_the_leaderboard(alpaca_dir: Path, model: str):
    ours = alpaca_metrics(_annotations(alpaca_dir, model))
    published = _leaderboard(alpaca_dir)[model]
    for field in ("win_rate", "standard_error", "discrete_win_rate"):
        assert ours[field] == pytest.approx(float(published[field]), rel=1e-9), field
    for field in ("n_wins", "n_wins_base", "n_draws", "n_total", "avg_length"):
        assert ours[field] == float(published[field]), field
    if model == "gpt-3.5-turbo-1106":  # the printed digits
        assert (round(ours["win_rate"], 3), round(ours["standard_error"], 3)) == (9.178, 0.890)
        assert (ours["n_wins"], ours["n_draws"]) == (64, 4)
    else:
        assert round(ours["win_rate"], 4) == 2.5915


def test_bad_annotations_are_refused():
    with pytest.raises(ConfigError, match="lacks output_2"):
        alpaca_metrics([{"instruction": "x", "output_1": "a", "generator_1": "r", "generator_2": "m",
                         "preference": 1.0}])
    row = {"instruction": "x", "output_1": "a", "output_2": "b", "generator_1": "r", "generator_2": "m"}
    with pytest.raises(ConfigError, match="preference 3 is not in"):
        alpaca_metrics([{**row, "preference": 3}])


def _gamed_frame(path: Path, n: int, seed: int = 0) -> Path:
    """A stand-in for `df_gamed.csv` with its columns: two gamed baselines x n instructions, seeded."""
    rng = random.Random(seed)
    difficulty = [rng.gauss(0, 1) for _ in range(n)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "index", "instruction_difficulty", "not_gamed_baseline", "preference", "std_delta_len"])
        for model, sign in (("gamed_verbose", 1), ("gamed_concise", -1)):
            for i in range(n):
                delta = sign * abs(rng.gauss(1, 0.5))
                w.writerow([model, i, difficulty[i], False, min(1.0, max(0.0, 0.5 - 0.2 * delta + rng.gauss(0, .1))),
                            delta])
    return path


def test_length_control_joins_by_the_reference_order(alpaca_dir: Path, instructions: list[str], tmp_path: Path):
    gamed = _gamed_frame(tmp_path / "df_gamed.csv", len(instructions))
    rows = _annotations(alpaca_dir, "gpt-3.5-turbo-1106")
    first = length_controlled(rows, instructions, gamed_csv=gamed)
    assert first["glm"] == "length_controlled_v1" and 0 < first["length_controlled_winrate"] < 100
    assert first["lc_standard_error"] > 0
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    again = length_controlled(shuffled, instructions, gamed_csv=gamed)  # same rows, another order: same GLM
    assert again["length_controlled_winrate"] == pytest.approx(first["length_controlled_winrate"], abs=1e-9)
    assert check_alignment(shuffled, instructions)[:3] == [instructions.index(r["instruction"]) for r in shuffled[:3]]


def test_length_control_refuses_misaligned_annotations(alpaca_dir: Path, instructions: list[str], tmp_path: Path):
    rows = _annotations(alpaca_dir, "alpaca-7b")
    with pytest.raises(ConfigError, match="1 missing"):
        length_controlled(rows[1:], instructions, gamed_csv=tmp_path / "unused.csv")
    with pytest.raises(ConfigError, match="1 repeated"):
        length_controlled(rows[1:] + rows[1:2], instructions, gamed_csv=tmp_path / "unused.csv")


def test_length_control_offline_says_what_it_needs(alpaca_dir: Path, instructions: list[str],
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing to fall back on
    with pytest.raises(ConfigError, match="needs df_gamed.csv from the Hugging Face dataset tatsu-lab/alpaca_eval"):
        length_controlled(_annotations(alpaca_dir, "alpaca-7b"), instructions)
