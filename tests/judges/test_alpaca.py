"""AlpacaEval 2 metrics by alpaca_eval's own functions: the published leaderboard from the shipped annotations, and
the length-controlled GLM on a seeded stand-in for its Hub file (the real one is not reachable offline)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from alpaca_fakes import gamed_frame
from judge_fakes import judge_all_closing, loopback_judge_backend

from harness.backends.openai_backend import PROBE_QUESTION
from harness.errors import ConfigError, FailureCategory

pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")

from benchmarks.alpaca_eval2_score import alpaca_metrics, check_alignment, length_controlled  # noqa: E402


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


def test_length_control_joins_by_the_reference_order(alpaca_dir: Path, instructions: list[str], tmp_path: Path):
    gamed = gamed_frame(tmp_path / "df_gamed.csv", len(instructions))
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


# --- the judge, against a loopback OpenAI-compatible server ---


class JudgeServer:
    """A judge that prefers the output holding `GOOD` (P = 0.8 in its logprobs); `logprobs=False` makes it a
    server without logprobs that answers the label in words first where the instruction says `CHATTY` (and always
    for `HOPELESS`), and `fail_first` answers HTTP 500 to every first attempt."""

    def __init__(self, *, logprobs: bool = True, fail_first: bool = False) -> None:
        self.logprobs, self.fail_first = logprobs, fail_first
        self.bodies: list[dict] = []
        self.seen: dict[str, int] = {}

    async def __call__(self, request):
        import math as _math

        from harness.loopback import chat_completion, json_response

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        self.bodies.append(body)
        text = next(m["content"] for m in body["messages"] if m["role"] == "user")  # the comparison itself
        key = json.dumps(body, sort_keys=True)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.fail_first and self.seen[key] == 1 and text != PROBE_QUESTION:  # the judge's requests only
            return json_response({"error": {"message": "busy"}}, status=500)
        good = "m" if text.find("GOOD") < text.find("[Output M]") else "M"
        other = "M" if good == "m" else "m"
        if body.get("logprobs"):
            if not self.logprobs:
                return json_response(chat_completion([good]))  # no logprobs in the answer
            top = [{"token": good, "logprob": _math.log(0.8)}, {"token": other, "logprob": _math.log(0.2)}]
            return json_response(chat_completion([good], logprobs=[{"content": [
                {"token": good, "logprob": _math.log(0.8), "top_logprobs": top}]}]))
        if "HOPELESS" in text or ("CHATTY" in text and len(body["messages"]) == 1):
            return json_response(chat_completion([f"I would say output {good} is better"]))
        return json_response(chat_completion([good]))


def _items(alpaca_dir: Path, n: int):
    from harness.registry import lookup

    return lookup("benchmark", "alpaca_eval2").load(data_dir=alpaca_dir.parent, limit=n)


def _judge(url: str, **kwargs):
    from judges.alpaca import AlpacaJudge

    backend = loopback_judge_backend(url)
    return AlpacaJudge(backend, **kwargs), backend


def _run_judge(judge, backend, pairs, seed=0):
    return judge_all_closing(judge, backend, pairs, seed=seed)


def test_logprob_judgments_are_weighted_and_mapped_back_to_the_reference_frame(alpaca_dir: Path):
    from harness.loopback import serve_in_thread

    items = _items(alpaca_dir, 8)
    pairs = [(item, f"GOOD answer {i}") for i, item in enumerate(items)]
    server = JudgeServer()
    with serve_in_thread(server) as url:
        judge, backend = _judge(url)
        found = _run_judge(judge, backend, pairs)
    assert all(j.failure is None and j.mode == "logprob" for j in found)
    assert [j.preference for j in found] == pytest.approx([1.8] * 8)  # the policy's label had P = 0.8
    assert {j.policy_first for j in found} == {True, False}  # the order is drawn per item and mapped back
    again = _judge("http://127.0.0.1:9/v1")[0]
    assert again.settings == {"mode": "auto", "template": "ours", "structured": True, "max_tokens": 8}
    rows = [j.annotation(item, out, generator="policy", annotator="judge") for j, (item, out) in zip(found, pairs)]
    assert alpaca_metrics(rows)["win_rate"] == pytest.approx(80.0)


def test_without_logprobs_the_judge_asks_for_the_label_and_reasks_once(alpaca_dir: Path):
    from harness.loopback import serve_in_thread

    items = _items(alpaca_dir, 4)
    outputs = ["GOOD plain", "GOOD but CHATTY", "worse HOPELESS", "GOOD again"]
    server = JudgeServer(logprobs=False, fail_first=True)  # every first attempt also fails with a 500
    with serve_in_thread(server) as url:
        judge, backend = _judge(url, structured=False)
        found = _run_judge(judge, backend, list(zip(items, outputs)))
    assert [j.mode for j in found] == ["discrete"] * 4
    assert [j.preference for j in found[:2]] + [found[3].preference] == [2.0, 2.0, 2.0]
    assert len(found[1].raw["answers"]) == 2  # read on the re-ask
    hopeless = found[2]
    assert hopeless.preference is None and hopeless.failure.category is FailureCategory.PARSE
    assert hopeless.failure.attempts == 2 and "expected exactly `m` or `M`" in hopeless.failure.message
    assert "did not return logprobs" in backend.capabilities()["token logprobs"]  # found once, then discrete
    retried = [b for b in server.bodies if server.seen[json.dumps(b, sort_keys=True)] > 1]
    assert retried  # the 500s were retried by the backend, and every answer still came back


def test_identical_outputs_are_not_judged(alpaca_dir: Path):
    from harness.loopback import serve_in_thread

    (item,) = _items(alpaca_dir, 1)
    server = JudgeServer()
    with serve_in_thread(server) as url:
        judge, backend = _judge(url)
        (found,) = _run_judge(judge, backend, [(item, item.meta["reference"])])
    assert (found.preference, found.mode) == (1.5, "identical") and server.bodies == []


def test_the_upstream_template_is_read_from_the_installed_package(alpaca_dir: Path):
    from judges.alpaca import UPSTREAM_TEMPLATE, read_upstream_template, upstream_messages

    template = read_upstream_template(UPSTREAM_TEMPLATE)
    messages = upstream_messages(template, "Name a {color}.", "first {output_2} text", "second")
    assert [m.role for m in messages] == ["system", "user"]
    assert "Name a {color}." in messages[1].content and "first {output_2} text" in messages[1].content
    with pytest.raises(ConfigError, match="needs"):
        upstream_messages("<|im_start|>user\n{instruction}\n<|im_end|>", "a", "b", "c")


@pytest.mark.parametrize(("text", "label"), [("m", "m"), (" M\n", "M"), ("`m`", "m"), ("M.", "M"), ('"M"', "M")])
def test_labels_are_read_strictly(text: str, label: str):
    from judges.alpaca import parse_label

    assert parse_label(text) == label


@pytest.mark.parametrize("text", ["", "mm", "Output m", "The answer is M", "n"])
def test_other_answers_are_not_labels(text: str):
    from judges.alpaca import parse_label

    with pytest.raises(ValueError):
        parse_label(text)
