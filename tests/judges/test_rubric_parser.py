"""The rubric parser on a corpus of generator outputs, and the Rubric record it produces."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from judges.rubric import Rubric, RubricItem, RubricParseError, parse_rubric


def _load_corpus():
    path = Path(__file__).with_name("rubric_corpus.py")
    spec = importlib.util.spec_from_file_location("rubric_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CORPUS = _load_corpus()


def test_corpus_is_large_and_ids_unique():
    ids = [case[0] for case in CORPUS.CASES]
    assert len(ids) >= 30
    assert len(ids) == len(set(ids))
    assert len(CORPUS.GOOD) >= 15 and len(CORPUS.BAD) >= 15


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CORPUS.GOOD], ids=[c[0] for c in CORPUS.GOOD])
def test_parses_good_outputs(text, expected):
    rubric = parse_rubric(text)
    assert [(item.criterion, item.weight) for item in rubric.items] == expected
    assert all(type(item.weight) is int for item in rubric.items)


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CORPUS.BAD], ids=[c[0] for c in CORPUS.BAD])
def test_rejects_bad_outputs(text, message):
    with pytest.raises(RubricParseError) as info:
        parse_rubric(text)
    assert message in str(info.value)


def test_repeated_criteria_are_merged_and_counted():
    text = ('[{"criterion": "True", "weight": 3}, {"criterion": "True", "weight": 5}, '
            '{"criterion": "False", "weight": 5}, {"criterion": "true.", "weight": 1}]')
    rubric = parse_rubric(text)
    assert [(i.criterion, i.weight) for i in rubric.items] == [("True", 3), ("False", 5)]
    assert rubric.merged == 2
    assert parse_rubric('[{"criterion": "A", "weight": 1}]').merged == 0
    with pytest.raises(RubricParseError, match="item 2: weight 9"):  # a repeat is still checked
        parse_rubric('[{"criterion": "A", "weight": 1}, {"criterion": "A", "weight": 9}]')


def test_parse_error_is_a_value_error():
    assert issubclass(RubricParseError, ValueError)


def test_non_string_input_is_a_type_error():
    with pytest.raises(TypeError):
        parse_rubric(None)  # type: ignore[arg-type]


def test_long_list_of_problems_is_capped():
    text = "[" + ", ".join(f'{{"criterion": "c{i}", "weight": 9}}' for i in range(20)) + "]"
    with pytest.raises(RubricParseError, match="and 12 more$"):
        parse_rubric(text)


def test_to_json_round_trips_through_parser_and_from_json():
    rubric = Rubric(items=(RubricItem("Mentions Canberra", 5), RubricItem("Is brief — under 50 words", 1)))
    assert parse_rubric(rubric.to_json()) == rubric
    assert Rubric.from_json(rubric.to_json()) == rubric
    np.testing.assert_array_equal(rubric.weights, [5, 1])
    assert rubric.weights.dtype == np.int64
    assert rubric.criteria == ("Mentions Canberra", "Is brief — under 50 words")
    assert len(rubric) == 2


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"criterion": "a", "weight": 1}',
        '[{"criterion": "a", "weight": 1, "id": 3}]',
        '[{"item": "a", "weight": 1}]',
        '[{"criterion": "a", "weight": "1"}]',
        "[]",
    ],
)
def test_from_json_is_strict(text):
    with pytest.raises(ValueError):
        Rubric.from_json(text)


@pytest.mark.parametrize(
    ("criterion", "weight", "message"),
    [
        ("ok", 0, "outside 1..5"),
        ("ok", 6, "outside 1..5"),
        ("ok", True, "must be an int"),
        ("ok", 3.0, "must be an int"),
        ("", 3, "non-empty"),
        ("  ", 3, "non-empty"),
        (None, 3, "non-empty"),
    ],
)
def test_rubric_item_validates(criterion, weight, message):
    with pytest.raises(ValueError, match=message):
        RubricItem(criterion, weight)


def test_rubric_validates_items():
    with pytest.raises(ValueError, match="at least one item"):
        Rubric(items=())
    with pytest.raises(ValueError, match="duplicates item 1"):
        Rubric(items=(RubricItem("Cites a source.", 2), RubricItem("cites  a source", 3)))
    with pytest.raises(ValueError, match="expected a RubricItem"):
        Rubric(items=(("Cites a source", 2),))  # type: ignore[arg-type]


def test_records_are_frozen_with_slots():
    item = RubricItem("Cites a source", 2)
    with pytest.raises(AttributeError):
        item.weight = 3  # type: ignore[misc]
    assert not hasattr(item, "__dict__")
    rubric = Rubric(items=[item])  # a list is stored as a tuple
    assert isinstance(rubric.items, tuple)


def test_numpy_integer_weight_is_stored_as_int():
    assert type(RubricItem("Cites a source", np.int64(4)).weight) is int


def test_import_stays_light():
    code = "import sys, judges.rubric; print(any(m in sys.modules for m in ('torch', 'transformers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
