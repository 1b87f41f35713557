"""Parse a rubric generator's text into `(criterion, weight)` pairs, strictly.

The generator is asked for strict JSON: `[{"criterion": "...", "weight": 3}, ...]`. Small models miss that
format in a few predictable ways. This parser accepts exactly the near-misses below and rejects everything
else with a `RubricParseError` whose message says what to fix (it is sent back to the model on a retry).

Accepted:
- Thinking blocks: text inside `<think>...</think>` is dropped first, and so is everything before a lone
  `</think>` (templates that open the block in the prompt), so draft rubrics in the reasoning never count.
- Prose around the JSON, and markdown code fences (treated as prose): every JSON value in the text is found.
  The same rubric repeated verbatim counts once.
- A JSON object wrapping the list under any key (`{"rubric": [...]}`, `{"items": [...]}`), next to other keys
  if need be; one level of wrapping only. A list looks like a rubric when one of its objects has a key below.
- Key names, matched after case-folding, stripping and mapping spaces/hyphens to `_`: the criterion from
  `criterion`, `item`, `description`, `text`, `rubric_item`; the weight from `weight`, `w`, `score`,
  `importance`. Other keys (`id`, `rationale`, ...) are ignored.
- Weights given as JSON integers, floats equal to an integer (`3.0`) or digit strings (`"3"`, `"3.0"`).
- Only when the text holds no JSON rubric: a numbered (`1.`, `1)`) or bulleted (`-`, `*`, `+`, `•`) list, one
  item per line, every list line carrying one weight marker at its start or its end. Markers: `(weight: 3)`,
  `(weight 3)`, `[weight=3]`, `(w=2)`, `[w: 2]`, a bare bracketed number `[4]`, or a trailing `weight 5` /
  `weight: 5` after one of `—`, `–`, ` -`, `:`, `,`, `;`, `|`. Markdown bold (`**`) is removed from list lines
  first; lines that are not list lines are ignored.

Merged, not rejected: a criterion that repeats an earlier one after `normalise_criterion` is dropped, the first
occurrence kept with its weight, and the number merged is returned (the evaluator records it in its trace as
`rubric_merged`). A valid rubric with a repeated line keeps its distinct items rather than losing the whole set;
repeats would otherwise count the same check several times. A repeat with an invalid weight is still a problem.

Rejected: no items; a weight outside 1..5, not an integer (`2.5`, `"high"`, `true`) or missing; an empty or
non-string criterion; two criterion keys (or two weight keys) in one object; two different JSON lists that both
look like rubrics; JSON objects outside a list; list
lines where some carry a weight marker and others don't, or a line with two markers; invalid (e.g. cut-off)
JSON. Every problem found is reported, item by item, in one message.

Accepted criteria are stored with runs of whitespace collapsed to one space.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["CRITERION_KEYS", "WEIGHT_KEYS", "RubricParseError", "normalise_criterion", "parse_rubric_items"]

CRITERION_KEYS: tuple[str, ...] = ("criterion", "item", "description", "text", "rubric_item")
"""Accepted JSON keys for the criterion text (after case-folding), preferred first."""
WEIGHT_KEYS: tuple[str, ...] = ("weight", "w", "score", "importance")
"""Accepted JSON keys for the integer weight (after case-folding), preferred first."""
MIN_WEIGHT, MAX_WEIGHT = 1, 5
_MAX_PROBLEMS = 8  # a longer complaint helps neither a model nor a person
_MISSING = object()  # a key the item does not have (a JSON null is a present, invalid value)


class RubricParseError(ValueError):
    """The generator's text does not hold exactly one valid rubric; the message says why, item by item."""


def normalise_criterion(text: str) -> str:
    """The key for duplicate detection: case-folded, whitespace collapsed, trailing `.,;:!?` cut."""
    return " ".join(text.casefold().split()).rstrip(".,;:!? ")


def parse_rubric_items(text: str) -> tuple[list[tuple[str, int]], int]:
    """Parse generator output into `(criterion, weight)` pairs in their written order.

    Args:
        text: the generator's raw completion.

    Returns:
        At least one pair (criteria non-empty and distinct after `normalise_criterion`; weights ints in 1..5),
        and how many repeated criteria were merged into their first occurrence (see the module docstring).

    Raises:
        RubricParseError: no rubric, more than one, or an invalid one (see the module docstring).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_rubric expects a str, got {type(text).__name__}")
    if not text.strip():
        raise RubricParseError('empty output: expected a JSON list like [{"criterion": "...", "weight": 3}]')
    text = _drop_thinking(text)
    if not text.strip():
        raise RubricParseError("nothing after the thinking block: write the rubric after </think>")
    values, json_errors = _embedded_json(text)

    lists_of_objects: list[list] = []
    found_empty_list = False
    loose_items = 0
    for value in values:
        wrapped = _rubric_lists(value)
        if not wrapped and isinstance(value, dict) and _has_item_keys(value):
            loose_items += 1
        for candidate in wrapped:
            if candidate:
                lists_of_objects.append(candidate)
            else:
                found_empty_list = True
    rubric_like = _distinct([c for c in lists_of_objects if any(_has_item_keys(o) for o in c)])
    if len(rubric_like) > 1:
        raise RubricParseError(
            f"found {len(rubric_like)} different JSON lists that look like rubrics; answer with exactly one"
        )
    if rubric_like:
        return _finish(_items_from_json(rubric_like[0]))
    lines, list_problem = _items_from_lines(text)
    if lines is not None:
        return _finish(lines)
    if lists_of_objects:
        keys = sorted({str(k) for obj in lists_of_objects[0] if isinstance(obj, dict) for k in obj})
        raise RubricParseError(
            f"found a JSON list of objects with keys {keys} but no criterion or weight key; "
            'use "criterion" (a string) and "weight" (an integer 1..5)'
        )
    if json_errors:
        raise RubricParseError(_describe_json_error(text, *json_errors[0]))
    if loose_items:
        raise RubricParseError(
            f"found {loose_items} JSON object(s) with rubric keys outside a list; "
            'put every item in one JSON list: [{"criterion": "...", "weight": 3}, ...]'
        )
    if list_problem:
        raise RubricParseError(list_problem)
    if found_empty_list:
        raise RubricParseError("the rubric has no items; give at least one criterion with a weight")
    raise RubricParseError('no rubric found: expected a JSON list like [{"criterion": "...", "weight": 3}]')


# --- JSON ---

_OPENERS = re.compile(r"[\[{]")
_LOOKS_LIKE_JSON = re.compile(r'[\[{]\s*[{"]')


def _drop_thinking(text: str) -> str:
    text = re.sub(r"<think>.*?</think>", " ", text, flags=re.S)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]  # an unclosed block runs to the end


def _embedded_json(text: str) -> tuple[list[Any], list[tuple[json.JSONDecodeError, int]]]:
    """Every JSON list or object in `text` (outermost only), and failures where JSON seemed to begin."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    errors: list[tuple[json.JSONDecodeError, int]] = []
    pos = 0
    while (match := _OPENERS.search(text, pos)) is not None:
        start = match.start()
        try:
            value, end = decoder.raw_decode(text, start)
        except RecursionError:
            raise RubricParseError("JSON nested too deeply; a rubric is one flat list of objects") from None
        except json.JSONDecodeError as exc:
            if _LOOKS_LIKE_JSON.match(text, start):
                errors.append((exc, start))
            pos = start + 1
            continue
        values.append(value)
        pos = end
    return values, errors


def _rubric_lists(value: Any) -> list[list]:
    """Lists holding at least one object (or empty lists) that `value` is or directly wraps."""
    lists = [value] if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
    return [v for v in lists if isinstance(v, list) and (not v or any(isinstance(x, dict) for x in v))]


def _norm_key(key: Any) -> str:
    return re.sub(r"[\s\-]+", "_", str(key).strip().casefold())


def _has_item_keys(obj: Any) -> bool:
    return isinstance(obj, dict) and any(
        _norm_key(k) in CRITERION_KEYS or _norm_key(k) in WEIGHT_KEYS for k in obj
    )


def _distinct(candidates: list[list]) -> list[list]:
    seen: dict[str, list] = {}
    for c in candidates:
        seen.setdefault(json.dumps(c, sort_keys=True, default=str), c)
    return list(seen.values())


def _items_from_json(objects: list) -> list[tuple[int, Any, Any, list[str]]]:
    """One `(index, criterion, raw weight, problems)` per object; `_MISSING` stands for an absent key."""
    out = []
    for i, obj in enumerate(objects, start=1):
        if not isinstance(obj, dict):
            shown = json.dumps(obj, default=str)[:40]
            problem = f'item {i}: expected an object {{"criterion": ..., "weight": ...}}, got {shown}'
            out.append((i, _MISSING, _MISSING, [problem]))
            continue
        problems: list[str] = []
        found = []
        for kind, accepted, hint in (
            ("criterion", CRITERION_KEYS, 'key "criterion"'),
            ("weight", WEIGHT_KEYS, 'key "weight", an integer 1..5'),
        ):
            keys = [k for k in obj if _norm_key(k) in accepted]
            if len(keys) > 1:
                problems.append(f"item {i}: several {kind} keys {keys}; give exactly one")
            elif not keys:
                problems.append(f"item {i}: missing {kind} ({hint})")
            found.append(obj[keys[0]] if len(keys) == 1 else _MISSING)
        out.append((i, found[0], found[1], problems))
    return out


def _describe_json_error(text: str, exc: json.JSONDecodeError, start: int) -> str:
    rest = text[start:]
    unclosed = rest.count("[") + rest.count("{") > rest.count("]") + rest.count("}")
    hint = " (the output looks cut off: brackets are not closed)" if unclosed else ""
    return f"invalid JSON: {exc.msg}: line {exc.lineno} column {exc.colno}{hint}"


# --- list lines ---

_LIST_LINE = re.compile(r"^\s*(?:\d{1,3}[.)]|[-*+•])\s+(?P<body>\S.*?)\s*$")
_LABEL = r"(?:weight\s*[:=]?|w\s*[:=])\s*"
_LEADING = (
    re.compile(r"^\[\s*(?P<val>[+-]?\d[\d.]*)\s*\]\s*(?P<rest>.*)$"),
    re.compile(rf"^[\[(]\s*{_LABEL}(?P<val>[^\])\s]+)\s*[\])]\s*(?P<rest>.*)$", re.I),
)
_TRAILING = (
    re.compile(rf"^(?P<rest>.*?)\s*[\[(]\s*{_LABEL}(?P<val>[^\])\s]+)\s*[\])]\s*[.,;]?$", re.I),
    re.compile(r"^(?P<rest>.*?)\s*\[\s*(?P<val>[+-]?\d[\d.]*)\s*\]\s*[.,;]?$"),
    re.compile(r"^(?P<rest>.*?)\s*(?:[—–|,;:]|\s-)\s*weight\s*[:=]?\s*(?P<val>\S+?)\s*\.?$", re.I),
)
_SEPARATORS = " \t—–-:|,;"


def _items_from_lines(text: str) -> tuple[list[tuple[int, Any, Any, list[str]]] | None, str | None]:
    """Items from a numbered/bulleted list, or `(None, why not)` when the text holds no weighted list."""
    bodies = [m["body"] for line in text.splitlines() if (m := _LIST_LINE.match(line.replace("**", "")))]
    if not bodies:
        return None, None
    parsed = []  # per line: the leading and/or trailing weight markers found (at most one of each)
    for body in bodies:
        lead = [m for p in _LEADING if (m := p.match(body))][:1]
        trail = [m for p in _TRAILING if (m := p.match(lead[0]["rest"] if lead else body))][:1]
        parsed.append(lead + trail)
    unweighted = [i for i, markers in enumerate(parsed, start=1) if not markers]
    if len(unweighted) == len(parsed):
        return None, (
            f"found {len(parsed)} list line{'s' if len(parsed) > 1 else ''} but none has a weight marker; "
            'answer with a JSON list like [{"criterion": "...", "weight": 3}]'
        )
    if unweighted:
        which = f"list line {unweighted[0]} has" if len(unweighted) == 1 else f"list lines {unweighted} have"
        return None, (
            f"{which} no weight marker while others do; "
            'give every item a weight, e.g. "1. Mentions X (weight: 3)"'
        )
    out = []
    for i, markers in enumerate(parsed, start=1):
        problems = [f"item {i}: two weight markers; give exactly one"] if len(markers) > 1 else []
        criterion = markers[-1]["rest"].strip(_SEPARATORS)
        out.append((i, criterion, markers[0]["val"], problems))
    return out, None


# --- shared checks ---


def _coerce_weight(raw: Any) -> int | str:
    """The integer weight, or a problem description."""
    if isinstance(raw, bool) or raw is None:
        return f"weight {json.dumps(raw)} is not an integer 1..5"
    if isinstance(raw, str):
        s = raw.strip()
        if not re.fullmatch(r"[+-]?\d+(?:\.0*)?", s):
            return f"weight {raw!r} is not an integer 1..5"
        value = int(s.split(".")[0])
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if not math.isfinite(raw) or not raw.is_integer():
            return f"weight {raw!r} is not an integer 1..5"
        value = int(raw)
    else:
        return f"weight must be an integer 1..5, got a {type(raw).__name__}"
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:
        return f"weight {value} is outside {MIN_WEIGHT}..{MAX_WEIGHT}"
    return value


def _finish(items: list[tuple[int, Any, Any, list[str]]]) -> tuple[list[tuple[str, int]], int]:
    """Check every item, report all problems at once, or return the clean pairs."""
    problems: list[str] = []
    result: list[tuple[str, int]] = []
    first_seen: dict[str, int] = {}
    merged = 0
    for i, criterion, raw_weight, item_problems in items:
        problems.extend(item_problems)
        ok = not item_problems
        weight: int | str = ""
        if raw_weight is not _MISSING:
            weight = _coerce_weight(raw_weight)
            if isinstance(weight, str):
                problems.append(f"item {i}: {weight}")
                ok = False
        if criterion is not _MISSING:
            if not isinstance(criterion, str):
                problems.append(
                    f"item {i}: criterion must be a string, got {json.dumps(criterion, default=str)}"
                )
                continue
            criterion = " ".join(criterion.split())
            key = normalise_criterion(criterion)
            if not key:
                problems.append(f"item {i}: criterion is empty")
                continue
            if key in first_seen:
                merged += ok
                continue
            first_seen[key] = i
        if ok:
            result.append((criterion, weight))
    if problems:
        more = len(problems) - _MAX_PROBLEMS
        raise RubricParseError(
            "; ".join(problems[:_MAX_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        )
    if not result:
        raise RubricParseError("the rubric has no items; give at least one criterion with a weight")
    return result, merged
