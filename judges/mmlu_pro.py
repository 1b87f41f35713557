"""MMLU-Pro's checker: the official answer-extraction cascade and exact match on the letter (no model).

`extract_answer` follows `evaluate_from_local.py`: the first `answer is \\(?([A-J])\\)?` match; failing that, the
last `[aA]nswer:\\s*([A-J])` (its pattern starts with a greedy `.*`); failing that, the last standalone capital
A-J in the text. Upstream scores an answer without a letter by a random option (`random.seed(12345)` then
`randint` per such answer, in file order); here it is wrong and counted by default, and `random_guess=True`
draws the option from a generator seeded by (12345, question id), so the guess does not depend on the order the
answers come back in.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from benchmarks.base import PolicyItem
from harness.errors import Failure
from harness.seeds import derive_seed

_FIRST = re.compile(r"answer is \(?([A-J])\)?")
_AGAIN = re.compile(r".*[aA]nswer:\s*([A-J])")
_FINAL = re.compile(r"\b[A-J]\b(?!.*\b[A-J]\b)", re.DOTALL)
GUESS_SEED = 12345


def extract_answer(text: str) -> str | None:
    """The letter upstream reads from `text` (see the module docstring), or None."""
    for pattern, group in ((_FIRST, 1), (_AGAIN, 1), (_FINAL, 0)):
        found = pattern.search(text)
        if found:
            return found.group(group)
    return None


@dataclass(frozen=True, slots=True)
class LetterJudgment:
    item: str
    correct: bool
    letter: str | None
    """The extracted letter (None: none found)."""
    guessed: str | None = None
    """With `random_guess`: the option drawn for an answer without a letter."""
    failure: None = None


class MMLUProChecker:
    """Exact match of the extracted letter with the gold one (see the module docstring)."""

    needs_model: ClassVar[bool] = False
    """A checker: the run's judge model is not asked (`judges.policy.judge_needs_model`)."""

    def __init__(self, backend: Any = None, *, random_guess: bool = False) -> None:
        del backend  # a checker, not a judge
        self.random_guess = random_guess
        self.requests = 0

    @property
    def settings(self) -> dict[str, Any]:
        return {"checker": "mmlu-pro extraction cascade", "random_guess": self.random_guess}

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del text
        trace = {"judgment": {"letter": j.letter, "gold": item.meta["answer"], "unextracted": j.letter is None,
                              "guessed": j.guessed}}
        return (float(j.correct),), trace, ()

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[LetterJudgment]:
        del seed
        out = []
        for item, output in pairs:
            letter = extract_answer(output)
            guessed = None
            if letter is None and self.random_guess:
                n = int(item.meta["n_options"])
                guessed = "ABCDEFGHIJ"[random.Random(derive_seed(GUESS_SEED, item.id)).randrange(n)]
            correct = (letter or guessed) == item.meta["answer"]
            out.append(LetterJudgment(item.id, correct, letter, guessed))
        return out
