"""Policy tables end to end: `harness run table2` with a policy and a judge behind a loopback OpenAI-compatible
server, on the real benchmark files (WildBench's tasks written here: its task set is Hub-only). The numbers are
recomputed in the test from the records' answers and the server's judging rules; reruns make no call; `harness
compare` refuses runs judged by different judges."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.loopback import chat_completion, json_response, serve_in_thread

pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")

ROW = "Native Qwen3-8B"
_ARENA_A = "<|The Start of Assistant A's Answer|>\n"
_ARENA_B = "<|The Start of Assistant B's Answer|>\n"


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def good(prompt: str) -> bool:
    """Whether the scripted policy writes a GOOD answer to `prompt` (by a hash: about half of them)."""
    return hashlib.sha256(prompt.encode()).digest()[0] % 2 == 0


def unanswerable(criterion: str) -> bool:
    """Criteria the scripted judge never scores (its answer has no score, even when re-asked)."""
    return hashlib.sha256(criterion.encode()).digest()[0] % 4 == 0


class TableServer:
    """Plays the policy and the judge, telling them apart by the prompt.

    Policy: `<think>plan</think>[policy] GOOD answer` or `... plain answer` (by `good(prompt)`), and only a
    reasoning block when the prompt says `Reply with nothing`. Judges: AlpacaEval P(policy's label) 0.8 for a
    GOOD answer, else 0.3; Arena-Hard `[[B>>A]]` when the policy is B and GOOD, `[[A>B]]` when it is B and plain,
    `[[A=B]]` when it is A; WildBench 8 for GOOD, else 4; WritingBench 7 for GOOD, else 5, no score at all for an
    `unanswerable` criterion. Probes get plain answers.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.judge_texts: list[str] = []
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        with self._lock:
            self.calls += 1
        user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if "[Output M]" in first_user:
            return self._alpaca(body, first_user)
        if _ARENA_A in first_user:
            self.judge_texts.append(first_user)
            a = _between(first_user, _ARENA_A, "\n<|The End")
            b = _between(first_user, _ARENA_B, "\n<|The End")
            label = "[[A=B]]" if "[policy]" in a else "[[B>>A]]" if "GOOD" in b else "[[A>B]]"
            return json_response(chat_completion([f"My verdict: {label}"]))
        if "[Checklist]" in first_user:
            self.judge_texts.append(first_user)
            shown = _between(first_user, "[Response to grade]\n", "\n[End of response to grade]")
            score = "8" if "GOOD" in shown else "4"
            return json_response(chat_completion([json.dumps({"strengths": "s", "weaknesses": "w", "score": score})]))
        if "on a single criterion" in first_user:
            self.judge_texts.append(first_user)
            name = _between(first_user, "Name: ", "\n")
            if unanswerable(name):
                return json_response(chat_completion(["I cannot score this."]))
            score = 7 if "GOOD" in first_user else 5
            return json_response(chat_completion([json.dumps({"score": score, "reason": "as written"})]))
        if body.get("logprobs"):  # a probe
            top = [{"token": t, "logprob": math.log(0.5)} for t in ("yes", "no")]
            return json_response(chat_completion(["yes"], logprobs=[{"content": [
                {"token": "yes", "logprob": math.log(0.5), "top_logprobs": top}]}]))
        if "Reply with nothing" in user:
            return json_response(chat_completion(["<think>nothing to add</think>"]))
        quality = "GOOD" if good(user) else "plain"
        return json_response(chat_completion([f"<think>private plan</think>[policy] {quality} answer"]))

    def _alpaca(self, body: dict, text: str):
        self.judge_texts.append(text)
        policy_first = "[policy]" in _between(text, "[Output m]\n", "\n[End of Output m]")
        shown = _between(text, "[Output m]\n", "\n[End of Output m]") if policy_first else \
            _between(text, "[Output M]\n", "\n[End of Output M]")
        p_policy = 0.8 if "GOOD" in shown else 0.3
        p_m = p_policy if policy_first else 1 - p_policy
        top = [{"token": "m", "logprob": math.log(p_m)}, {"token": "M", "logprob": math.log(1 - p_m)}]
        if not body.get("logprobs"):
            return json_response(chat_completion(["m" if p_m > 0.5 else "M"]))
        return json_response(chat_completion(["m"], logprobs=[{"content": [
            {"token": "m", "logprob": math.log(p_m), "top_logprobs": top}]}]))


def _turn(role: str, content: str) -> dict:
    return {"role": role, "content": content, "language": "English", "redacted": False, "toxic": False,
            "timestamp": None}


# Two tasks in the Hub's `v2` row layout (written for this test; not WildBench data).
WILD_TASKS = [
    {"id": "a1", "session_id": "a1", "conversation_input": [_turn("user", "Sort [3, 1, 2] in Python.")],
     "references": {}, "length": 1, "checklist": ["Is the output sorted?"], "intent": "",
     "primary_tag": "Coding & Debugging", "secondary_tags": ["Math"]},
    {"id": "b2", "session_id": "b2", "conversation_input": [_turn("user", "Reply with nothing at all.")],
     "references": {}, "length": 1, "checklist": ["Is it empty?"], "intent": "",
     "primary_tag": "Creative Writing", "secondary_tags": []},
]


@pytest.fixture()
def data_dir(tmp_path: Path, shared_data: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for name in ("alpaca_eval2", "arena_hard_v2", "writingbench"):
        (root / name).symlink_to(shared_data / name)
    (root / "wildbench").mkdir()
    (root / "wildbench" / "v2.jsonl").write_text("".join(json.dumps(t) + "\n" for t in WILD_TASKS))
    return root


def _config(tmp_path: Path, url: str, *, judge: str = "openai:judge-model") -> Path:
    path = tmp_path / "table2.yaml"
    path.write_text(
        f"only_rows: ['{ROW}']\n"
        f"rows: {{'{ROW}': 'openai:policy-model'}}\n"
        f"judge: {judge}\n"
        "bench_options: {writingbench: {subset: length}}\n"
        f"backend: {{base_url: '{url}', concurrency: 8, max_attempts: 2}}\n"
    )
    return path


def _run(config: Path, out: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "harness", "run", "table2", "--config", str(config), "--limit", "2",
            "--data-dir", str(data), "--out", str(out), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def _records(out: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for line in (out / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        found.setdefault(r["benchmark"], []).append(r)
    return found


def _judged(r: dict) -> str:
    return r["trace"]["answer"].get("judged", r["trace"]["answer"]["raw"])


def test_table2_through_a_loopback_policy_and_judge(tmp_path: Path, data_dir: Path):
    from benchmarks.arena_hard_score import ArenaGame, arena_hard_score

    server = TableServer()
    with serve_in_thread(server) as url:
        out = tmp_path / "run"
        first = _run(_config(tmp_path, url), out, data_dir)
        assert first.returncode == 1, first.stderr  # the unanswerable WritingBench criteria are final failures
        calls = server.calls
        again = _run(_config(tmp_path, url), out, data_dir)
        assert server.calls == calls, "a rerun must make no model call"
        assert "backend calls: 0" in again.stdout and "(0 complete" not in again.stdout
    assert "spent (tokens as the backends report them):" in first.stdout
    assert "openai:judge-model:" in first.stdout and "openai:policy-model:" in first.stdout

    records = _records(out)
    assert {b: len(v) for b, v in records.items()} == {"alpaca_eval2": 2, "arena_hard_v2": 2, "wildbench": 2,
                                                       "writingbench": 2}
    every = [r for rs in records.values() for r in rs]
    assert all(r["kind"] == "policy" and r["evaluator"] == "openai:policy-model" for r in every)
    assert all(r["trace"]["judge"]["model"] == "openai:judge-model" for r in every)
    # Thinking is kept in the record and never shown to the judge.
    assert all("<think>" in r["trace"]["answer"]["raw"] and "<think>" not in _judged(r) for r in every)
    assert server.judge_texts and not any("private plan" in t or "<think>" in t for t in server.judge_texts)

    results = json.loads((out / "results.json").read_text())["results"][ROW]["benchmarks"]

    alpaca = records["alpaca_eval2"]
    expected = sum(0.8 if "GOOD" in _judged(r) else 0.3 for r in alpaca) / 2
    assert [r["scores"][0] for r in alpaca] == pytest.approx([1 + (0.8 if "GOOD" in _judged(r) else 0.3)
                                                               for r in alpaca])
    assert results["alpaca_eval2"]["win_rate"]["value"] == pytest.approx(expected)
    assert "lc_win_rate" not in results["alpaca_eval2"]
    assert "needs all 805 instructions" in results["alpaca_eval2"]["unavailable"]["lc_win_rate"][0]

    arena = records["arena_hard_v2"]
    for r in arena:
        game1, game2 = r["trace"]["judgment"]["games"]
        assert game1["verdict"] == ("B>>A" if "GOOD" in _judged(r) else "A>B") and game2["verdict"] == "A=B"
    games = [ArenaGame(**g) for r in arena for g in r["trace"]["judgment"]["games"]]
    upstream = arena_hard_score(games, seed=0).category("hard_prompt")
    assert results["arena_hard_v2"]["hard_prompt"]["value"] == pytest.approx(upstream.score)
    assert (results["arena_hard_v2"]["hard_prompt"]["ci_low"], results["arena_hard_v2"]["hard_prompt"]["ci_high"]) \
        == pytest.approx((upstream.lower, upstream.upper))
    battles = [([1.0] * 3 if "GOOD" in _judged(r) else [0.0]) + [0.5] for r in arena]  # game 1, then game 2
    assert upstream.win_rate == pytest.approx(sum(map(sum, battles)) / sum(map(len, battles)))

    wild = {r["item"]: r for r in records["wildbench"]}
    assert _judged(wild["wildbench:b2"]) == "" and wild["wildbench:b2"]["scores"] == [1.0]  # upstream's empty rule
    assert not wild["wildbench:b2"]["trace"]["judgment"]["judged"]
    a1 = wild["wildbench:a1"]["scores"][0]
    assert a1 == (8.0 if "GOOD" in _judged(wild["wildbench:a1"]) else 4.0)
    assert results["wildbench"]["score"]["value"] == pytest.approx(((a1 + 1) / 2 - 5) * 2 / 10)
    # Task-macro: the empty answer enters no group; a1 counts in Coding & Debugging and Math & Data Analysis.
    assert results["wildbench"]["task_macro"]["value"] == pytest.approx((a1 - 5) * 2 * (1.25 + 1.0) / 4.75 / 10)

    writing = records["writingbench"]
    scored, failed = [], 0
    for r in writing:
        names = r["trace"]["criteria"]
        want = 7.0 if "GOOD" in _judged(r) else 5.0
        assert r["scores"] == [None if unanswerable(n) else want for n in names]
        scored += [s for s in r["scores"] if s is not None]
        failed += any(s is None for s in r["scores"])
    assert failed, "the test needs an unanswerable criterion"
    cell = results["writingbench"]["overall"]
    assert cell["value"] == pytest.approx(sum(scored) / len(scored) / 10) and cell["n_failed"] == failed

    table = (out / "table.md").read_text()
    assert "| Policy | AlpacaEval 2 LC | AlpacaEval 2 WR |" in table
    assert "| *paper* | 38.5 | - | 9.0 | - | 16.4 | - | 57.8 |" in table
    assert "judge: openai:judge-model" in table
    csv_lines = (out / "table.csv").read_text().splitlines()
    assert any(line.startswith(f"{ROW},openai:policy-model,writingbench,overall,") for line in csv_lines)
    assert "\\textit{paper}" in (out / "table.tex").read_text()
    explained = subprocess.run([sys.executable, "-m", "harness", "report", str(out), "--explain", ROW, "alpaca_eval2"],
                               capture_output=True, text=True, timeout=120)
    assert explained.returncode == 0, explained.stderr
    assert "policy: openai:policy-model" in explained.stdout and "judge: openai:judge-model" in explained.stdout
    assert "lc_win_rate: no value (the length-controlled win rate needs all 805" in explained.stdout


def test_compare_refuses_runs_judged_by_different_judges(tmp_path: Path, data_dir: Path):
    server = TableServer()
    with serve_in_thread(server) as url:
        base, same, other = tmp_path / "base", tmp_path / "same", tmp_path / "other"
        for out, judge in ((base, "openai:judge-model"), (same, "openai:judge-model"), (other, "openai:judge-2")):
            done = _run(_config(tmp_path, url, judge=judge), out, data_dir, "--bench-option",
                        "writingbench.subset=length", "--seed", "0")
            assert done.returncode in (0, 1), done.stderr
    ok = subprocess.run([sys.executable, "-m", "harness", "compare", str(base), str(same)], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "no significant change" in ok.stdout and "lc_win_rate" not in ok.stdout
    refused = subprocess.run([sys.executable, "-m", "harness", "compare", str(base), str(other)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "judged by different judges (BASE openai:judge-model, CAND openai:judge-2)" in refused.stderr


def test_cli_judge_flags_and_bench_options_are_checked(tmp_path: Path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "run", *args, "--out", str(tmp_path / "x")],
                              capture_output=True, text=True, timeout=120)

    refused = run("table1", "--preset", "cpu", "--judge", "openai:gpt-4.1")
    assert refused.returncode == 2 and "--judge and its options are for policy tables" in refused.stderr
    bad = run("table2", "--preset", "cpu", "--bench-option", "subset=length")
    assert bad.returncode == 2 and "expected BENCH.KEY=VALUE" in bad.stderr
    config = tmp_path / "c.yaml"
    config.write_text("judge_settings: {alpaca_eval2: {temperature: 1.0}}\n")
    unknown = run("table2", "--preset", "cpu", "--config", str(config), "--data-dir", str(tmp_path))
    assert unknown.returncode == 2 and "judge_settings.alpaca_eval2: unknown setting(s) temperature" in unknown.stderr
    config.write_text("generation: {max_tokens: 8}\n")
    wrong_table = run("table1", "--config", str(config))
    assert wrong_table.returncode == 2 and "generation: for policy tables" in wrong_table.stderr


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_table2_cpu_preset_with_the_embedded_model_then_a_rerun_without_calls(tmp_path: Path, shared_data: Path):
    """smollm2-135m as policy and judge on the real AlpacaEval 2 and Arena-Hard v2.0 files.

    The first run takes a minute or two on an idle laptop CPU and many times that on a busy one: its bounds
    (an hour for the test, half of it for each run) only stop a hang.
    """
    config = tmp_path / "cpu.yaml"
    config.write_text(f"only_rows: ['{ROW}']\nbenchmarks: [alpaca_eval2, arena_hard_v2]\n")
    args = [sys.executable, "-m", "harness", "run", "table2", "--preset", "cpu", "--config", str(config), "--limit",
            "1", "--data-dir", str(shared_data), "--out", str(tmp_path / "run")]
    first = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert first.returncode in (0, 1), first.stderr
    assert "spent (tokens as the backends report them):" in first.stdout and "smollm2-135m:" in first.stdout
    again = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert "backend calls: 0" in again.stdout, again.stdout
    records = _records(tmp_path / "run")
    assert sorted(records) == ["alpaca_eval2", "arena_hard_v2"]
    alpaca, arena = records["alpaca_eval2"][0], records["arena_hard_v2"][0]
    assert alpaca["trace"]["judgment"]["mode"] == "logprob" and 1.0 <= alpaca["scores"][0] <= 2.0
    assert alpaca["trace"]["judge"]["settings"]["mode"] == "auto"
    # the cpu preset's Arena-Hard judge writes the label alone (constrained), so both games have a verdict
    assert all(g["verdict"] is not None for g in arena["trace"]["judgment"]["games"])
    table = (tmp_path / "run" / "table.md").read_text()
    assert "| Native Qwen3-8B |" in table and "judge: smollm2-135m" in table
