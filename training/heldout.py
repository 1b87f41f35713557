"""The held-out evaluation's per-prompt record: fixed rubrics (policy) and per-prompt scores (both kinds).

- **Fixed rubrics** (`FixedRubrics`, policy jobs rewarded by a rubric evaluator): one rubric per held-out prompt,
  generated once by the frozen DR-Generator from the first held-out evaluation's completions (step 0: the base
  policy's set) and kept in `OUTPUT/heldout_rubrics.jsonl`; every later evaluation only verifies its new
  completions against the stored rubric. A rubric regenerated at every evaluation adds its own noise (another
  rubric, another scale) to every difference between evaluations; a fixed one leaves the completions the only
  thing that changes. A resumed run, and the controls of a learning comparison (`training.learning`, which copies
  the trained run's file), reuse the stored file. Rubrics are made at the first evaluation only (the file is
  written then, empty if none parsed): a prompt whose rubric could not be generated from the base policy's set
  stays unscored at every evaluation, counted (`unscored_parse`), rather than get a rubric from later weights.
- **Per-prompt scores** (`EvalScores`): each evaluation appends one line per prompt to `OUTPUT/eval_scores.jsonl`:
  `{"step", "split", "row", "score", "n", "n_unscored"}`, the mean score of the prompt's scored completions (policy:
  the fixed rubric's score; generator: the rubrics' discriminability reward). `split` is `heldout` (never trained
  on) or `seen` (`data.eval_train`: the first training prompts, evaluated the same way: does the policy climb its own
  objective?); a line without one is held-out. Paired statistics over prompts (`training.learning`) read one split
  with `read_eval_scores`.

The fixed rubrics cover both splits: a row's id names it, and a training row's id is never a held-out one's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import ConfigError
from judges.rubric import Rubric, RubricItem

RUBRICS = "heldout_rubrics.jsonl"
SCORES = "eval_scores.jsonl"
EVAL_SPLITS = ("heldout", "seen")
"""The dataset `split` values an evaluation reads; `train` is a training batch."""


class FixedRubrics:
    """The held-out prompts' rubrics, by row id, backed by a JSONL file (see the module docstring).

    Args:
        path: The file (read if it exists; each new rubric is appended).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rubrics: dict[str, Rubric] = {}
        self.generated = 0
        """Rubrics this process generated (the rest were read from the file)."""
        self.first_step: int | None = None
        """The step of the first evaluation, the one that makes the rubrics (None: not yet, or the file was
        there: nothing is made)."""
        self.stored = self.path.is_file()
        if self.stored:
            for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
                try:
                    found = json.loads(line)
                    self.rubrics[found["row"]] = Rubric(tuple(RubricItem(i["criterion"], i["weight"])
                                                              for i in found["rubric"]))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ConfigError(f"{self.path}:{n}: not a held-out rubric line ({exc})") from None

    def get(self, row: str) -> Rubric | None:
        return self.rubrics.get(row)

    def making(self, step: int) -> bool:
        """Whether an evaluation at `step` makes the rubrics it lacks: only the first, and only when no file was
        there (it is written now, so that a control copying it finds one even when no rubric parsed)."""
        if self.stored:
            return False
        if self.first_step is None:
            self.first_step = step
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        return step == self.first_step

    def add(self, row: str, items: Sequence[Mapping[str, Any]], *, step: int) -> Rubric:
        """Keep `items` (`[{criterion, weight}]`, a trace's rubric) as `row`'s rubric, appended to the file."""
        rubric = Rubric(tuple(RubricItem(i["criterion"], i["weight"]) for i in items))
        self.rubrics[row] = rubric
        self.generated += 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"row": row, "step": step, "rubric": [dict(i) for i in items]}) + "\n")
        return rubric


async def score_fixed(evaluator: Any, rubrics: FixedRubrics, *, row: str, question: str, responses: Sequence[str],
                      seed: int, step: int) -> tuple[list[float | None], float | None, Any, str | None]:
    """Scores of one held-out group under `row`'s fixed rubric: the evaluator's own `score_set` at the evaluation
    that makes the rubrics (its rubric is then stored), a verification against the stored rubric afterwards.
    Returns (scores, the saturated share of the rubric's items, the `score_set` trace or the `Verification`, or
    None: no rubric; the cause of the unscored ones: `parse` for a prompt with no rubric, `verify` for a missing
    verdict).

    `evaluator` is a `judges.dynamic.RubricEvaluator` (its `verifier`, `mode`, `verify_max_tokens`, `structured`).
    """
    from judges.dynamic import summarise_verdicts
    from judges.verify import verify

    rubric = rubrics.get(row)
    making = rubrics.making(step)
    if rubric is None and not making:
        return [None] * len(responses), None, None, "parse"
    if rubric is None:
        result = await evaluator.score_set(question, responses, seed=seed)
        if result.trace.rubric:
            rubrics.add(row, result.trace.rubric, step=step)
        stages = {f.stage for f in result.trace.failures}
        return (list(result.scores), result.trace.saturated_share, result.trace,
                "parse" if "generate_rubric" in stages else "verify")
    found = await verify(evaluator.verifier, question, responses, rubric, mode=evaluator.mode,
                         max_tokens=evaluator.verify_max_tokens, structured=evaluator.structured)
    scores, _, _, saturated = summarise_verdicts(rubric, found.verdicts)
    return scores, saturated, found, "verify"


@dataclass(frozen=True, slots=True)
class PromptScore:
    """One held-out prompt's score at one evaluation."""

    step: int
    row: str
    score: float | None
    """Mean over the prompt's scored completions (None: none was scored)."""
    n: int
    """Completions evaluated."""
    n_unscored: int


class EvalScores:
    """Appends each held-out evaluation's per-prompt scores to `path` (`eval_scores.jsonl`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, step: int, rows: Sequence[str], scores: Sequence[float | None], *, split: str = "heldout"
              ) -> list[PromptScore]:
        """One line per distinct row of `rows` (aligned with `scores`, one per completion)."""
        by_row: dict[str, list[float | None]] = {}
        for row, score in zip(rows, scores):
            by_row.setdefault(row, []).append(score)
        found = []
        for row, values in by_row.items():
            scored = [v for v in values if v is not None]
            found.append(PromptScore(step, row, float(np.mean(scored)) if scored else None, len(values),
                                     len(values) - len(scored)))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for p in found:
                f.write(json.dumps({"step": p.step, "split": split, "row": p.row, "score": p.score, "n": p.n,
                                    "n_unscored": p.n_unscored}) + "\n")
        return found


def read_eval_scores(path: Path, *, split: str = "heldout") -> dict[int, dict[str, float | None]]:
    """step -> row -> score of one split's lines of an `eval_scores.jsonl` (a later line of the same step and row
    wins).

    Raises:
        ConfigError: for a missing file or a malformed line (naming the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no per-prompt held-out scores ({SCORES}) there")
    out: dict[int, dict[str, float | None]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            found = json.loads(line)
            if found.get("split", "heldout") == split:
                out.setdefault(int(found["step"]), {})[str(found["row"])] = found["score"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: not a held-out score line ({exc})") from None
    return out


def keep_until(path: Path, step: int | None) -> None:
    """Drop the lines of a step-keyed JSONL file after `step` (all of them for None): what a resumed run writes
    again."""
    path = Path(path)
    if step is None or not path.is_file():
        path.unlink(missing_ok=True)
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
