"""MMLU-Pro: upstream's prompt format on a real test item, and its answer-extraction cascade on outputs written
here (traps included)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.base import PolicyItem
from benchmarks.mmlu_pro import MMLUPro, build_prompt
from harness.errors import ConfigError
from judges.mmlu_pro import MMLUProChecker, extract_answer

OUTPUTS = [
    ("The answer is (C).", "C"),
    ("so the answer is C", "C"),
    ("A is wrong, so the answer is (C)", "C"),
    ("the answer is (B). Later I thought the answer is (D).", "B"),  # the first "answer is" match wins
    ("The answer is (c).", None),  # lowercase is no letter, and "The" holds no standalone capital A-J
    ("Answer: D", "D"),
    ("answer: E", "E"),
    ("Step 1 ... Answer: F\nStep 2 ... Answer: G", "F"),  # `.` stops at a newline: the first line's match
    ("I pick J.", "J"),  # no anchor: the last standalone capital letter
    ("Options B and H look close; H fits.", "H"),
    ("", None),
    ("no letter here at all", None),
    ("The answer is (K).", None),  # K is not a choice letter; no standalone A-J either
    ("the answer is (A)", "A"),
    ("Therefore, the answer is I", "I"),
    ("The correct choice: B", "B"),  # last standalone capital
    ("ANSWER: C", "C"),  # [aA]nswer does not match ANSWER; the last standalone capital is C
    ("answer is(D)", "D"),  # no "answer is (" match; the last standalone capital is D
    ("The answer is \\(A\\)", "A"),  # LaTeX parentheses: the last standalone capital
    ("Let's think. (E) is right.", "E"),
    ("It must be A or B. The answer is (B)", "B"),
    ("A. apples B. bananas", "B"),
    ("Answer:C", "C"),
    ("The answer is (F) because F is larger than E.", "F"),
    ("Between A and J, I choose A", "A"),
    ("answer is G", "G"),
    ("The answer is: (H)", "H"),  # no "answer is (" match; last standalone capital is H
    ("I think it's d.", "I"),  # the pronoun is read as option I, as upstream reads it
    ("Final: I", "I"),
    ("Answer: Let's think step by step. The answer is (J).", "J"),
    ("Neither C nor D; answer: B", "B"),
]


def _expected(text: str) -> str | None:
    """Upstream's cascade written out again here (`evaluate_from_local.py`), as a second reading of each row."""
    import re

    for pattern, group, flags in ((r"answer is \(?([A-J])\)?", 1, 0), (r".*[aA]nswer:\s*([A-J])", 1, 0),
                                  (r"\b[A-J]\b(?!.*\b[A-J]\b)", 0, re.DOTALL)):
        m = re.search(pattern, text, flags)
        if m:
            return m.group(group)
    return None


@pytest.mark.parametrize("text, letter", OUTPUTS)
def test_extraction_cascade(text: str, letter: str | None):
    assert extract_answer(text) == letter == _expected(text)


def test_the_prompt_of_a_local_item_is_upstreams_format(shared_data: Path):
    folder = shared_data / "mmlu_pro"
    row = json.loads((folder / "test.jsonl").read_text().splitlines()[0])
    [item] = MMLUPro().load(data_dir=shared_data, limit=1, shots=0)
    # generate_cot_prompt with k=0: the initial prompt file's text, category filled in, a newline, the question.
    official = (folder / "cot_initial_prompt.txt").read_text().replace("{$}", row["category"]) + "\n"
    official += "Question:\n" + row["question"] + "\nOptions:\n"
    official += "".join(f"{'ABCDEFGHIJ'[i]}. {o}\n" for i, o in enumerate(o for o in row["options"] if o != "N/A"))
    official += "Answer: Let's think step by step."
    assert item.messages[0].content == official
    assert item.meta["answer"] == row["answer"] and item.id == f"mmlu_pro:{row['question_id']}"
    shot = {**row, "cot_content": "A: Let's think step by step. It is so. The answer is (A)."}
    assert "Answer: Let's think step by step. It is so. The answer is (A).\n\n" in build_prompt(row, [shot])
    with pytest.raises(ConfigError, match="no validation.jsonl for 5-shot prompts"):
        MMLUPro().load(data_dir=shared_data, limit=1)


def test_the_checker_counts_unextracted_answers_and_can_guess():
    item = PolicyItem("mmlu_pro:1", (), {"answer": "C", "n_options": 4, "category": "math"})
    right, wrong, none = asyncio.run(MMLUProChecker().judge_all(
        [(item, "the answer is (C)"), (item, "the answer is (A)"), (item, "hmm")], seed=0))
    assert (right.correct, wrong.correct, none.correct, none.letter) == (True, False, False, None)
    [guess] = asyncio.run(MMLUProChecker(random_guess=True).judge_all([(item, "hmm")], seed=0))
    [again] = asyncio.run(MMLUProChecker(random_guess=True).judge_all([(item, "hmm")], seed=7))
    assert guess.guessed in "ABCD" and guess.guessed == again.guessed  # seeded by the question, not the run
