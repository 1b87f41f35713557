"""MMLU-Pro: 12,032 multiple-choice questions (up to ten options) in 14 categories, answered with chain of thought.

Upstream: GitHub `TIGER-AI-Lab/MMLU-Pro` (Apache-2.0), `evaluate_from_local.py`; data on the Hub:
`TIGER-Lab/MMLU-Pro`, splits `test` (12,032) and `validation` (70: five CoT exemplars per category). Local
(`data_dir/mmlu_pro/`): `test.jsonl` (one record per line) and, for few-shot prompts, `validation.jsonl`; the
instruction line is read from upstream's `cot_initial_prompt.txt` when the folder holds it (else ours, in the same
shape). Abbreviated record:

    {"question_id": 70, "question": "Typical advertising regulatory bodies suggest ...",
     "options": ["Safe practices, Fear, Jealousy, Trivial", "..."], "answer": "I", "answer_index": 8,
     "cot_content": "", "category": "business", "src": "ori_mmlu-business_ethics"}

The prompt, as `generate_cot_prompt` builds it: the instruction line with the category in place of `{$}`, a blank
line, then `shots` (5) validation examples of the same category, each `Question:\\n<q>\\nOptions:\\nA. <o>\\n...` and
its `cot_content` (with "A: Let's think step by step." written "Answer: Let's think step by step.") and a blank
line, then the question itself ending in `Answer: Let's think step by step.`. Options equal to "N/A" are dropped
(`preprocess`). Upstream sends it as a raw completion prompt; here it is one user turn (the policies are chat
models), generated greedily with `stop` at `Question:` (the benchmark's `stop`, added to the table's).

Items: id `mmlu_pro:<question_id>`; `meta`: `answer` (the gold letter: upstream compares with it; question 3983's
`answer_index` disagrees and is not used), `category`, `n_options`, `src`. Scoring (`judges.mmlu_pro`): upstream's
extraction cascade; an answer without a letter is wrong and counted, or, with `random_guess`, a random option as
the official scorer does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from benchmarks import base
from benchmarks.base import PolicyItem
from benchmarks.scoring import checked_accuracy, checked_right
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "TIGER-Lab/MMLU-Pro"
FOLDER = "mmlu_pro"
TEST_FILE, VALIDATION_FILE, INITIAL_PROMPT_FILE = "test.jsonl", "validation.jsonl", "cot_initial_prompt.txt"
N_QUESTIONS = 12032
LETTERS = "ABCDEFGHIJKLMNOP"
STOP = ("Question:",)
INSTRUCTION = (
    "Each multiple-choice question below (answers included for the examples) is about {$}. Reason step by step, "
    'then end with "the answer is (X)", X being the letter of the correct option.\n'
)
"""Our instruction line, in the shape of upstream's `cot_prompt_lib/initial_prompt.txt`, whose text is used
instead when the data folder holds it (the `{$}` slot takes the category)."""


def _options(row: Mapping[str, Any]) -> list[str]:
    return [o for o in row["options"] if o != "N/A"]


def format_example(row: Mapping[str, Any], *, with_answer: bool) -> str:
    """One question as upstream's `format_cot_example` writes it."""
    text = "Question:\n" + row["question"] + "\nOptions:\n"
    for letter, option in zip(LETTERS, _options(row)):
        text += f"{letter}. {option}\n"
    if with_answer:
        cot = row["cot_content"].replace("A: Let's think step by step.", "Answer: Let's think step by step.")
        return text + cot + "\n\n"
    return text + "Answer: Let's think step by step."


def build_prompt(row: Mapping[str, Any], shots: Sequence[Mapping[str, Any]], instruction: str = INSTRUCTION) -> str:
    """Upstream's `generate_cot_prompt`: instruction (category filled in), the shots, then the question."""
    text = instruction.replace("{$}", row["category"]) + "\n"
    return text + "".join(format_example(s, with_answer=True) for s in shots) + format_example(row, with_answer=False)


def _check(row: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [f for f in ("question_id", "question", "options", "answer", "category") if f not in row]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(row["options"], list) or not 2 <= len(_options(row)) <= len(LETTERS):
        raise ConfigError(f"{where}: 'options' must be a list of 2 to {len(LETTERS)} strings")
    if row["answer"] not in LETTERS[:len(_options(row))]:
        raise ConfigError(f"{where}: answer {row['answer']!r} is not one of its {len(_options(row))} options' letters")
    return row


def to_items(test: Iterable[tuple[str, Any]], validation: Sequence[Mapping[str, Any]], *, shots: int,
             instruction: str, limit: int | None) -> list[PolicyItem]:
    by_category: dict[str, list[Mapping[str, Any]]] = {}
    for row in validation:
        by_category.setdefault(row["category"], []).append(row)
    items, seen = [], set()
    for where, raw in test:
        if limit is not None and len(items) >= limit:
            break
        row = _check(raw, where)
        examples = by_category.get(row["category"], [])[:shots]
        if len(examples) < shots:
            raise ConfigError(f"{where}: {shots} shots asked, the validation split has {len(examples)} for category "
                              f"{row['category']!r}")
        item_id = f"mmlu_pro:{row['question_id']}"
        if item_id in seen:
            raise ConfigError(f"{where}: duplicate question_id {row['question_id']}")
        seen.add(item_id)
        meta = {"answer": row["answer"], "category": row["category"], "n_options": len(_options(row)),
                "src": str(row.get("src", ""))}
        items.append(PolicyItem(item_id, (Message("user", build_prompt(row, examples, instruction)),), meta))
    if limit is None and len(items) != N_QUESTIONS:
        raise ConfigError(f"expected {N_QUESTIONS} MMLU-Pro test questions, found {len(items)}")
    return items


def _per_category(records: Sequence[Any]) -> dict[str, Any]:
    found: dict[str, list[float]] = {}
    for r in records:
        found.setdefault(r.meta.get("category", "?"), []).append(checked_right(r))
    return {"per_category": {c: sum(v) / len(v) for c, v in sorted(found.items())},
            "per_category_n": {c: len(v) for c, v in sorted(found.items())}}


ACCURACY = checked_accuracy(
    "share of questions whose extracted letter (upstream's cascade) is the gold one; no letter is wrong, counted in "
    "n_failed (or a seeded random option with random_guess, as the official scorer)",
    details=_per_category,
)


class MMLUPro:
    """MMLU-Pro's test questions as upstream's CoT prompts, answers read by its extraction cascade."""

    name = "mmlu_pro"
    display = "MMLU-Pro"
    metrics = (ACCURACY,)
    kind: Literal["policy"] = "policy"
    stop = STOP

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        return {"category": str(item.meta.get("category", ""))}, {}

    def load(self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0,
             shots: int = 5) -> list[PolicyItem]:
        """The test questions in file order; `limit` keeps the first N; `shots` validation examples per prompt
        (0: zero-shot, for data without the validation split); `seed` is unused.

        Raises:
            ConfigError: for missing files, malformed records, or fewer validation examples than `shots`.
        """
        if not 0 <= shots <= 5:
            raise ConfigError(f"shots must be 0..5, got {shots}")
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, got {limit}")
        if data_dir is not None:
            folder = base.data_folder(Path(data_dir), FOLDER, required=[TEST_FILE])
            test: Iterable[tuple[str, Any]] = read_jsonl(folder / TEST_FILE)
            validation = [row for _, row in read_jsonl(folder / VALIDATION_FILE)] \
                if (folder / VALIDATION_FILE).is_file() else []
            if shots and not validation:
                raise ConfigError(f"{folder}: no {VALIDATION_FILE} for {shots}-shot prompts (the Hub's validation "
                                  "split, 70 rows); add it, or load zero-shot with shots=0")
            path = folder / INITIAL_PROMPT_FILE
            instruction = path.read_text(encoding="utf-8") if path.is_file() else INSTRUCTION
        else:
            test_rows = base.load_hub(HUB_ID, split="test")
            test = ((f"{HUB_ID}[test] row {i}", row) for i, row in enumerate(test_rows))
            validation = list(base.load_hub(HUB_ID, split="validation")) if shots else []
            instruction = INSTRUCTION
        return to_items(test, validation, shots=shots, instruction=instruction, limit=limit)


MMLU_PRO = MMLUPro()
