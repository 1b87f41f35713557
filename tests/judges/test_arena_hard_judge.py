"""The Arena-Hard v2.0 judge (`judges.arena_hard.ArenaHardJudge`) against a loopback OpenAI-compatible judge
server, on real questions and baseline answers from the local question file: two games per question with the
positions swapped, verdicts mapped to the right games, re-asks, failures, faults, the regex constraint, the
per-category system prompt and upstream's prompts read from the user's copy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from judge_fakes import judge_all_closing, loopback_judge_backend

from benchmarks.arena_hard import load_arena_hard
from benchmarks.arena_hard_score import AnswerStyle, ArenaGame, answer_styles, arena_hard_score
from benchmarks.base import PolicyItem
from harness.backends.base import Message
from harness.errors import ConfigError, FailureCategory
from harness.seeds import derive_seed
from judges.arena_hard import VERDICT_CONSTRAINT, ArenaHardJudge, _read_verdict, fill_upstream_template
from judges.templates import load_template, render

_SECTION = r"<\|The Start of Assistant {0}'s Answer\|>\n(.*?)\n<\|The End of Assistant {0}'s Answer\|>"
_A, _B = (re.compile(_SECTION.format(x), re.DOTALL) for x in "AB")
_QUALITY = re.compile(r"QUALITY=(\d)")


def games(judgments) -> list[ArenaGame]:
    """Every game of the judgments, as the benchmark's metric scores them."""
    return [g for j in judgments for g in j.games]


def shown(user: str) -> tuple[str, str]:
    """The answers shown as A and as B in a judge's user turn."""
    return _A.search(user).group(1), _B.search(user).group(1)


class JudgeServer:
    """A judge that grades each answer by its `QUALITY=n` marker (2 without one) and labels the difference of
    A and B (>= 2: `A>>B`, 1: `A>B`, 0: `A=B`, ...), except: an answer holding `@LEFT` makes it prefer A
    whatever (a position bias), `@CHATTY` makes its first answer lack a label (the re-ask gets one),
    `@HOPELESS` makes it never give one. `fail_first` answers HTTP 500 to every first attempt; `refuse`
    lists request fields it answers with HTTP 400 (a server without that structured-output form)."""

    def __init__(self, *, fail_first: bool = False, refuse: tuple[str, ...] = ()) -> None:
        self.fail_first, self.refuse = fail_first, refuse
        self.bodies: list[dict] = []
        self.seen: dict[str, int] = {}

    async def __call__(self, request):
        from harness.loopback import chat_completion, json_response

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        refused = [field for field in self.refuse if field in body]
        if refused:  # as OpenAI's API refuses a field it does not take: naming it
            return json_response({"error": {"message": f"Unrecognized request argument supplied: {refused[0]}"}},
                                 status=400)
        self.bodies.append(body)
        key = json.dumps(body, sort_keys=True)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.fail_first and self.seen[key] == 1:
            return json_response({"error": {"message": "busy"}}, status=500)
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        a, b = shown(user)
        if "@HOPELESS" in user or ("@CHATTY" in user and len(body["messages"]) == 2):
            return json_response(chat_completion(["Both answers have their merits."]))
        if "@LEFT" in user:
            label = "A>B"
        else:
            diff = max(-2, min(2, _quality(a) - _quality(b)))
            label = {2: "A>>B", 1: "A>B", 0: "A=B", -1: "B>A", -2: "B>>A"}[diff]
        return json_response(chat_completion([f"My own answer first. ... My final verdict is: [[{label}]]"]))


def _quality(answer: str) -> int:
    m = _QUALITY.search(answer)
    return int(m.group(1)) if m else 2


@pytest.fixture(scope="module")
def hard_items(shared_data: Path) -> list[PolicyItem]:
    return list(load_arena_hard(data_dir=shared_data, limit=4).items)


@pytest.fixture(scope="module")
def creative_items(shared_data: Path) -> list[PolicyItem]:
    """Two real creative-writing questions with stand-in baseline answers (the shared data lacks gemini's)."""
    rows = [json.loads(line) for line in (shared_data / "arena_hard_v2" / "question.jsonl").open()]
    creative = [r for r in rows if r["category"] == "creative_writing"][:2]
    return [
        PolicyItem(f"arena_hard_v2:{r['uid']}", (Message("user", r["prompt"]),),
                   {"uid": r["uid"], "category": r["category"], "subcategory": r["subcategory"],
                    "baseline": "gemini-2.0-flash-001", "baseline_answer": f"A stand-in poem {i}.",
                    "baseline_metadata": None})
        for i, r in enumerate(creative)
    ]


def _run(server: JudgeServer, pairs, *, seed: int = 0, **kwargs):
    from harness.loopback import serve_in_thread

    with serve_in_thread(server) as url:
        backend = loopback_judge_backend(url)
        judge = ArenaHardJudge(backend, **kwargs)
        return judge, judge_all_closing(judge, backend, pairs, seed=seed)


def _bodies_of(server: JudgeServer, item: PolicyItem) -> list[dict]:
    return [b for b in server.bodies if item.messages[0].content in b["messages"][1]["content"]]


# Policy outputs, and the model's battle outcomes they earn (model-as-A game first, as upstream's rows):
#   QUALITY=4 vs the baseline's 2: game 1 `B>>A`, game 2 `A>>B`      -> [1, 1, 1] + [1, 1, 1]
#   QUALITY=2: a tie both ways, `A=B`                               -> [0.5] + [0.5]
#   QUALITY=1: game 1 `A>B` (baseline better), game 2 `B>A`         -> [0] + [0]
#   @LEFT: the judge prefers A in both games, `A>B` and `A>B`        -> [1] (model as A) + [0]
# 12 rows summing to 6 + 1 + 0 + 1 = 8: win rate 8 / 12 = 2 / 3; 8 kept games, 2 of them ties.
OUTPUTS = ["QUALITY=4 a fine answer", "QUALITY=2 an equal answer", "QUALITY=1 a weaker answer",
           "@LEFT an answer the judge is biased about"]
VERDICTS = [("B>>A", "A>>B"), ("A=B", "A=B"), ("A>B", "B>A"), ("A>B", "A>B")]
ROWS = [1, 1, 1, 1, 1, 1, 0.5, 0.5, 0, 0, 1, 0]


def test_two_games_per_question_with_the_positions_swapped(hard_items: list[PolicyItem]):
    server = JudgeServer()
    judge, found = _run(server, list(zip(hard_items, OUTPUTS)))
    assert judge.requests == 8 and len(server.bodies) == 8
    system = load_template("arena_hard_system")
    for item, output, judgment in zip(hard_items, OUTPUTS, found):
        baseline = item.meta["baseline_answer"]
        bodies = _bodies_of(server, item)
        assert len(bodies) == 2
        for body in bodies:
            assert [m["role"] for m in body["messages"]] == ["system", "user"]
            assert body["messages"][0]["content"] == system
            assert (body["temperature"], body["max_tokens"]) == (0.0, 16000)
        pairs_shown = sorted(shown(b["messages"][1]["content"]) for b in bodies)
        assert pairs_shown == sorted([(baseline, output), (output, baseline)])
        # Game 1's chat is the question, then the baseline's answer as A, then the policy's as B.
        first = next(b for b in bodies if shown(b["messages"][1]["content"])[0] == baseline)
        user = first["messages"][1]["content"]
        assert user == render(load_template("arena_hard_user"), question=item.messages[0].content,
                              answer_a=baseline, answer_b=output)
        assert user.index("<|User Prompt|>") < user.index(baseline) < user.index(output)
        assert judgment.item == item.id and judgment.failures == (None, None)
        assert [len(a) for a in judgment.raw["answers"]] == [1, 1]
    assert [(j.baseline_as_a.verdict, j.model_as_a.verdict) for j in found] == VERDICTS
    for j, item in zip(found, hard_items):
        assert j.baseline_as_a == ArenaGame(item.meta["uid"], "hard_prompt", j.baseline_as_a.verdict,
                                            model_as_a=False, judge="judge")
        assert j.model_as_a.model_as_a is True and j.model_as_a.judge == "judge"
        assert j.games == (j.baseline_as_a, j.model_as_a)
    json.dumps([j.to_json() for j in found])
    assert judge.settings == {"prompts": "ours", "structured": True, "label_only": False, "temperature": 0.0,
                              "max_tokens": 16000}


def test_the_score_of_the_judged_games_by_hand(hard_items: list[PolicyItem]):
    _, found = _run(JudgeServer(), list(zip(hard_items, OUTPUTS)))
    seed = 5
    c = arena_hard_score(games(found), seed=seed).category("hard_prompt")
    assert c.baseline == "o3-mini-2025-01-31"
    assert c.win_rate == pytest.approx(2 / 3)
    counts = ("n_questions", "n_games", "n_battles", "n_ties", "n_unparsed", "n_dropped")
    assert [getattr(c, k) for k in counts] == [4, 8, 12, 2, 0, 0]
    # show_result.print_leaderboard: 100 resamples of the 12 rows (in question order, model-as-A game first).
    rng = np.random.default_rng(derive_seed(seed, "arena-hard", "hard_prompt"))
    means = np.array(ROWS, dtype=float)[rng.integers(0, 12, size=(100, 12))].mean(axis=1)
    assert c.score == pytest.approx(means.mean())
    assert (c.lower, c.upper) == pytest.approx(tuple(np.quantile(means, [0.05, 0.95])))


def test_style_control_reads_the_policy_text_and_the_baseline_metadata(hard_items: list[PolicyItem]):
    outputs = ["QUALITY=4\n# Plan\n- one\n- two\n**done**", "QUALITY=2 plain", "QUALITY=1\n1. a\n2. b",
               "@LEFT\n## Note\n__bold__"]
    pairs = list(zip(hard_items, outputs))
    model, baseline = answer_styles(pairs, [40, 12, 30, 25])
    uid = hard_items[0].meta["uid"]
    assert model[uid] == AnswerStyle(40, 1, 2, 1)
    assert baseline[uid] == AnswerStyle.from_metadata(hard_items[0].meta["baseline_metadata"])
    _, found = _run(JudgeServer(), pairs)
    result = arena_hard_score(games(found), style_control=True, model_style=model, baseline_style=baseline)
    c = result.category("hard_prompt")
    assert result.style_control and len(c.style_coefs) == 4 and c.lower <= c.score <= c.upper
    with pytest.raises(ConfigError, match="3 token counts for 4 answers"):
        answer_styles(pairs, [1, 2, 3])


def test_an_unlabelled_answer_is_reasked_a_hopeless_one_fails_and_faults_are_retried(
    hard_items: list[PolicyItem],
):
    outputs = ["QUALITY=3 but @CHATTY", "@HOPELESS", "QUALITY=2", "QUALITY=4"]
    server = JudgeServer(fail_first=True)  # every first attempt (re-asks too) fails with a 500
    judge, found = _run(server, list(zip(hard_items, outputs)), structured=False)
    chatty, hopeless = found[0], found[1]
    assert (chatty.baseline_as_a.verdict, chatty.model_as_a.verdict) == ("B>A", "A>B")
    assert chatty.failures == (None, None) and [len(a) for a in chatty.raw["answers"]] == [2, 2]
    assert chatty.raw["problems"] == ["it ends without a label such as [[A>B]]"] * 2
    reask = next(b for b in _bodies_of(server, hard_items[0]) if len(b["messages"]) == 4)
    assert [m["role"] for m in reask["messages"]] == ["system", "user", "assistant", "user"]
    assert reask["messages"][2]["content"] == "Both answers have their merits."
    complaint = reask["messages"][3]["content"]
    assert "[[A>B]]" in complaint and "without a label" in complaint
    for failure in hopeless.failures:
        assert failure.category is FailureCategory.PARSE and failure.attempts == 2
    assert (hopeless.baseline_as_a.verdict, hopeless.model_as_a.verdict) == (None, None)
    assert [(j.baseline_as_a.verdict, j.model_as_a.verdict) for j in found[2:]] == [("A=B", "A=B"),
                                                                                    ("B>>A", "A>>B")]
    assert judge.requests == 8 + 4  # two re-asks each for the chatty and the hopeless question
    retried = [b for b in server.bodies if server.seen[json.dumps(b, sort_keys=True)] > 1]
    assert len(retried) == 2 * 12  # every request was refused once, retried by the backend, then answered
    assert all("structured_outputs" not in b for b in server.bodies)
    # The hopeless question is dropped and counted: rows [1] + [1], [0.5] + [0.5], [1, 1, 1] + [1, 1, 1].
    c = arena_hard_score(games(found)).category("hard_prompt")
    assert [c.n_questions, c.n_games, c.n_unparsed, c.n_dropped, c.n_battles] == [3, 6, 2, 1, 10]
    assert c.win_rate == pytest.approx(9 / 10)


@pytest.mark.parametrize(("refuse", "form"), [((), "structured_outputs"),
                                               (("structured_outputs",), "guided_regex")])
def test_the_verdict_constraint_goes_in_the_form_the_server_takes(hard_items: list[PolicyItem], refuse, form):
    server = JudgeServer(refuse=refuse)
    _, found = _run(server, list(zip(hard_items[:2], OUTPUTS)))
    assert all(j.failures == (None, None) for j in found)
    assert len(server.bodies) == 4
    sent = [b["structured_outputs"]["regex"] if form == "structured_outputs" else b["guided_regex"]
            for b in server.bodies]
    assert sent == [VERDICT_CONSTRAINT.spec] * 4
    for label in ("A>>B", "A>B", "A=B", "B>A", "B>>A", "A<<B", "B<<A", "A<B", "B<A", "B=A"):
        assert re.fullmatch(VERDICT_CONSTRAINT.spec, f"Reasoning ...\n\nVerdict: [[{label}]]")
    assert not re.fullmatch(VERDICT_CONSTRAINT.spec, "Verdict: [[A]]")
    assert not re.fullmatch(VERDICT_CONSTRAINT.spec, "[[A>B]] and then more text")


def test_creative_writing_uses_its_own_system_prompt(creative_items: list[PolicyItem],
                                                      hard_items: list[PolicyItem]):
    server = JudgeServer()
    pairs = [*zip(creative_items, ["QUALITY=3 a poem", "QUALITY=0 no poem"]), (hard_items[0], "QUALITY=2")]
    _, found = _run(server, pairs)
    creative, hard = load_template("arena_hard_creative_system"), load_template("arena_hard_system")
    assert "own answer" in hard and "own answer" not in creative
    for item in creative_items:
        assert [b["messages"][0]["content"] for b in _bodies_of(server, item)] == [creative, creative]
    assert [b["messages"][0]["content"] for b in _bodies_of(server, hard_items[0])] == [hard, hard]
    assert [(j.baseline_as_a.category, j.baseline_as_a.verdict, j.model_as_a.verdict) for j in found[:2]] == [
        ("creative_writing", "B>A", "A>B"), ("creative_writing", "A>>B", "B>>A")]
    result = arena_hard_score(games(found))
    c = result.category("creative_writing")
    assert c.baseline == "gemini-2.0-flash-001" and c.win_rate == pytest.approx(2 / 8)  # [1] + [1], 6 zeros
    assert result.category("hard_prompt").win_rate == 0.5


def test_upstreams_prompts_are_read_from_the_users_copy(shared_data: Path, hard_items: list[PolicyItem],
                                                       creative_items: list[PolicyItem]):
    folder = shared_data / "arena_hard_v2" / "judge_config"
    template = yaml.safe_load((folder / "arena-hard-v2.0.yaml").read_text())["prompt_template"]
    server = JudgeServer()
    item, poem = hard_items[0], creative_items[0]
    judge, found = _run(server, [(item, "QUALITY=3 {braces} and {QUESTION} stay"), (poem, "QUALITY=2")],
                        upstream_prompts=folder)
    assert judge.settings["prompts"] == str(folder)
    verdicts = [(j.baseline_as_a.verdict, j.model_as_a.verdict) for j in found]
    assert verdicts == [("B>A", "A>B"), ("A=B", "A=B")]
    files = ((item, "system_prompt_hard_prompt.txt"), (poem, "system_prompt_creative_writing.txt"))
    for it, system_file in files:
        bodies = _bodies_of(server, it)
        assert [b["messages"][0]["content"] for b in bodies] == [(folder / system_file).read_text()] * 2
    output = "QUALITY=3 {braces} and {QUESTION} stay"
    first = next(b for b in _bodies_of(server, item) if shown(b["messages"][1]["content"])[1] == output)
    expected = template.format(QUESTION=item.messages[0].content, ANSWER_A=item.meta["baseline_answer"],
                               ANSWER_B=output)
    assert first["messages"][1]["content"] == expected
    # Our user template is upstream's layout.
    ours = render(load_template("arena_hard_user"), question="Q {x}", answer_a="a", answer_b="b")
    assert ours == template.format(QUESTION="Q {x}", ANSWER_A="a", ANSWER_B="b")


def test_the_prompts_come_from_the_folder_given(shared_data: Path, tmp_path: Path,
                                                hard_items: list[PolicyItem]):
    """An edited copy of upstream's files (in a temporary folder) is what the judge sends."""
    source = shared_data / "arena_hard_v2" / "judge_config"
    for name in ("system_prompt_hard_prompt.txt", "system_prompt_creative_writing.txt"):
        (tmp_path / name).write_text("EDITED " + (source / name).read_text())
    config = yaml.safe_load((source / "arena-hard-v2.0.yaml").read_text())
    config["prompt_template"] = "EDITED {{verbatim}}\n" + config["prompt_template"]
    (tmp_path / "arena-hard-v2.0.yaml").write_text(yaml.safe_dump(config))
    server = JudgeServer()
    _, found = _run(server, [(hard_items[0], "QUALITY=2")], upstream_prompts=tmp_path)
    assert found[0].failures == (None, None)
    for body in server.bodies:
        assert body["messages"][0]["content"].startswith("EDITED Please act as an impartial judge")
        assert body["messages"][1]["content"].startswith("EDITED {verbatim}\n<|User Prompt|>\n")


def test_bad_prompts_and_items_are_config_errors(tmp_path: Path, hard_items: list[PolicyItem]):
    from judges.arena_hard import read_upstream_prompts

    with pytest.raises(ConfigError, match="cannot read upstream's system_prompt_hard_prompt.txt"):
        read_upstream_prompts(tmp_path)
    with pytest.raises(ConfigError, match="exactly the fields"):
        fill_upstream_template("{QUESTION} {ANSWER_A} {ANSWER_B} {REFERENCE}", QUESTION="", ANSWER_A="",
                               ANSWER_B="")
    assert fill_upstream_template("{{x}} {QUESTION}|{ANSWER_A}|{ANSWER_B}", QUESTION="{ANSWER_A}",
                                  ANSWER_A="a", ANSWER_B="b") == "{x} {ANSWER_A}|a|b"
    odd = PolicyItem("arena_hard_v2:x", hard_items[0].messages, {**hard_items[0].meta, "category": "poetry"})
    server = JudgeServer()
    with pytest.raises(ConfigError, match="no system prompt for category 'poetry'; known: hard_prompt"):
        _run(server, [(hard_items[0], "fine"), (odd, "fine")])
    assert server.bodies == []  # refused before any request
    with pytest.raises(ConfigError, match="max_tokens must be >= 1"):
        ArenaHardJudge(object(), max_tokens=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "label"), [
    ("<think>maybe [[A>>B]]</think>On reflection: [[B>A]]", "B>A"),
    ("<think>[[A>>B]]</think>then [A=B]", "A=B"),  # the reasoning's label is not read
    ("Final verdict: [[a>b]]", "A>B"),
])
def test_labels_are_read_after_any_reasoning(text: str, label: str):
    assert _read_verdict(text) == label


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty"),
    ("<think>[[A>B]] is my guess", "reasoning but nothing after it"),
    ("[[A]]", "without a label"),
])
def test_answers_without_a_label_are_refused(text: str, problem: str):
    with pytest.raises(ValueError, match=re.escape(problem)):
        _read_verdict(text)
