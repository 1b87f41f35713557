"""Arena-Hard v2.0 (Arena-Hard-Auto): 750 Chatbot Arena prompts a policy answers, judged against a baseline.

Upstream: `lmarena/arena-hard-auto` (GitHub, Apache-2.0), `data/arena-hard-v2.0/`: `question.jsonl` (500
`hard_prompt` questions, subcategories `coding` 253 and `math` 247, then 250 `creative_writing`) and
`model_answer/<model>.jsonl`. Each category has its own baseline (`utils/judge_utils.py` `JUDGE_SETTINGS`):
`o3-mini-2025-01-31` for `hard_prompt`, `gemini-2.0-flash-001` for `creative_writing`. Records (abbreviated):

    question.jsonl: {"uid": "2edbb5f36f5b42be", "category": "hard_prompt", "subcategory": "coding",
                     "prompt": "Write me a zig program that solves the following problem from advent ..."}
    model_answer/o3-mini-2025-01-31.jsonl:
                    {"uid": "2edbb5f36f5b42be", "ans_id": "...", "model": "o3-mini-2025-01-31", "tstamp": ...,
                     "messages": [{"role": "user", "content": "<prompt>"},
                                  {"role": "assistant", "content": {"answer": "<text>"}}],
                     "metadata": {"token_len": 1131, "header_count": {"h1": 0, ...},
                                  "list_count": {"ordered": 5, "unordered": 0},
                                  "bold_count": {"**": 0, "__": 0}}}

The join is upstream's (`gen_judgment.py`): questions in file order; answers keyed by `uid` in the file named
after the model (`utils/completion.py` `load_model_answers`); the baseline of a question is
`JUDGE_SETTINGS[question["category"]]["baseline"]` and its answer text `messages[-1]["content"]["answer"]`.
The answer's `metadata` feeds style control (`show_result.py`).

Data (`data_dir/arena_hard_v2/`): `question.jsonl`, `model_answer/<baseline>.jsonl`, and optionally
`judge_config/judge_settings.json` (`{category: {"baseline": model, ...}}`), else `DEFAULT_BASELINES`. Hub
(the default): the dataset `lmarena-ai/arena-hard-auto` is a git-lfs mirror of upstream's `data/` tree, not a
`load_dataset` dataset (its answer files mix string and dict `content`), so the same files are downloaded with
`hf_hub_download` and read as local ones.

Items: id `arena_hard_v2:<uid>`, messages = one user turn holding the prompt, `meta`: `uid`, `category`,
`subcategory`, `baseline` (model name), `baseline_answer` (text), `baseline_metadata` (the answer's `metadata`
dict, None where the record has none). A question whose baseline answer file or record is missing is an error
naming it; `missing_baseline="skip"` leaves such questions out instead, logs a warning with the count, and
`load_arena_hard` returns the skipped uids per baseline. (Missing upstream-side: the shared snapshot lacks
`gemini-2.0-flash-001.jsonl`, so offline only the 500 `hard_prompt` questions have baselines.)

Official scoring (in `benchmarks/arena_hard_score.py`): two games per question, the baseline as A then as B; labels
`[[A>>B]]` .. `[[B>>A]]`, a strong one counting 3 times; per category, 100 bootstrap resamples of the battles
give the score and a 90% interval (optionally Bradley-Terry with style control).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks import base
from benchmarks.arena_hard_score import STRONG_WEIGHT, ArenaGame, arena_hard_score
from benchmarks.base import PolicyItem
from benchmarks.scoring import Aggregate, Metric
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_json, read_jsonl

log = logging.getLogger(__name__)

HUB_ID = "lmarena-ai/arena-hard-auto"
HUB_PREFIX = "data/arena-hard-v2.0"
"""Where upstream's v2.0 files sit in the Hub mirror (and in the GitHub repo)."""
FOLDER = "arena_hard_v2"
QUESTIONS = "question.jsonl"
ANSWERS = "model_answer"
SETTINGS = "judge_config/judge_settings.json"
DEFAULT_BASELINES: Mapping[str, str] = {
    "hard_prompt": "o3-mini-2025-01-31",
    "coding": "o3-mini-2025-01-31",
    "math": "o3-mini-2025-01-31",
    "creative_writing": "gemini-2.0-flash-001",
}
"""Category -> baseline model: the `baseline` of each v2.0 key of upstream's `utils/judge_utils.py`
`JUDGE_SETTINGS` (snapshot `196f6b8`). Looked up by the question's `category`, as `gen_judgment.py` does."""
MissingBaseline = Literal["error", "skip"]


@dataclass(frozen=True, slots=True)
class ArenaHardLoad:
    """What `load_arena_hard` read."""

    items: tuple[PolicyItem, ...]
    """The questions with a baseline answer, in `question.jsonl` order."""
    skipped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Baseline model -> uids of the questions left out for want of its answer (`missing_baseline="skip"`)."""

    @property
    def n_skipped(self) -> int:
        """How many questions were left out."""
        return sum(len(uids) for uids in self.skipped.values())


def _string(row: Mapping[str, Any], key: str, where: str, *, nonempty: bool = True) -> str:
    value = row.get(key)
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise ConfigError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.40}")
    return value


def _questions(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    seen: dict[str, str] = {}
    for where, row in read_jsonl(path):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
        question = {key: _string(row, key, where) for key in ("uid", "category", "subcategory", "prompt")}
        if question["uid"] in seen:
            raise ConfigError(
                f"{where}: duplicate uid {question['uid']!r} (first at {seen[question['uid']]})"
            )
        seen[question["uid"]] = where
        yield where, question


def _answers(path: Path) -> dict[str, tuple[str, Any]]:
    """uid -> (answer text, metadata) of one `model_answer/<model>.jsonl` file."""
    answers: dict[str, tuple[str, Any]] = {}
    for where, row in read_jsonl(path):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
        uid = _string(row, "uid", where)
        messages = row.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        content = last.get("content") if isinstance(last, Mapping) else None
        if not (
            isinstance(last, Mapping) and last.get("role") == "assistant" and isinstance(content, Mapping)
        ):
            raise ConfigError(
                f"{where}: the last of 'messages' must be an assistant turn with content {{'answer': text}}"
            )
        answer = _string(content, "answer", f"{where}: assistant content", nonempty=False)
        metadata = row.get("metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ConfigError(f"{where}: 'metadata' must be an object, got {type(metadata).__name__}")
        if uid in answers:
            raise ConfigError(f"{where}: duplicate answer for uid {uid!r}")
        answers[uid] = (answer, dict(metadata) if metadata is not None else None)
    return answers


def _baselines(path: Path | None) -> Mapping[str, str]:
    """Category -> baseline from a `judge_settings.json`, else the documented default."""
    if path is None or not path.is_file():
        return DEFAULT_BASELINES
    settings = read_json(path)
    ok = isinstance(settings, Mapping) and all(
        isinstance(v, Mapping) and isinstance(v.get("baseline"), str) and v["baseline"]
        for v in settings.values()
    )
    if not ok:
        raise ConfigError(f"{path}: expected {{category: {{'baseline': model name, ...}}, ...}}")
    return {category: v["baseline"] for category, v in settings.items()}


def _join(
    questions: Iterator[tuple[str, dict[str, str]]],
    baselines: Mapping[str, str],
    answer_file: Callable[[str], Path | None],
    *,
    where_answers: str,
    limit: int | None,
    missing_baseline: MissingBaseline,
) -> ArenaHardLoad:
    """Questions joined to their category's baseline answer; `answer_file(model)` is None when absent."""
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    if missing_baseline not in ("error", "skip"):
        raise ConfigError(f"missing_baseline must be 'error' or 'skip', got {missing_baseline!r}")
    answers: dict[str, dict[str, tuple[str, Any]] | None] = {}
    items: list[PolicyItem] = []
    skipped: dict[str, list[str]] = {}
    for where, q in questions:
        if limit is not None and len(items) >= limit:
            break
        if q["category"] not in baselines:
            raise ConfigError(
                f"{where}: category {q['category']!r} has no baseline (known: {', '.join(sorted(baselines))})"
            )
        model = baselines[q["category"]]
        if model not in answers:
            path = answer_file(model)
            answers[model] = _answers(path) if path is not None else None
        file = f"{where_answers}/{model}.jsonl"
        if answers[model] is None or q["uid"] not in answers[model]:
            problem = "file not found" if answers[model] is None else f"no answer for uid {q['uid']!r}"
            if missing_baseline == "error":
                raise ConfigError(
                    f"{file}: {problem}: the baseline answers of {q['category']!r} questions (first needed "
                    f"by {where}); add the file, or pass missing_baseline='skip' to leave those questions out"
                )
            skipped.setdefault(model, []).append(q["uid"])
            continue
        answer, metadata = answers[model][q["uid"]]
        meta = {
            "uid": q["uid"],
            "category": q["category"],
            "subcategory": q["subcategory"],
            "baseline": model,
            "baseline_answer": answer,
            "baseline_metadata": metadata,
        }
        items.append(PolicyItem(f"arena_hard_v2:{q['uid']}", (Message("user", q["prompt"]),), meta))
    result = ArenaHardLoad(tuple(items), {m: tuple(uids) for m, uids in skipped.items()})
    for model, uids in result.skipped.items():
        log.warning(
            "arena_hard_v2: skipped %d question(s) without a baseline answer in %s/%s.jsonl",
            len(uids),
            where_answers,
            model,
        )
    return result


def _hub_file(filename: str) -> Path | None:
    """A file of the Hub mirror (`HUB_PREFIX/filename`), downloaded or cached; None if the repo lacks it."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - a dependency of datasets
        raise ConfigError(
            "loading Arena-Hard v2.0 from the Hugging Face hub needs `huggingface_hub`"
        ) from exc
    try:
        return Path(hf_hub_download(repo_id=HUB_ID, filename=f"{HUB_PREFIX}/{filename}", repo_type="dataset"))
    except EntryNotFoundError as exc:
        if not isinstance(exc, LocalEntryNotFoundError):  # offline or not cached is not "absent upstream"
            return None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:  # connection, gated repo, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    raise ConfigError(
        f"cannot download {HUB_PREFIX}/{filename} from Hugging Face dataset {HUB_ID!r}: {reason}; "
        f"offline, pass --data-dir with {FOLDER}/ holding upstream's data/arena-hard-v2.0 files"
    ) from None


def load_arena_hard(
    *, data_dir: Path | None = None, limit: int | None = None, missing_baseline: MissingBaseline = "error"
) -> ArenaHardLoad:
    """The questions with their baseline answers, and what was skipped (see the module docstring).

    Raises:
        ConfigError: for a missing folder or question file, a malformed line (naming file and line), or
            (unless `missing_baseline="skip"`) a question whose baseline answer file or record is missing.
    """
    if data_dir is not None:
        folder = base.data_folder(data_dir, FOLDER, required=[QUESTIONS])
        return _join(
            _questions(folder / QUESTIONS),
            _baselines(folder / SETTINGS),
            lambda model: p if (p := folder / ANSWERS / f"{model}.jsonl").is_file() else None,
            where_answers=str(folder / ANSWERS),
            limit=limit,
            missing_baseline=missing_baseline,
        )
    questions = _hub_file(QUESTIONS)
    if questions is None:
        raise ConfigError(f"Hugging Face dataset {HUB_ID!r} has no {HUB_PREFIX}/{QUESTIONS}")
    return _join(
        _questions(questions),
        DEFAULT_BASELINES,  # upstream keeps JUDGE_SETTINGS in code, not in the data tree
        lambda model: _hub_file(f"{ANSWERS}/{model}.jsonl"),
        where_answers=f"{HUB_ID}:{HUB_PREFIX}/{ANSWERS}",
        limit=limit,
        missing_baseline=missing_baseline,
    )


# --- metrics over judged records (`judges.policy`: scores = the policy's points in game 1 and game 2,
# trace["judgment"]["games"] the two games with their verdict labels) ---

def _games(record: Any) -> list[dict[str, Any]]:
    return list((record.trace.get("judgment") or {}).get("games") or ())


def _battles(record: Any) -> list[float]:
    """The record's battle outcomes (upstream's exploded rows); none when a game has no verdict."""
    games = _games(record)
    if len(games) != 2 or any(g["verdict"] is None for g in games) or any(s is None for s in record.scores):
        return []
    out: list[float] = []
    for game, points in zip(games, record.scores):
        out += [points] * (STRONG_WEIGHT if ">>" in game["verdict"] or "<<" in game["verdict"] else 1)
    return out


def _category_score(category: str):
    def aggregate(records: Any) -> Aggregate:
        games = [ArenaGame(**g) for r in records for g in _games(r)]
        found = arena_hard_score(games, seed=0).category(category)
        return Aggregate(found.score, (found.lower, found.upper), found.to_json())

    return aggregate


def _category_metric(category: str, display: str) -> Metric:
    return Metric(
        category, display,
        f"{display}: the policy's score against the category baseline (two games per question, positions "
        "swapped, a strong verdict counts 3 battles); upstream's mean of 100 bootstrap resamples of the battles "
        "with their 5-95% interval, no style control; a question with a game left unjudged is dropped and "
        "counted in n_failed",
        lambda r: float(np.mean(b)) if (b := _battles(r)) else 0.0,
        lambda r: any(g.get("verdict") in ("A=B", "B=A") for g in _games(r)),
        binary=False,
        weights=lambda records: np.array([float(len(_battles(r))) for r in records]),
        failed=lambda r: not _battles(r),
        applies=lambda r: r.meta.get("category") == category,
        aggregate=_category_score(category),
    )


HARD_PROMPT = _category_metric("hard_prompt", "hard prompts")
CREATIVE_WRITING = _category_metric("creative_writing", "creative writing")


class ArenaHardV2:
    """Arena-Hard v2.0's 750 questions with their category's baseline answer."""

    name = "arena_hard_v2"
    display = "Arena-Hard v2.0"
    metrics = (HARD_PROMPT, CREATIVE_WRITING)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        return {"uid": str(item.meta["uid"]), "category": str(item.meta["category"])}, {}

    def load(
        self,
        *,
        data_dir: Path | None = None,
        limit: int | None = None,
        seed: int = 0,
        missing_baseline: MissingBaseline = "error",
    ) -> list[PolicyItem]:
        """The questions in `question.jsonl` order; `limit` keeps the first N; `seed` is unused.

        `missing_baseline="skip"` leaves out questions without a baseline answer (logged with the count;
        `load_arena_hard` returns which).
        """
        return list(load_arena_hard(data_dir=data_dir, limit=limit, missing_baseline=missing_baseline).items)


ARENA_HARD_V2 = ArenaHardV2()
