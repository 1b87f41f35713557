import asyncio
import json
from pathlib import Path

import pytest

from harness.errors import ConfigError, Failure, FailureCategory
from harness.commands.score import ResponseSet, read_sets_file, run_score
from judges.base import SetScores, StageFailure, Trace


class LengthJudge:
    """Scores by length; cannot score responses containing FAIL (recorded as a parse failure)."""

    spec = "length-judge"
    settings = {"unit": "characters"}

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    async def score_set(self, prompt, responses, *, seed):
        self.seen.append((prompt, seed))
        failures = tuple(
            StageFailure("verify", Failure(FailureCategory.PARSE, "no verdict"), response=i)
            for i, r in enumerate(responses)
            if "FAIL" in r
        )
        scores = tuple(None if "FAIL" in r else float(len(r)) for r in responses)
        return SetScores(scores, Trace(failures=failures))

    async def close(self):
        pass


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_scores_resume_and_retry_incomplete(tmp_path: Path):
    sets = [ResponseSet("a", "p", ("x", "yy")), ResponseSet("b", "q", ("FAIL", "z"))]
    out = tmp_path / "scores.jsonl"
    judge = LengthJudge()
    summary = asyncio.run(run_score(judge, sets, out, seed=3))
    assert (summary.complete, summary.with_failures, summary.failures) == (1, 1, {"parse": 1})
    lines = {x["id"]: x for x in _lines(out)}
    assert lines["a"]["scores"] == [1.0, 2.0] and lines["a"]["evaluator"] == "length-judge"
    assert lines["a"]["schema"] == "score/1" and lines["a"]["seed"] != lines["b"]["seed"]
    assert lines["b"]["scores"] == [None, 1.0] and lines["b"]["n_unscored"] == 1
    assert lines["b"]["trace"]["failures"][0] == {
        "stage": "verify",
        "response": 0,
        "item": None,
        "category": "parse",
        "message": "no verdict",
        "attempts": 1,
    }
    seeds = dict((p, s) for p, s in judge.seen)
    assert seeds["p"] != seeds["q"]  # derived per set id

    # A parse failure is final: the rerun keeps it (it would only replay the same cached output) ...
    summary = asyncio.run(run_score(judge, sets, out, seed=3))
    assert summary.skipped == 2 and summary.written == 0 and len(judge.seen) == 2
    assert summary.with_failures == 1 and summary.final_failures == 1
    # ... unless asked to redo it.
    summary = asyncio.run(run_score(judge, sets, out, seed=3, retry_failed=True))
    assert summary.skipped == 1 and [p for p, _ in judge.seen[2:]] == ["q"]  # only the failed set again
    assert judge.seen[2][1] == seeds["q"]  # same derived seed on retry
    assert [x["id"] for x in _lines(out)] == ["a", "b"]  # compacted, one line per set


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"id": 1, "prompt": "p", "responses": ["a"]}\n{"id": 2, "prompt": "p"}\n',
            r"in.jsonl:2: 'responses' must be",
        ),
        ('{"id": 1, "prompt": "p", "responses": []}\n', r"in.jsonl:1: 'responses' must be a non-empty list"),
        ('{"id": 1, "prompt": "", "responses": ["a"]}\n', r"'prompt' must be a non-empty string"),
        (
            '{"id": 1, "prompt": "p", "responses": ["a"]}\n{"id": 1, "prompt": "p", "responses": ["a"]}\n',
            "duplicate id",
        ),
        ("{oops\n", r"in.jsonl:1: invalid JSON"),
    ],
)
def test_malformed_sets_file(tmp_path: Path, text: str, message: str):
    path = tmp_path / "in.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_sets_file(path)


def test_score_cli_end_to_end_with_a_pairwise_judge(tmp_path: Path):
    """`harness score` as a user runs it, against a loopback server whose judge always answers [[A]]."""
    import os
    import subprocess
    import sys

    from harness.loopback import openai_handler, serve_in_thread

    sets = tmp_path / "sets.jsonl"
    sets.write_text(json.dumps({"id": "q1", "prompt": "Name a prime.", "responses": ["7", "8"]}) + "\n")
    out = tmp_path / "scores.jsonl"
    env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    with serve_in_thread(openai_handler(text="Both fine. [[A]]")) as url:
        args = [
            sys.executable,
            "-m",
            "harness",
            "score",
            "--evaluator",
            "pairwise-judge:model=openai:judge",
            "--base-url",
            url,
            "--input",
            str(sets),
            "--out",
            str(out),
        ]
        first = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        again = subprocess.run(
            args + ["--out", str(tmp_path / "again.jsonl")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert first.returncode == 0, first.stderr
    assert "1 sets (1 complete, 0 with failures, 0 already done)" in first.stdout
    assert "backend calls: 2" in first.stdout
    [line] = _lines(out)
    # The judge prefers whichever response it sees first: the two orders disagree, so the pair is a tie.
    assert line["evaluator"] == "pairwise-judge:model=openai:judge" and line["scores"] == [0.5, 0.5]
    assert "backend calls: 0, cache hits: 2" in again.stdout
