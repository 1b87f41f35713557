"""AlpacaEval 2: 805 instructions a policy answers, judged pairwise against GPT-4 Turbo's reference outputs.

Upstream: `tatsu-lab/alpaca_eval` (GitHub; code Apache-2.0, **data CC BY-NC 4.0**). The 805 instructions
come from self-instruct (252), OASST (188), Koala (156), Anthropic helpful-base (129) and Vicuna (80).
AlpacaEval 2's reference (baseline) model is `gpt4_1106_preview`. There is no numeric id upstream: AlpacaEval
joins a policy's outputs to the reference by instruction text, while the length-controlled GLM joins by
position in the 805-order. So item ids are positions (`alpaca_eval:0000` .. `alpaca_eval:0804`) and the
instruction text rides in `meta`.
One record (abbreviated):

    {"dataset": "helpful_base",
     "instruction": "What are the names of some famous actors that started their careers on Broadway?",
     "output": "Several famous actors started their careers on Broadway before making it big in ...",
     "generator": "gpt4_1106_preview"}

Data (`data_dir/alpaca_eval2/`): `reference_gpt4_1106_preview_model_outputs.json`, the repo's
`results/gpt4_1106_preview/model_outputs.json` (a JSON array of the record above), read in file order.
Hub (the default): the dataset `tatsu-lab/alpaca_eval` is a loading-script dataset (config
`alpaca_eval_gpt4_baseline`, split `eval`), which `datasets` >= 4 no longer runs; so its JSON file
`alpaca_eval_gpt4_baseline.json` (the same 805 records, same order) is read directly with the `json` builder.

Items: messages = one user turn holding the instruction. `meta`: `index` (position, int), `instruction`,
`reference` (the reference `output`), `reference_generator`, `dataset`. Checked: 805 records when not limited,
every instruction a non-empty string and unique (the join key), the other fields strings.

Official scoring (in `benchmarks/alpaca_eval2_score.py`, by the `alpaca-eval` package's own functions): the judge
`weighted_alpaca_eval_gpt4_turbo` compares the reference (`output_1`) with the policy's answer (`output_2`);
`preference` in [1, 2] from the judge's logprobs; win rate = 100 * mean(preference - 1); the headline is the
length-controlled win rate (its GLM).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks import base
from benchmarks.alpaca_eval2_score import alpaca_metrics, length_controlled
from benchmarks.base import PolicyItem
from benchmarks.scoring import Aggregate, Metric, Unavailable
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_json

HUB_ID = "tatsu-lab/alpaca_eval"
HUB_FILE = "alpaca_eval_gpt4_baseline.json"
HUB_DATA_FILES = f"hf://datasets/{HUB_ID}/{HUB_FILE}"
"""The AlpacaEval 2 set on the Hub, read with the `json` builder (the repo's script needs datasets < 4)."""
FOLDER = "alpaca_eval2"
FILENAME = "reference_gpt4_1106_preview_model_outputs.json"
N_INSTRUCTIONS = 805
FIELDS = ("instruction", "output", "generator", "dataset")


def item_id(index: int) -> str:
    """The id of the instruction at `index` in the 805-order."""
    return f"alpaca_eval:{index:04d}"


def to_item(row: Any, index: int, where: str) -> PolicyItem:
    """One upstream record (`index` = its position in the 805-order) as a policy item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ConfigError(
            f"{where}: missing field(s) {', '.join(missing)}; fields found: {', '.join(map(str, row))}"
        )
    for f in FIELDS:
        if not isinstance(row[f], str):
            raise ConfigError(f"{where}: field {f!r} must be a string, got {type(row[f]).__name__}")
    if not row["instruction"].strip():
        raise ConfigError(f"{where}: empty instruction")
    meta = {
        "index": index,
        "instruction": row["instruction"],
        "reference": row["output"],
        "reference_generator": row["generator"],
        "dataset": row["dataset"],
    }
    return PolicyItem(item_id(index), (Message("user", row["instruction"]),), meta)


def _items(rows: Iterable[Any], *, source: str, limit: int | None) -> list[PolicyItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items = [to_item(row, index, f"{source}: record {index}") for index, row in enumerate(rows)]
    if limit is None and len(items) != N_INSTRUCTIONS:
        raise ConfigError(f"{source}: expected {N_INSTRUCTIONS} AlpacaEval instructions, found {len(items)}")
    counts = Counter(item.meta["instruction"] for item in items)
    repeated = [text for text, n in counts.items() if n > 1]
    if repeated:
        shown = "; ".join(
            f"{text[:60]!r} at records {[i.meta['index'] for i in items if i.meta['instruction'] == text]}"
            for text in repeated[:3]
        )
        raise ConfigError(
            f"{source}: {len(repeated)} instruction(s) repeated (AlpacaEval joins on the text): {shown}"
        )
    return items[:limit]


def _local_rows(data_dir: Path) -> tuple[str, list[Any]]:
    try:
        path = base.data_folder(data_dir, FOLDER, required=[FILENAME]) / FILENAME
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; upstream: GitHub {HUB_ID} results/gpt4_1106_preview/model_outputs.json"
        ) from None
    rows = read_json(path)
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: expected a JSON array of records, got {type(rows).__name__}")
    return str(path), rows


def _hub_rows() -> tuple[str, Any]:
    """The Hub JSON file through `datasets`' `json` builder (a single `train` split)."""
    hint = (f"offline, pass --data-dir with {FOLDER}/{FILENAME} (the GitHub "
            "results/gpt4_1106_preview/model_outputs.json)")
    return HUB_DATA_FILES, base.load_json_file(HUB_DATA_FILES, hint=hint)


# --- metrics over judged records (`judges.policy`: scores = (preference,), trace["annotation"] the texts) ---


def _preference(record: Any) -> float | None:
    return record.scores[0] if record.scores else None


def _judged(record: Any) -> bool:
    return _preference(record) is not None


def _weights(records: Any) -> np.ndarray:
    return np.array([float(_judged(r)) for r in records])


def _discrete(record: Any) -> float:
    p = _preference(record)
    return 0.0 if p is None else 1.0 if p > 1.5 else 0.5 if p == 1.5 else 0.0


def annotations(records: Any) -> list[dict[str, Any]]:
    """alpaca_eval annotation rows of the judged records, in dataset order (`alpaca_metrics` reads them)."""
    rows = []
    for r in sorted(records, key=lambda r: int(r.meta["index"])):
        if _judged(r):
            rows.append({**r.trace["annotation"], "generator_2": r.evaluator,
                         "annotator": (r.trace.get("judge") or {}).get("model", "judge"),
                         "preference": _preference(r)})
    return rows


def _leaderboard(records: Any) -> dict[str, Any]:
    """alpaca_eval's `get_winrate` numbers (standard error, wins, draws) and `avg_length`."""
    rows = annotations(records)
    try:
        return alpaca_metrics(rows) if rows else {}
    except ConfigError as exc:
        return {"unavailable": str(exc)}


def _length_controlled(records: Any) -> Aggregate:
    indices = {int(r.meta["index"]) for r in records}
    if len(records) != N_INSTRUCTIONS or indices != set(range(N_INSTRUCTIONS)):
        raise Unavailable(f"the length-controlled win rate needs all {N_INSTRUCTIONS} instructions judged; "
                          f"the run holds {len(indices)} (--limit)")
    failed = sum(not _judged(r) for r in records)
    if failed:
        raise Unavailable(f"the length-controlled win rate needs every instruction judged; {failed} judgments "
                          "failed")
    rows = annotations(records)
    try:
        found = length_controlled(rows, [row["instruction"] for row in rows])
    except ConfigError as exc:
        raise Unavailable(str(exc)) from None
    value, se = found["length_controlled_winrate"] / 100, found["lc_standard_error"] / 100
    return Aggregate(value, (value - 1.96 * se, value + 1.96 * se), found)


_JUDGED = "; a failed judgment is left out and counted in n_failed"
WIN_RATE = Metric(
    "win_rate", "WR",
    "win rate against the reference: mean of (preference - 1), the judge's P(policy's answer is better) "
    "(alpaca_eval's win_rate)" + _JUDGED,
    lambda r: (_preference(r) or 1.0) - 1.0, lambda r: _preference(r) == 1.5, binary=False, weights=_weights,
    failed=lambda r: not _judged(r), details=_leaderboard,
)
DISCRETE_WIN_RATE = Metric(
    "discrete_win_rate", "discrete WR",
    "discrete win rate: a preference above 1.5 wins, 1.5 draws (half), below loses (alpaca_eval's "
    "discrete_win_rate)" + _JUDGED,
    _discrete, lambda r: _preference(r) == 1.5, binary=False, weights=_weights, failed=lambda r: not _judged(r),
)
LC_WIN_RATE = Metric(
    "lc_win_rate", "LC",
    "length-controlled win rate by alpaca_eval's length_controlled_v1 GLM (needs all 805 instructions judged "
    "and df_gamed.csv from the Hugging Face Hub); interval +-1.96 x its standard error; compare gates the win "
    "rate instead",
    lambda r: (_preference(r) or 1.0) - 1.0, lambda r: _preference(r) == 1.5, binary=False, weights=_weights,
    failed=lambda r: not _judged(r), aggregate=_length_controlled, gated=False,
)


class AlpacaEval2:
    """AlpacaEval 2's 805 instructions with the `gpt4_1106_preview` reference outputs."""

    name = "alpaca_eval2"
    display = "AlpacaEval 2"
    metrics = (LC_WIN_RATE, WIN_RATE, DISCRETE_WIN_RATE)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        return {"index": str(item.meta["index"]), "dataset": str(item.meta.get("dataset", ""))}, {}

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PolicyItem]:
        """The instructions in the upstream order; `limit` keeps the first N; `seed` is unused."""
        source, rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, source=source, limit=limit)


ALPACA_EVAL2 = AlpacaEval2()
