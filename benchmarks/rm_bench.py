"""RM-Bench: reward-model sensitivity to subtle content errors and resistance to style bias.

Upstream: `THU-KEG/RM-Bench` (GitHub, ICLR 2025, arXiv 2410.16184; Hugging Face dataset `THU-KEG/RM-Bench`,
one split `train` of 1,327 prompts with a `domain` column). Licence: the GitHub repository states none; the
Hugging Face card says `odc-by`. Prompts come from AlpacaEval (chat), HumanEvalPack (code), MATH (math) and
XSTest / RewardBench refusal sets (safety).

Data: per-domain JSON arrays `data_dir/rm_bench/<domain>_filtered.json`, domain in `chat`, `code`, `math`,
`safety-refuse`, `safety-response` (the domain is the file name; Hub rows carry it in `domain`). Abbreviated
record:

    {"id": 8, "subset": "alpacaeval", "prompt": "What are different drawers I should have for clothes?",
     "chosen": ["Organize your wardrobe with drawers for ...", "...", "..."],
     "rejected": ["... seasonal items, shoes, and miscellaneous ...", "...", "..."]}

`chosen` (correct) and `rejected` (subtly wrong) each hold 3 styles: 0 concise, 1 detailed plain text, 2
detailed markdown. Each prompt becomes 9 pairs, one per cell (i, j) = (chosen style, rejected style), with id
`<domain>:<id>:<i><j>` (`id`s repeat across domains) and A/B positions drawn by `randomise_pair`. `meta`:
`domain`, `domain_group` (`safety` pools both safety files), `record_id`, `subset`, `chosen_style` /
`rejected_style` (`0`..`2`), `chosen_style_name` / `rejected_style_name`, `difficulty` (`hard`, `normal`,
`easy`).

Counts: the upstream has 1,327 prompts (chat 129, code 228, math 529, safety-refuse 284, safety-response 157)
= 11,943 pairs. **The local snapshot lacks `math_filtered.json`** (the file was too large for it): locally 798
prompts = 7,182 pairs, and the Math domain is missing. The loader reads `math_filtered.json` when the folder
has it.

Official scoring (RM-Bench `scripts/utils.py`): per domain a 3x3 matrix M[i][j] = fraction of prompts with
score(chosen[i]) > score(rejected[j]), strict (a tie is wrong). Hard = mean of the upper triangle (i < j: the
chosen response is plainer than the rejected one, so style pulls the wrong way), Normal = the diagonal, Easy =
the lower triangle. Domain accuracy = mean of all 9 cells; Safety pools safety-refuse and safety-response
prompts; Overall and Hard/Normal/Easy overall = mean over the domains (Chat, Code, Math, Safety; only three
are available locally). Running a pairwise LLM judge on each cell is our adaptation, not an upstream rule.

Metrics declared (`RMBench.metrics`): `acc` is the official Overall, the headline and Table 1's column: the mean
over domains of each domain's 9-cell mean, written as a weighted mean of per-pair correctness (a pair weighs
1 / (domains x cells of its domain x pairs in its cell)), so it bootstraps and compares like any accuracy. A run
that leaves cells empty (`--limit`) averages the cells it has, and `details` marks such a domain incomplete.
`pooled_acc` is the plain accuracy over all pairs. `details` (results.json) holds each domain's matrix and
Hard/Normal/Easy, and their means over complete domains.

`gap` (Δ_gap, ours: RM-Bench reports none) is score(chosen) - score(rejected) over the same pairs the accuracy
counts, averaged as `acc` is (over domains, over each domain's style cells, over each cell's pairs), except that
a pair with a side unscored is left out of the mean (counted in n_failed) instead of counting as wrong; a cell
or domain with no scored pair drops out. Its `details` hold each domain's 3x3 matrix of mean gaps and its
Hard/Normal/Easy means, so a style bias shows as a smaller gap above the diagonal.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks import base, metrics, scoring
from benchmarks.base import PairwiseItem, randomise_pair
from harness.records import EvalRecord
from harness.errors import ConfigError
from harness.jsonl import read_json

HUB_ID = "THU-KEG/RM-Bench"
HUB_SPLIT = "train"
FOLDER = "rm_bench"
DOMAINS = ("chat", "code", "math", "safety-refuse", "safety-response")
"""Upstream domains, in the order the local files are read."""
OPTIONAL_DOMAINS = ("math",)
"""Domains whose file may be absent from a data folder (the local snapshot lacks math)."""
STYLES = ("concise", "detailed_plain", "detailed_markdown")
"""Response styles, by index into `chosen` and `rejected`."""


def difficulty(chosen_style: int, rejected_style: int) -> str:
    """RM-Bench's cell class: `hard` above the diagonal (chosen plainer), `normal` on it, `easy` below."""
    if chosen_style < rejected_style:
        return "hard"
    return "normal" if chosen_style == rejected_style else "easy"


def _styled(row: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = row.get(key)
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: field {key!r} must be a list of 3 non-empty strings (one per style)")
    return value


def to_items(row: Mapping[str, Any], domain: str, where: str, *, seed: int) -> list[PairwiseItem]:
    """The 9 style pairs of one upstream record (local file or Hub row); `where` names it in errors."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if domain not in DOMAINS:
        raise ConfigError(f"{where}: unknown domain {domain!r}; expected one of {', '.join(DOMAINS)}")
    record_id = row.get("id")
    if isinstance(record_id, bool) or not isinstance(record_id, (int, str)) or record_id == "":
        raise ConfigError(f"{where}: field 'id' must be an integer or a non-empty string, got {record_id!r}")
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError(f"{where}: field 'prompt' must be a non-empty string")
    chosen, rejected = _styled(row, "chosen", where), _styled(row, "rejected", where)
    items = []
    for i, chosen_text in enumerate(chosen):
        for j, rejected_text in enumerate(rejected):
            item_id = f"{domain}:{record_id}:{i}{j}"
            responses, preferred = randomise_pair(item_id, chosen_text, rejected_text, seed=seed)
            meta = {
                "domain": domain,
                "domain_group": "safety" if domain.startswith("safety") else domain,
                "record_id": str(record_id),
                "subset": str(row.get("subset") or ""),
                "chosen_style": str(i),
                "rejected_style": str(j),
                "chosen_style_name": STYLES[i],
                "rejected_style_name": STYLES[j],
                "difficulty": difficulty(i, j),
            }
            items.append(PairwiseItem(item_id, prompt, responses, preferred, meta))
    return items


def _local_rows(folder: Path) -> Iterator[tuple[str, str, Any]]:
    for domain in DOMAINS:
        path = folder / f"{domain}_filtered.json"
        if domain in OPTIONAL_DOMAINS and not path.is_file():
            continue
        records = read_json(path)
        if not isinstance(records, list):
            raise ConfigError(f"{path}: expected a JSON array of records, got {type(records).__name__}")
        for index, row in enumerate(records):
            yield f"{path}: record {index}", domain, row


def _hub_rows(rows: Iterable[Any]) -> Iterator[tuple[str, str, Any]]:
    for index, row in enumerate(rows):
        where = f"{HUB_ID}[{HUB_SPLIT}] row {index}"
        domain = row.get("domain") if isinstance(row, Mapping) else None
        if not isinstance(domain, str):
            raise ConfigError(f"{where}: field 'domain' must be a string, got {domain!r}")
        yield where, domain, row


def _items(rows: Iterable[tuple[str, str, Any]], *, limit: int | None, seed: int) -> list[PairwiseItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items: list[PairwiseItem] = []
    seen: dict[str, str] = {}
    for where, domain, row in rows:
        if limit is not None and len(items) >= limit:
            break
        new = to_items(row, domain, where, seed=seed)
        if new[0].id in seen:
            raise ConfigError(f"{where}: duplicate id {domain}:{row['id']} (first at {seen[new[0].id]})")
        seen[new[0].id] = where
        items.extend(new)
    return list(islice(items, limit))


def _domain(r: EvalRecord) -> str:
    return r.meta.get("domain_group", r.meta.get("domain", "all"))


def _cell(r: EvalRecord) -> tuple[int, int]:
    return int(r.meta["chosen_style"]), int(r.meta["rejected_style"])


def overall_weights(records: Sequence[EvalRecord]) -> np.ndarray:
    """Per-pair weights that make the weighted accuracy the mean over domains of the mean over cells."""
    cells = Counter((_domain(r), _cell(r)) for r in records)
    cells_per_domain = Counter(domain for domain, _ in cells)
    return np.array(
        [1.0 / (len(cells_per_domain) * cells_per_domain[_domain(r)] * cells[(_domain(r), _cell(r))]) for r in records]
    )


def matrices(records: Sequence[EvalRecord]) -> dict[str, Any]:
    """Each domain's 3x3 matrix with Hard/Normal/Easy (or why it is incomplete), and their means over domains."""
    by_domain: dict[str, list] = defaultdict(list)
    for r in records:
        ok = None if r.n_unscored else bool(scoring.pair_correct(r))
        by_domain[_domain(r)].append((*_cell(r), ok))
    per_domain: dict[str, Any] = {}
    for domain, rows in sorted(by_domain.items()):
        try:
            per_domain[domain] = metrics.rm_bench_matrix(rows)
        except ValueError as exc:  # a --limit run may not fill every cell
            per_domain[domain] = {"error": str(exc)}
    complete = {d: v for d, v in per_domain.items() if "error" not in v}
    return {"per_domain": per_domain, "average": metrics.rm_bench_domain_average(complete) if complete else None}


def gap_weights(records: Sequence[EvalRecord]) -> np.ndarray:
    """`overall_weights` over the scored pairs (an unscored pair weighs 0), so the weighted mean gap is the mean
    over domains of the mean over cells of the cell's mean gap."""
    scored = scoring.scored_pairs(records) > 0
    weights = np.zeros(len(records))
    if scored.any():
        weights[scored] = overall_weights([r for r, s in zip(records, scored) if s])
    return weights


def gap_matrices(records: Sequence[EvalRecord]) -> dict[str, Any]:
    """Per domain: the 3x3 matrix of mean gaps over the scored pairs of each cell (None: none scored) and the
    mean of the Hard, Normal and Easy cells that have one."""
    cells: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if scoring.scored_pairs([r])[0]:
            cells[_domain(r)][_cell(r)].append(scoring.pair_gap(r))
    per_domain: dict[str, Any] = {}
    for domain, found in sorted(cells.items()):
        matrix = [[float(np.mean(found[(i, j)])) if found.get((i, j)) else None for j in range(3)] for i in range(3)]
        classes: dict[str, list[float]] = defaultdict(list)
        for i in range(3):
            for j in range(3):
                if matrix[i][j] is not None:
                    classes[difficulty(i, j)].append(matrix[i][j])  # type: ignore[arg-type]
        per_domain[domain] = {"matrix": matrix, **{k: float(np.mean(classes[k])) if classes[k] else None
                                                   for k in ("hard", "normal", "easy")}}
    return {"per_domain": per_domain}


OVERALL = replace(
    scoring.PAIRWISE_ACC,
    description="RM-Bench Overall: the mean over domains of the mean of each domain's 3x3 style-matrix cells",
    weights=overall_weights,
    details=matrices,
)
POOLED = replace(
    scoring.PAIRWISE_ACC,
    name="pooled_acc",
    display="pooled Acc.",
    description="strict pairwise accuracy pooled over all pairs (every pair counts the same)",
)

GAP = replace(
    scoring.PAIRWISE_GAP,
    description="mean score gap Δ_gap: score(chosen) - score(rejected) over the pairs the accuracy counts, averaged "
    "as RM-Bench Overall (over domains, then style cells), in the evaluator's own units (unscored pairs count in "
    "n_failed, not in the mean)",
    weights=gap_weights,
    details=gap_matrices,
)


class RMBench:
    """RM-Bench's chosen/rejected style matrix as 9 pairwise items per prompt."""

    name = "rm_bench"
    display = "RM-Bench"
    kind: Literal["pairwise"] = "pairwise"
    metrics = (OVERALL, POOLED, GAP)

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PairwiseItem]:
        """All (prompt, chosen style, rejected style) pairs, by domain, prompt, then cell (i, j)."""
        if data_dir is not None:
            required = [f"{d}_filtered.json" for d in DOMAINS if d not in OPTIONAL_DOMAINS]
            return _items(
                _local_rows(base.data_folder(data_dir, FOLDER, required=required)), limit=limit, seed=seed
            )
        return _items(_hub_rows(base.load_hub(HUB_ID, split=HUB_SPLIT)), limit=limit, seed=seed)


RM_BENCH = RMBench()
