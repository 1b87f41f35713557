"""The WildBench v2 score judge against a loopback OpenAI-compatible server: prompts, re-asks, failures, the
empty and shortened outputs, the structured request, upstream's template, and the WB-Score of the judgments.

The tasks are written here in the Hub's `v2` row layout (not WildBench data: the task set is on the Hub only);
upstream's template is read from the shared data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from judge_fakes import judge_all_closing, loopback_judge_backend

from benchmarks.wildbench import to_item
from benchmarks.wildbench_score import LEADERBOARD_SCALE, TRUNCATION_MARKER, wb_result
from harness.backends.openai_backend import PROBE_QUESTION
from harness.errors import ConfigError, FailureCategory
from harness.loopback import chat_completion, json_response, serve_in_thread
from judges.wildbench import (
    EMPTY_OUTPUT_JUDGMENT,
    JUDGE_MAX_TOKENS,
    WildBenchJudge,
    checklist_markdown,
    fill_upstream_template,
    read_upstream_template,
    shorten,
)

CHECKLIST = ["Does the response answer the question asked?", "Is the code correct?"]


def _task(session: str, primary: str, secondary: list[str], *, earlier: int = 0, query: str | None = None):
    turns = []
    for t in range(earlier):
        turns += [{"role": "user", "content": f"earlier question {t}"},
                  {"role": "assistant", "content": f"earlier answer {t}"}]
    turns.append({"role": "user", "content": query or f"Please help with task {session}."})
    row = {"session_id": session, "conversation_input": turns, "checklist": CHECKLIST,
           "primary_tag": primary, "secondary_tags": secondary}
    return to_item(row, f"test row {session}")


class JudgeServer:
    """Reads the policy output's marker and answers as a judge would.

    `SCORE=N`: a JSON judgment with that score; `FENCED=N`: the same in a ```json fence (upstream's regex fallback
    reads it); `CHATTY=N`: prose first, the JSON judgment on the re-ask; `HOPELESS`: prose every time.
    `fail_first` answers HTTP 500 to the first attempt of every request body.
    """

    def __init__(self, *, fail_first: bool = False) -> None:
        self.fail_first = fail_first
        self.bodies: list[dict] = []
        self.seen: dict[str, int] = {}

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        text = body["messages"][0]["content"]
        if text == PROBE_QUESTION:
            return json_response(chat_completion(["ok"]))
        self.bodies.append(body)
        key = json.dumps(body, sort_keys=True)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.fail_first and self.seen[key] == 1:
            return json_response({"error": {"message": "busy"}}, status=500)
        reasked = len(body["messages"]) > 1
        kind, value = re.search(r"(SCORE|FENCED|CHATTY|HOPELESS)=?(\d*)", text).groups()
        judgment = json.dumps({"strengths": "Clear.", "weaknesses": "Misses an edge case.", "score": value})
        if kind == "FENCED":
            return json_response(chat_completion([f"My evaluation:\n```json\n{judgment}\n```"]))
        if kind == "HOPELESS" or (kind == "CHATTY" and not reasked):
            return json_response(chat_completion(["The response is decent; I would rate it a seven."]))
        return json_response(chat_completion([judgment]))

    def judged_outputs(self) -> list[str]:
        return [re.search(r"(SCORE|FENCED|CHATTY|HOPELESS)=?\d*", b["messages"][0]["content"]).group(0)
                for b in self.bodies]


def _judge(url: str, **kwargs):
    backend = loopback_judge_backend(url)
    return WildBenchJudge(backend, **kwargs), backend


def _run(server: JudgeServer, pairs, **kwargs):
    with serve_in_thread(server) as url:
        judge, backend = _judge(url, **kwargs)
        return judge_all_closing(judge, backend, pairs), judge


def test_scores_are_parsed_and_aggregated_to_the_hand_computed_wb_score():
    items = [
        _task("a", "Coding & Debugging", ["Reasoning"]),
        _task("b", "Math", [], earlier=1),
        _task("c", "Creative Writing", ["Editing"]),
        _task("d", "Information seeking", []),
    ]
    outputs = ["SCORE=8 code", "SCORE=6 proof", "FENCED=4 poem", "SCORE=9 facts"]
    found, judge = _run(JudgeServer(), list(zip(items, outputs)), structured=False)
    assert [j.score for j in found] == [8.0, 6.0, 4.0, 9.0]
    assert all(j.failure is None and j.judged for j in found)
    assert [j.raw["fallback"] for j in found] == [False, False, True, False]
    assert [j.shown for j in found] == outputs and judge.requests == 4
    r = wb_result([j.task_score(item) for j, item in zip(found, items, strict=True)])
    # mean 6.75 -> (6.75 - 5) * 2 = 3.5; groups (s - 5) * 2: Coding 6, P&R 6 (Reasoning), Math 2, Creative -2
    # (Creative Writing + Editing, counted once), Info 8; macro = (6*1.25 + 6*1.25 + 2*1 - 2*0.5 + 8*0.75) / 4.75
    assert r.score == pytest.approx(6.75) and r.adjusted_score == pytest.approx(3.5)
    assert r.task_categorized_scores == pytest.approx({"Creative Tasks": -2.0, "Planning & Reasoning": 6.0,
                                                       "Math & Data Analysis": 2.0,
                                                       "Information/Advice seeking": 8.0,
                                                       "Coding & Debugging": 6.0})
    assert r.task_macro_score == pytest.approx(22 / 4.75)
    assert (r.n_scored, r.n_failed) == (4, 0)
    shown = r.leaderboard()
    assert shown["WB_score"] == pytest.approx(3.5 * LEADERBOARD_SCALE) == pytest.approx(35.0)
    assert shown["WB_score.task_macro"] == pytest.approx(46.315789, abs=1e-6)
    assert shown["WB_score.Creative Tasks"] == pytest.approx(-20.0)


def test_the_prompt_holds_history_query_output_and_checklist():
    item = _task("h", "Planning", ["Reasoning"], earlier=1)
    judge = WildBenchJudge(None)  # the prompt needs no backend
    prompt = judge.prompt(item, "SCORE=7 the plan")
    assert "USER: earlier question 0\n\nASSISTANT: earlier answer 0\n\n" in prompt
    assert "Please help with task h." in prompt and "SCORE=7 the plan" in prompt
    assert checklist_markdown(CHECKLIST) == "- Does the response answer the question asked?\n- Is the code correct?\n"
    assert checklist_markdown(CHECKLIST) in prompt
    assert '"strengths"' in prompt and '"weaknesses"' in prompt and '"score"' in prompt
    assert "(none: the current query opens the conversation)" in judge.prompt(_task("s", "Math", []), "x")
    assert judge.settings == {"template": "ours", "structured": True, "max_tokens": 1024, "max_words": -1}
    assert (judge.params.temperature, judge.params.max_tokens) == (0.0, JUDGE_MAX_TOKENS)


def test_an_unparsable_answer_is_reasked_and_a_hopeless_one_is_a_parse_failure():
    items = [_task(s, "Math", []) for s in ("x", "y", "z")]
    outputs = ["CHATTY=5 answer", "HOPELESS answer", "SCORE=7 answer"]
    server = JudgeServer()
    found, judge = _run(server, list(zip(items, outputs)), structured=False)
    chatty, hopeless, plain = found
    assert chatty.score == 5.0 and chatty.failure is None and len(chatty.raw["answers"]) == 2
    reask = next(b for b in server.bodies if len(b["messages"]) == 3 and "CHATTY" in b["messages"][0]["content"])
    assert reask["messages"][1]["role"] == "assistant"
    assert reask["messages"][2]["content"].startswith("I could not read your evaluation: not JSON")
    assert hopeless.score is None and hopeless.failure.category is FailureCategory.PARSE
    assert hopeless.failure.attempts == 2 and len(hopeless.raw["answers"]) == 2
    assert plain.score == 7.0 and judge.requests == 5  # three, and two re-asks
    r = wb_result([j.task_score(item) for j, item in zip(found, items, strict=True)])
    assert (r.n_scored, r.n_failed) == (2, 1)
    assert r.score == pytest.approx(6.0) and r.task_categorized_scores == {"Math & Data Analysis": pytest.approx(2.0)}


def test_an_empty_output_is_not_sent_and_scores_1():
    item = _task("e", "Coding & Debugging", [])
    server = JudgeServer()
    (found,), judge = _run(server, [(item, "  \n ")])
    assert server.bodies == [] and judge.requests == 0
    assert (found.score, found.judged, found.failure) == (1.0, False, None)
    assert found.raw == {"answers": [], "fallback": False, "fixed": EMPTY_OUTPUT_JUDGMENT}
    r = wb_result([found.task_score(item)])
    assert r.adjusted_score == pytest.approx(-8.0) and r.task_categorized_scores == {} and r.avg_len is None


def test_a_long_output_is_shortened_with_the_marker_and_left_out_of_the_groups():
    long_query = "word " * 20 + "end"
    items = [_task("l", "Math", [], query=long_query), _task("m", "Math", []), _task("n", "Others", [])]
    outputs = ["SCORE=10 " + " ".join(f"w{i}" for i in range(20)), "SCORE=6 short answer", ""]
    server = JudgeServer()
    found, _ = _run(server, list(zip(items, outputs)), max_words=5)
    assert found[0].shown == "SCORE=10 w0 w1 w2 w3" + TRUNCATION_MARKER
    assert found[1].shown == "SCORE=6 short answer"
    sent = server.bodies[0]["messages"][0]["content"]
    assert found[0].shown in sent and "w4" not in sent
    assert "word word word word word" + TRUNCATION_MARKER in sent  # the query is cut to the same limit
    assert len(server.bodies) == 2  # the empty output was not sent
    r = wb_result([j.task_score(item) for j, item in zip(found, items, strict=True)])
    # overall: 10, 6 and the empty output's 1; groups: only the short answer (upstream skips truncated and empty)
    assert r.score == pytest.approx(17 / 3) and (r.n_scored, r.n_failed) == (3, 0)
    assert r.task_categorized_scores == {"Math & Data Analysis": pytest.approx(2.0)}
    assert r.group_n == {"Math & Data Analysis": 1} and r.avg_len == len("SCORE=6 short answer")


def test_shorten_follows_upstream():
    assert shorten("a b c", 3) == "a b c" and shorten("a b c", -1) == "a b c" and shorten("a b c", 0) == "a b c"
    assert shorten("a b c d", 2) == "a b" + TRUNCATION_MARKER
    assert shorten("a  b c", 2) == "a " + TRUNCATION_MARKER  # split on single spaces, as upstream
    assert shorten("a\nb\nc", 1) == "a\nb\nc"  # newlines do not split words upstream


def test_server_faults_are_retried_by_the_backend():
    items = [_task(s, "Reasoning", []) for s in ("f1", "f2", "f3")]
    server = JudgeServer(fail_first=True)
    found, judge = _run(server, list(zip(items, ["SCORE=3 a", "SCORE=4 b", "SCORE=5 c"])), structured=False)
    assert [j.score for j in found] == [3.0, 4.0, 5.0] and all(j.failure is None for j in found)
    assert judge.requests == 3 and len(server.bodies) == 6 and set(server.seen.values()) == {2}


def test_the_structured_constraint_is_sent():
    items = [_task("j", "Math", []), _task("k", "Math", [])]
    server = JudgeServer()
    found, _ = _run(server, list(zip(items, ["SCORE=2 a", "SCORE=9 b"])))
    assert [j.score for j in found] == [2.0, 9.0]
    for body in server.bodies:
        assert body["temperature"] == 0 and body["max_tokens"] == JUDGE_MAX_TOKENS
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "wb_score"
        schema = fmt["json_schema"]["schema"]
        assert list(schema["properties"]) == ["strengths", "weaknesses", "score"]  # the score comes last
        assert schema["properties"]["score"]["enum"] == [str(n) for n in range(1, 11)]
        assert schema["required"] == ["strengths", "weaknesses", "score"]


def _upstream_path(shared_data: Path) -> Path:
    return shared_data / "wildbench" / "eval_templates" / "eval_template.score.v2.md"


def test_the_upstream_template_is_filled_in_one_pass(shared_data: Path):
    path = _upstream_path(shared_data)
    template = read_upstream_template(path)
    item = _task("u", "Math", [], earlier=1)
    judge = WildBenchJudge(None, template=path)
    assert judge.settings["template"] == str(path)
    prompt = judge.prompt(item, "SCORE=8 answer")
    # the same text upstream's four str.replace calls build (src/eval.py:placeholder_generation, score mode)
    expected = template.replace("{$history}", item.meta["history"]).replace("{$user_query}", item.meta["user_query"])
    expected = expected.replace("{$model_output}", "SCORE=8 answer")
    expected = expected.replace("{$checklist}", "".join(f"- {c}\n" for c in CHECKLIST))
    assert prompt == expected and "{$" not in prompt
    # inserted text holding placeholders is copied verbatim, never filled again
    tricky = fill_upstream_template(template, history="USER: see {$user_query} and {$checklist}\n\n",
                                    user_query="q {$model_output}", model_output="out {$history}",
                                    checklist="- c\n")
    assert "USER: see {$user_query} and {$checklist}\n\n" in tricky
    assert "q {$model_output}" in tricky and "out {$history}" in tricky
    assert tricky.count("{$") == 4  # only the four inserted ones
    with pytest.raises(ConfigError, match="needs exactly the placeholders"):
        read_upstream_template(shared_data / "wildbench" / "eval_templates" / "eval_template.pairwise.v2.md")
    with pytest.raises(ConfigError, match="cannot read"):
        WildBenchJudge(None, template=path.with_name("missing.md"))


def test_the_upstream_template_goes_to_the_judge(shared_data: Path):
    items = [_task("v", "Editing", ["Creative Writing"])]
    server = JudgeServer()
    (found,), _ = _run(server, [(items[0], "SCORE=7 {$history} stays")], template=_upstream_path(shared_data),
                       structured=False)
    sent = server.bodies[0]["messages"][0]["content"]
    assert sent.startswith("# Instruction") and "<|begin_of_response|>\n\nSCORE=7 {$history} stays\n\n" in sent
    assert found.score == 7.0
