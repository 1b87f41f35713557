"""WritingBench's per-criterion judge against a loopback OpenAI-compatible server, on real items of the local
length subset, and its scores by hand; the answer parser on judge outputs as upstream would read them."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from judge_fakes import judge_all_closing, loopback_judge_backend

from benchmarks.writingbench_score import QueryScores, writingbench_result
from harness.backends.openai_backend import PROBE_QUESTION
from harness.errors import ConfigError, Failure, FailureCategory
from judges.writingbench import (
    SCORE_CONSTRAINT,
    WritingBenchJudge,
    WritingBenchJudgment,
    fill_upstream,
    parse_criterion_score,
    read_upstream_template,
    strip_think,
)

HOPELESS = "I'd give it a solid 7 out of 10."
_OURS = re.compile(r"\[Criterion\]\nName: (.*)\n")
_UPSTREAMS = re.compile(r"\{'name': '([^']*)'")


def _ok(score, reason: str = "fine") -> str:
    return json.dumps({"score": score, "reason": reason})


class JudgeServer:
    """Answers each criterion from `answers` (criterion name -> the first answer, then the re-ask's), found in
    our prompt (`Name: ...`) or upstream's (`{'name': '...'`); `fail_first` answers HTTP 500 to every first
    attempt of a request."""

    def __init__(self, answers: dict[str, list[str]], *, fail_first: bool = False) -> None:
        self.answers, self.fail_first = answers, fail_first
        self.bodies: list[dict] = []
        self.seen: dict[str, int] = {}

    async def __call__(self, request):
        from harness.loopback import chat_completion, json_response

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if users[0] == PROBE_QUESTION:
            return json_response(chat_completion(["ok"]))
        self.bodies.append(body)
        key = json.dumps(body, sort_keys=True)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.fail_first and self.seen[key] == 1:
            return json_response({"error": {"message": "busy"}}, status=500)
        found = _OURS.search(users[0]) or _UPSTREAMS.search(users[0])
        replies = self.answers[found.group(1)]
        return json_response(chat_completion([replies[min(len(users), len(replies)) - 1]]))


def _items(shared_data: Path, subset: str = "length"):
    from benchmarks.writingbench import WritingBench

    return WritingBench().load(data_dir=shared_data, subset=subset)


def _pick(items, *indices: int):
    by_index = {item.meta["index"]: item for item in items}
    return [by_index[i] for i in indices]


def _judge(url: str, **kwargs):
    backend = loopback_judge_backend(url)
    return WritingBenchJudge(backend, **kwargs), backend


def _run(judge, backend, pairs, seed=0):
    return judge_all_closing(judge, backend, pairs, seed=seed)


def _names(item) -> list[str]:
    return [c["name"] for c in item.meta["criteria"]]


def _queries(judgments, items):
    """The judged queries as the benchmark's scores read them (`QueryScores`)."""
    by_id = {item.id: item for item in items}
    return [QueryScores(j.item, by_id[j.item].meta["domain1"], by_id[j.item].meta["domain2"], dict(j.scores))
            for j in judgments]


def _requirement(subset, subset_c) -> tuple[list[str], dict[str, list[str]]]:
    return [item.id for item in subset], {item.id: _names(item) for item in subset_c}


# Items 23 and 24 are Academic & Engineering / Experiments, 58 is Finance & Business / User Research.
SCORES = {23: [8, 7, 6, 9, 10], 24: [5, 5, 6, 4, 5], 58: [3, 4, 2, 3, None]}
"""What the judge finally gives each criterion (None: hopeless). Overall by hand: (40 + 25 + 12) / 14 = 5.5
over the 14 scored criteria, where the mean of the query means (8, 5, 3) would be 5.33."""


@pytest.fixture(scope="module")
def scenario(shared_data: Path):
    from harness.loopback import serve_in_thread

    items = _pick(_items(shared_data), 23, 24, 58)
    answers = {}
    for item in items:
        for name, score in zip(_names(item), SCORES[item.meta["index"]]):
            answers[name] = [HOPELESS] if score is None else [_ok(score, f"{name} is {score}")]
    n24 = _names(items[1])
    answers[n24[0]] = ["Here is my evaluation:\n" + _ok(5),
                       "```json\n" + _ok(5, "read on the re-ask") + "\n```"]
    answers[n24[1]] = [_ok(11, "off the scale"), _ok(5)]
    outputs = ["<think>\nPLAN the essay first\n</think>\n\nThe essay ANSWER-23", "ANSWER-24", "ANSWER-58"]
    server = JudgeServer(answers)
    with serve_in_thread(server) as url:
        judge, backend = _judge(url, structured=False)
        found = _run(judge, backend, list(zip(items, outputs)))
    return items, found, server, judge


def test_one_call_per_criterion_and_the_response_loses_its_think_block(scenario):
    items, found, server, judge = scenario
    firsts = [b for b in server.bodies if len(b["messages"]) == 1]
    assert len(firsts) == 15 and judge.requests == 15 + 3  # 3 re-asks: unparsable, 11, hopeless
    for item in items:
        marker = f"ANSWER-{item.meta['index']}"
        mine = [b["messages"][0]["content"] for b in firsts if marker in b["messages"][0]["content"]]
        assert len(mine) == 5
        assert sorted(_OURS.search(t).group(1) for t in mine) == sorted(_names(item))
        assert all(item.messages[0].content in t for t in mine)  # the query itself
    judged_23 = [b["messages"][0]["content"] for b in firsts if "ANSWER-23" in b["messages"][0]["content"]]
    shown = "[Response]\nThe essay ANSWER-23\n[End of Response]"
    assert all("PLAN" not in t and shown in t for t in judged_23)
    assert [j.raw["think_stripped"] for j in found] == [True, False, False]
    assert {(b["temperature"], b["top_p"], b["max_tokens"]) for b in server.bodies} == {(1.0, 0.95, 2048)}
    assert len({b["seed"] for b in firsts}) == 15  # derived per (item, criterion)


def test_scores_by_name_and_the_reasks(scenario):
    items, found, server, _ = scenario
    assert [j.item for j in found] == [item.id for item in items]
    for item, j in zip(items, found):
        assert list(j.scores) == _names(item)
        assert list(j.scores.values()) == SCORES[item.meta["index"]]
    j24 = found[1]
    first, second = _names(items[1])[:2]
    assert j24.reasons[first] == "read on the re-ask" and len(j24.raw["answers"][first]) == 2
    assert "not a JSON object" in j24.raw["retries"][first]
    assert j24.raw["retries"][second] == "score must be an integer from 1 to 10, got 11"
    reask = next(b for b in server.bodies
                 if len(b["messages"]) == 3 and "off the scale" in b["messages"][1]["content"])
    assert "got 11" in reask["messages"][2]["content"] and reask["messages"][1]["role"] == "assistant"
    assert not j24.failures and j24.score == 5.0


def test_a_hopeless_answer_is_a_parse_failure_counted_and_left_out(scenario):
    items, found, _, _ = scenario
    j58 = found[2]
    name = _names(items[2])[4]
    failure = j58.failures[name]
    assert failure.category is FailureCategory.PARSE and failure.attempts == 2
    assert "not a JSON object" in failure.message
    assert j58.scores[name] is None and j58.reasons[name] is None
    assert j58.score == 3.0 and j58.failure is None  # the query keeps its 4 scored criteria
    assert len(j58.raw["answers"][name]) == 2


def test_overall_and_domain_scores_by_hand(scenario, shared_data: Path):
    items, found, _, _ = scenario
    result = writingbench_result(_queries(found, items))
    assert result.overall == pytest.approx(77 / 14) and result.overall == pytest.approx(5.5)
    assert result.overall_x10 == pytest.approx(55.0)
    assert result.domain1 == pytest.approx({"Academic & Engineering": 6.5, "Finance & Business": 3.0})
    assert list(result.domain1) == ["Academic & Engineering", "Finance & Business"]
    assert result.domain1_n == {"Academic & Engineering": 2, "Finance & Business": 1}
    assert result.domain2 == pytest.approx({"Experiments": 6.5, "User Research": 3.0})
    assert (result.n_queries, result.n_criteria, result.n_failed, result.n_queries_failed) == (3, 14, 1, 0)


def test_requirement_scores_look_criteria_up_by_name(scenario, shared_data: Path):
    items, found, _, _ = scenario
    subset, subset_c = _items(shared_data), _items(shared_data, "length_C")
    result = writingbench_result(_queries(found, items), requirements={"length": _requirement(subset, subset_c)})
    length = result.requirements["length"]
    # _C criteria: 23 -> Word_Count_and_Content_Density (9), 24 -> Structural Coherence... (5), 58 -> Length
    # and Content Relevance (the hopeless one: failed, left out).
    assert length.r_score == pytest.approx(16 / 3) and length.c_score == pytest.approx(7.0)
    counts = (length.n_queries, length.n_criteria, length.n_criteria_failed, length.n_not_judged)
    assert counts == (3, 2, 1, 219)
    row = result.to_json()
    assert row["length_R"] == pytest.approx(16 / 3) and row["length_C"] == pytest.approx(7.0)
    with pytest.raises(ConfigError, match="dimension 'tone'"):
        writingbench_result(_queries(found, items), requirements={"tone": _requirement(subset, subset_c)})


def test_failed_queries_and_bad_inputs(scenario):
    items, found, _, _ = scenario
    failure = Failure(FailureCategory.SERVER_ERROR, "busy", attempts=3)
    names = _names(items[0])
    dead = WritingBenchJudgment(items[0].id, dict.fromkeys(names), dict.fromkeys(names),
                                dict.fromkeys(names, failure))
    assert dead.score is None and dead.failure == failure
    result = writingbench_result(_queries([dead, found[2]], items))
    assert (result.n_queries, result.n_queries_failed, result.n_failed) == (1, 1, 6)
    assert result.overall == pytest.approx(3.0) and result.domain1 == {"Finance & Business": 3.0}
    assert writingbench_result([]).overall is None
    assert WritingBenchJudgment.from_json(json.loads(json.dumps(found[2].to_json()))) == found[2]
    with pytest.raises(ConfigError, match="two WritingBench judgments"):
        writingbench_result(_queries([found[0], found[0]], items))


def test_http_faults_are_retried_by_the_backend(shared_data: Path):
    from harness.loopback import serve_in_thread

    (item,) = _pick(_items(shared_data), 23)
    server = JudgeServer({name: [_ok(6)] for name in _names(item)}, fail_first=True)
    with serve_in_thread(server) as url:
        judge, backend = _judge(url, structured=False)
        (found,) = _run(judge, backend, [(item, "ANSWER")])
    assert list(found.scores.values()) == [6] * 5 and not found.failures
    assert len(server.bodies) == 10  # each request: a 500, then served
    assert len(server.seen) == 5 and all(n == 2 for n in server.seen.values())


def test_structured_requests_carry_the_json_schema(shared_data: Path):
    from harness.loopback import serve_in_thread

    (item,) = _pick(_items(shared_data), 24)
    server = JudgeServer({name: [_ok(i + 1)] for i, name in enumerate(_names(item))})
    with serve_in_thread(server) as url:
        judge, backend = _judge(url)
        (found,) = _run(judge, backend, [(item, "ANSWER")])
    assert list(found.scores.values()) == [1, 2, 3, 4, 5]
    properties = {"score": {"type": "integer", "minimum": 1, "maximum": 10}, "reason": {"type": "string"}}
    schema = {"type": "object", "additionalProperties": False, "required": ["score", "reason"],
              "properties": properties}
    assert SCORE_CONSTRAINT.schema == schema
    expected = {"type": "json_schema",
                "json_schema": {"name": "writingbench_score", "schema": schema, "strict": True}}
    assert len(server.bodies) == 5 and all(b["response_format"] == expected for b in server.bodies)
    assert judge.settings == {"template": "ours", "system": None, "structured": True, "temperature": 1.0,
                              "top_p": 0.95, "max_tokens": 2048}


def test_the_upstream_template_is_filled_as_str_format_would(shared_data: Path):
    from harness.loopback import serve_in_thread

    folder = shared_data / "writingbench" / "eval_prompts"
    system, prompt = read_upstream_template(folder)
    assert system == (folder / "evaluate_system.txt").read_text().strip()
    assert read_upstream_template(folder / "evaluate_prompt.txt") == (system, prompt)
    tricky = {"query": "Write {criteria} in {{braces}}", "response": "a {response} {",
              "criteria": "{'name': 'x'}"}
    assert fill_upstream(prompt, **tricky) == prompt.format(**tricky)  # one pass as str.format: never re-read

    (item,) = _pick(_items(shared_data), 23)
    server = JudgeServer({name: [_ok(7)] for name in _names(item)})
    with serve_in_thread(server) as url:
        judge, backend = _judge(url, template=str(folder), structured=False)
        (found,) = _run(judge, backend, [(item, "<think>x</think>\n\nANSWER {query}")])
    assert list(found.scores.values()) == [7] * 5 and judge.settings["template"] == str(folder)
    criterion = item.meta["criteria"][0]
    body = next(b for b in server.bodies if f"'name': '{criterion['name']}'" in b["messages"][1]["content"])
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == system
    want = prompt.format(query=item.messages[0].content, response="ANSWER {query}", criteria=str(criterion))
    assert body["messages"][1]["content"] == want
    assert "```{'name': 'Technical_Accuracy_and_Comprehensiveness', 'criteria_description': " in want
    assert '```json\n{\n    "score": an integer score between 1 to 10,' in want


def test_bad_upstream_templates_are_refused(tmp_path: Path):
    (tmp_path / "evaluate_system.txt").write_text("sys")
    bad = tmp_path / "evaluate_prompt.txt"
    bad.write_text("{query} {response}")
    with pytest.raises(ConfigError, match="needs"):
        read_upstream_template(bad)
    bad.write_text("{query} {response} {criteria} {extra}")
    with pytest.raises(ConfigError, match="'{extra}'"):
        read_upstream_template(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_upstream_template(tmp_path / "nowhere" / "evaluate_prompt.txt")


@pytest.mark.parametrize(("response", "judged"), [
    ("<think>\nplan\n</think>\n\nThe text", "The text"),
    ("<think>plan</think>\nThe text", "<think>plan</think>\nThe text"),  # upstream's marker has two newlines
    ("a</think>\n\nb</think>\n\nc", "b</think>\n\nc"),  # its first occurrence
    ("no reasoning", "no reasoning"),
])
def test_the_response_is_cut_after_upstreams_marker(response: str, judged: str):
    assert strip_think(response) == judged


@pytest.mark.parametrize(("text", "score"), [
    ('```json\n{\n    "score": 8,\n    "reason": "Covers the methods."\n}\n```', 8),
    ('{"score": 3, "reason": "Lacks depth."}', 3),
    ('```\n{"score": 10, "reason": "x"}\n```', 10),
    ('  ```json\n{"score": 4, "reason": "x"}\n```\n', 4),  # whitespace around the fence
    ('{"score": 8.0, "reason": "x"}', 8),  # upstream: 8.0 in [1, ..., 10]
    ('<think>\nThe criterion asks for ...\n</think>\n\n{"score": 6, "reason": "x"}', 6),  # a thinking judge
    ('{"reason": "first", "score": 1}', 1),
])
def test_judge_answers_upstream_reads(text: str, score: int):
    assert parse_criterion_score(text)[0] == score


@pytest.mark.parametrize(("text", "complaint"), [
    ('Here is my evaluation:\n```json\n{"score": 8, "reason": "x"}\n```', "not a JSON object"),
    ('{"score": 8, "reason": "x"}\nI hope this helps.', "not a JSON object"),
    ('```JSON\n{"score": 8, "reason": "x"}\n```', "not a JSON object"),  # strips lower-case json only
    ("{'score': 8, 'reason': 'x'}", "not a JSON object"),  # a Python dict: upstream's json.loads refuses it
    ('{"score": "8", "reason": "x"}', "got '8' (a string)"),
    ('{"score": 7.5, "reason": "x"}', "got 7.5"),
    ('{"score": 11, "reason": "x"}', "got 11"),
    ('{"score": 0, "reason": "x"}', "got 0"),
    ('{"score": true, "reason": "x"}', "got True"),
    ('{"score": 8}', "lacks 'reason'"),
    ('{"verdict": 8}', "lacks 'score' and 'reason'"),
    ('{"score": 8, "reason": ["a", "b"]}', "reason must be a string"),
    ("[8]", "a list, not an object with score, reason"),
    ("", "empty"),
    ("<think>The response is", "inside <think>"),
])
def test_judge_answers_upstream_refuses(text: str, complaint: str):
    with pytest.raises(ValueError, match=re.escape(complaint)):
        parse_criterion_score(text)


def test_the_reason_comes_back():
    assert parse_criterion_score('```json\n{"score": 9, "reason": "Quotes \\"Section 2\\"."}\n```') == (
        9, 'Quotes "Section 2".')


def test_settings_are_checked():
    from harness.backends.base import BackendOptions
    from harness.backends.openai_backend import OpenAIBackend

    backend = OpenAIBackend("judge", BackendOptions(base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(ConfigError, match="top_p"):
        WritingBenchJudge(backend, top_p=0)
    with pytest.raises(ConfigError, match="goes with `template`"):
        WritingBenchJudge(backend, system="sys.txt")
    asyncio.run(backend.close())
