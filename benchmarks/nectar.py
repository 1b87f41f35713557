"""Nectar: 7 responses per prompt ranked by GPT-4; its LMSYS-Chat-1M prompts form a listwise benchmark.

Upstream: Hugging Face `berkeley-nest/Nectar` (Starling project, UC Berkeley; code GitHub
`efrick2002/Starling`), config `default`, one split `train` (`data/rlaif.parquet`, ~183k rows; 182,954 is
quoted but unverified offline). Licence: the current card says Apache-2.0 on condition the data is not used to
compete with OpenAI (an older card said CC BY-NC 4.0); the responses include GPT-4/3.5 and Anthropic outputs,
whose terms also apply. Abbreviated record:

    {"prompt": "\\n\\nHuman: What is the best way to dress in below freezing weather?\\n\\nAssistant: ",
     "answers": [{"answer": "Finding a visually appealing ski mask ...", "model": "gpt-4", "rank": 5.0},
                 {"answer": "A visually appealing ski mask should ...", "model": "anthropic", "rank": 7.0},
                 {"answer": "When looking for a visually ...", "model": "gpt-3.5-turbo", "rank": 1.0}, "..."],
     "turns": 1, "num_responses": 7, "source": ["lmsys-chat-1m"], "good_natured": true}

Two uses, split by `source` so the evaluation prompts never serve as training anchors:
- `nectar_lmsys` (registered benchmark, listwise): rows whose `source` list contains `"lmsys-chat-1m"` (the
  string the authors' build notebook writes). The size of this subset is not known offline (27 of a 100-row
  authors' sample).
- `nectar_anchors()`: every other row (anthropic-hh, sharegpt, UltraFeedback's sources ...) as `AnchorSet`s,
  the responses in gold rank order, for the generator's anchor reward (`judges.rubric.anchor_reward`).
  Training-side filtering (the paper's Appendix B rules) is left to the training code.

Items: responses in upstream `answers` order (which is *not* rank order), gold rank = int(`rank`) (1.0 best
... 7.0 worst; float-typed but integer-valued; the ranking prompt asked GPT-4 to break ties, so every row must
hold a permutation of 1..K, checked). Item id = `nectar:<row index in the train split>` (stable for one
dataset revision; Nectar has no id column). `meta`: `row`, `source` (comma-joined), `turns`, `models`
(comma-joined, upstream order).

The prompt: `prompt` is an Anthropic-HH style transcript
`"\\n\\nHuman: ...\\n\\nAssistant: ...\\n\\nHuman: ...\\n\\nAssistant: "` ending with an open Assistant turn.
A single Human turn becomes the prompt text itself; a multi-turn conversation is rendered as a readable
transcript `User: ...\\n\\nAssistant: ...\\n\\nUser: ...` (the earlier assistant replies are context; the
responses answer the last user turn). Consecutive turns of one role (they occur in HH rows) are kept as they
are, and so is text inside a turn that merely contains "Human:" without the blank line before it.

Data: the real rows are read from the Hub (`load_dataset("berkeley-nest/Nectar", split="train")`). A data
folder `data_dir/nectar/` must hold the Hub file `data/rlaif.parquet` (or `rlaif.parquet`, or the same rows as
JSON lines in `rlaif.jsonl`). The project's reference folder holds only two ablation files from the authors'
repository (format samples: 194 rows with ranks but no `source`, 100 rows with `source` but no ranks); they
are not the benchmark and are used only to test the row mapping.

Scoring: listwise metrics (`benchmarks.metrics`): strict top-1 accuracy (the rank-1 response must get the unique
highest score) and nDCG over the 7 responses with rel = K - rank. Nectar itself publishes no evaluation rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from benchmarks import base, scoring
from benchmarks.base import ListwiseItem
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "berkeley-nest/Nectar"
HUB_SPLIT = "train"
FOLDER = "nectar"
LMSYS_SOURCE = "lmsys-chat-1m"
LOCAL_FILES = ("data/rlaif.parquet", "rlaif.parquet", "rlaif.jsonl")
"""Accepted files in `data_dir/nectar/`, first found wins."""
_TURN = re.compile(r"\n\n(Human|Assistant): ?")
_ROLES = {"Human": "User", "Assistant": "Assistant"}


@dataclass(frozen=True, slots=True)
class AnchorSet:
    """One Nectar prompt with its human-ranked (GPT-4-ranked) responses, for the anchor reward."""

    id: str
    """`nectar:<row index in the train split>`."""
    prompt: str
    """The user prompt, rendered as for `nectar_lmsys`."""
    responses_in_rank_order: tuple[str, ...]
    """The responses, best (rank 1) first."""


def split_turns(text: str) -> list[tuple[str, str]]:
    """(role, text) turns of an HH-style transcript, role `User` or `Assistant`; empty last turn dropped."""
    parts = _TURN.split(text)
    turns = [("User", parts[0].strip())] if parts[0].strip() else []
    turns += [(_ROLES[role], body.strip()) for role, body in zip(parts[1::2], parts[2::2])]
    if turns and turns[-1] == ("Assistant", ""):
        turns.pop()
    return turns


def extract_prompt(text: str, where: str = "prompt") -> str:
    """The user prompt of a Nectar `prompt`: the single user turn, or a `User:`/`Assistant:` transcript."""
    turns = split_turns(text) if isinstance(text, str) else []
    if not any(role == "User" and body for role, body in turns):
        raise ConfigError(f"{where}: field 'prompt' has no non-empty Human turn")
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{role}: {body}" for role, body in turns)


def sources_of(row: Any, where: str) -> tuple[str, ...]:
    """The row's `source` list (a row may merge duplicates from several sources)."""
    value = row.get("source") if isinstance(row, Mapping) else None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(s, str) for s in value):
        raise ConfigError(f"{where}: field 'source' must be a non-empty list of strings, got {value!r}")
    return tuple(value)


def ranked_answers(row: Any, where: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(answers, gold ranks, models), aligned, in upstream order; the ranks must be a permutation of 1..K."""
    answers = row.get("answers") if isinstance(row, Mapping) else None
    if not isinstance(answers, list) or len(answers) < 2:
        raise ConfigError(
            f"{where}: field 'answers' must be a list of at least 2 {{answer, model, rank}} objects"
        )
    texts, ranks, models = [], [], []
    for i, answer in enumerate(answers):
        if not isinstance(answer, Mapping) or not isinstance(answer.get("answer"), str):
            raise ConfigError(f"{where}: answers[{i}] must be an object with a string 'answer'")
        rank = answer.get("rank")
        integral = isinstance(rank, (int, float)) and math.isfinite(rank) and rank == int(rank)
        if isinstance(rank, bool) or not integral:
            raise ConfigError(f"{where}: answers[{i}] has no integer-valued 'rank' (got {rank!r})")
        texts.append(answer["answer"])
        ranks.append(int(rank))
        models.append(str(answer.get("model") or ""))
    if sorted(ranks) != list(range(1, len(ranks) + 1)):
        raise ConfigError(f"{where}: ranks {ranks} are not a permutation of 1..{len(ranks)}")
    return tuple(texts), tuple(ranks), tuple(models)


def to_item(row: Any, index: int, where: str) -> ListwiseItem:
    """One Nectar row (`index` = its row in the train split) as a listwise item; `source` is optional here."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    texts, ranks, models = ranked_answers(row, where)
    meta = {"row": str(index), "models": ",".join(models)}
    if "source" in row:
        meta["source"] = ",".join(sources_of(row, where))
    if row.get("turns") is not None:
        meta["turns"] = str(row["turns"])
    return ListwiseItem(f"nectar:{index}", extract_prompt(row.get("prompt"), where), texts, ranks, meta)


def to_anchor(row: Any, index: int, where: str) -> AnchorSet:
    """One Nectar row as an anchor set: the prompt and its responses best first."""
    item = to_item(row, index, where)
    order = sorted(range(len(item.responses)), key=item.gold_ranks.__getitem__)
    return AnchorSet(item.id, item.prompt, tuple(item.responses[i] for i in order))


def read_rows(path: Path) -> Iterator[tuple[int, str, Any]]:
    """(row index, location, row) of a Nectar JSON-lines or parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets depends on pyarrow

        from pyarrow import ArrowException

        index = 0
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield index, f"{path}: row {index}", row
                    index += 1
        except (OSError, ArrowException) as exc:  # ArrowInvalid (not parquet, torn) is a ValueError
            raise ConfigError(f"{path}: not a readable parquet file ({exc})") from None
        return
    for index, (where, row) in enumerate(read_jsonl(path)):
        yield index, where, row


def local_file(data_dir: Path) -> Path:
    """The Nectar file under `data_dir` (`FOLDER`, the first of `LOCAL_FILES` found).

    Raises:
        ConfigError: naming the folder, the files it should hold and the Hub as the other source.
    """
    hint = f"the data is on the Hugging Face Hub ({HUB_ID}, split {HUB_SPLIT})"
    try:
        folder = base.data_folder(data_dir, FOLDER, required=())
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {hint}") from None
    for name in LOCAL_FILES:
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(
        f"{folder}: missing {' or '.join(LOCAL_FILES)} (the Nectar rows; ablation_*.jsonl files are format "
        f"samples, not the benchmark); {hint}"
    )


def _rows(data_dir: Path | None, *, lmsys: bool) -> Iterator[tuple[int, str, Any]]:
    """Rows whose sources include LMSYS-Chat-1M (`lmsys=True`) or do not, with their split index and location.

    The file or Hub split is opened here (so a missing one fails at once); rows are read lazily.
    """

    def wanted(row: Any, where: str) -> bool:
        return (LMSYS_SOURCE in sources_of(row, where)) == lmsys

    if data_dir is not None:
        path = local_file(Path(data_dir))
        return ((index, where, row) for index, where, row in read_rows(path) if wanted(row, where))
    rows = base.load_hub(HUB_ID, split=HUB_SPLIT)
    hub = f"{HUB_ID}[{HUB_SPLIT}] row"
    if hasattr(rows, "select") and "source" in getattr(rows, "column_names", ()):
        # A `datasets.Dataset`: filter on the small `source` column before materialising any answers.
        keep = [i for i, s in enumerate(rows["source"]) if wanted({"source": s}, f"{hub} {i}")]
        return ((i, f"{hub} {i}", row) for i, row in zip(keep, rows.select(keep)))
    return ((i, f"{hub} {i}", row) for i, row in enumerate(rows) if wanted(row, f"{hub} {i}"))


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")


class NectarLMSYS:
    """Nectar's LMSYS-Chat-1M prompts: 7 responses each with GPT-4 gold ranks."""

    name = "nectar_lmsys"
    display = "LMSYS-Chat-1M"
    metrics = scoring.LISTWISE
    kind: Literal["listwise"] = "listwise"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[ListwiseItem]:
        """The LMSYS rows in split order; `seed` is unused (responses keep upstream order)."""
        _check_limit(limit)
        return [
            to_item(row, index, where) for index, where, row in islice(_rows(data_dir, lmsys=True), limit)
        ]


def nectar_anchors(*, data_dir: Path | None = None, limit: int | None = None) -> Iterator[AnchorSet]:
    """The training anchors: every Nectar row *not* from LMSYS-Chat-1M, responses best first, in split order.

    Raises:
        ConfigError: for a missing data folder or file, or a malformed row (naming file and line, or Hub row).
    """
    _check_limit(limit)
    return (to_anchor(row, index, where) for index, where, row in islice(_rows(data_dir, lmsys=False), limit))


NECTAR_LMSYS = NectarLMSYS()
