"""Table 9, the case study: one pair scored by G0 and G2 (a loopback pair of scripted rubric generators and a
scripted verifier), each generator writing five rubrics independently (one per repeat, each its own seed and not a
cache hit of another), each listed with its items in a seeded shuffled order, with hand-computed weighted sums,
nDCG and Acc. and their means and spread over the five, beside the paper's."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rubric_server import RubricServer, harness, results, verdict

from harness.loopback import serve_in_thread
from harness.records import EvalRecord
from harness.registry import lookup
from reports.case_study import case_results, item_order

ITEM = "test_prefs:0"
TIE_NDCG = (1 + 1 / math.log2(3)) / 2
"""A tied pair: the gold-best response (relevance 1) and the other (0) share the two discounts 1 and 1/log2(3)."""


def test_the_case_study_of_one_pair(tmp_path: Path, shared_data: Path):
    [item] = [i for i in lookup("benchmark", "ultrafeedback").load(data_dir=shared_data, limit=5) if i.id == ITEM]
    preferred, other = item.responses[item.preferred], item.responses[1 - item.preferred]
    assert len(preferred) > len(other)
    g0 = [("The response is written in English.", 5), ("The response mentions zebras.", 2),
          ("The response is polite.", 5)]
    g2 = [(f"The response is longer than {len(other)} characters.", 4), ("The response is written in English.", 3)]
    # What the scripted verifier says: G0's rubric cannot tell the two apart, G2's first item can.
    assert [verdict(c, preferred) for c, _ in g0] == [verdict(c, other) for c, _ in g0] == [True, False, True]
    assert [verdict(c, preferred) for c, _ in g2] == [True, True]
    assert [verdict(c, other) for c, _ in g2] == [False, True]
    server = RubricServer({"g0": g0, "g2": g2})
    config = tmp_path / "table9.yaml"
    out = tmp_path / "out"
    with serve_in_thread(server) as url:
        config.write_text(json.dumps({"rows": {"G0": "dynamic-rubric:generator=openai:g0,verifier=openai:ver",
                                               "G2": "dynamic-rubric:generator=openai:g2,verifier=openai:ver"},
                                      "backend": {"base_url": url, "concurrency": 8}}))
        done = harness("run", "table9", "--item", f"ultrafeedback:{ITEM}", "--config", str(config), "--data-dir",
                       str(shared_data), "--out", str(out), env={"HARNESS_CALL_CACHE": str(tmp_path / "c.sqlite")})
        assert done.returncode == 0, done.stderr
    # Five rubrics per generator, each its own request: five seeds, so none is a cache hit of another.
    for model in ("g0", "g2"):
        asked = server.rubric_requests[model]
        assert len(asked) == server.count(model) == 5 and len({body["seed"] for body in asked}) == 5
    case = results(out)["case_study"]
    for row, n_items, sums in (("G0", 3, [10.0, 10.0]), ("G2", 2, [7.0, 3.0])):
        rubrics = case[row]["rubrics"]
        assert [r["repeat"] for r in rubrics] == [0, 1, 2, 3, 4] and len({r["seed"] for r in rubrics}) == 5
        assert all(r["shuffled"] and r["items"] == [i + 1 for i in item_order(n_items, r["seed"])] for r in rubrics)
        assert all(r["sums"] == sums for r in rubrics)  # verified item by item: the order cannot change a sum
    assert len({tuple(r["items"]) for r in case["G0"]["rubrics"]}) > 1  # the orders do differ
    first = case["G0"]["rubrics"][0]
    assert case["G0"]["sums"] == [10.0, 10.0] and case["G0"]["total_weight"] == 12
    by_number = dict(zip(first["items"], first["verdicts"]))
    assert [by_number[m] for m in (1, 2, 3)] == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    assert case["G0"]["ndcg"] == pytest.approx(TIE_NDCG) and case["G0"]["acc"] == 0.0
    assert case["G0"]["ndcg_sd"] == pytest.approx(0.0) and case["G0"]["acc_sd"] == 0.0
    assert case["G2"]["sums"] == [7.0, 3.0] and case["G2"]["scores"] == pytest.approx([1.0, 3 / 7])
    assert (case["G2"]["ndcg"], case["G2"]["acc"], case["G2"]["n_failed"]) == (1.0, 1.0, 0)
    table = (out / "table.md").read_text()
    assert "| G0 | 10/10 | 0.8155 | 0.0000 | 0.00 | 0.0000 | 5 (0 failed) |" in table
    assert "| *paper* | 15/15 | 0.8155 | - | 0.00 | - | 5 |" in table
    assert "| G2 | 7/3 | 1.0000 | 0.0000 | 1.00 | 0.0000 | 5 (0 failed) |" in table
    assert "| *paper* | 53/24 | 1.0000 | - | 1.00 | - | 5 |" in table
    assert f"| 1 | The response is longer than {len(other)} characters. | 4 | yes | no |" in table
    lines = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    means = {r["row"]: r for r in lines if r["line"] == "mean"}
    assert [r["line"] for r in lines if r["row"] == "G2"] == ["rubric"] * 5 + ["mean"]
    assert (means["G2"]["paper_sums"], means["G2"]["acc"], means["G0"]["paper_ndcg"]) == ("53/24", "1.0", "0.8155")
    assert r"\quad\textit{paper} & 53/24 & 1.0000 & - & 1.00 & - & 5 \\" in (out / "table.tex").read_text()
    explained = harness("report", str(out), "--explain", "G2", "ultrafeedback")
    assert explained.returncode == 0, explained.stderr
    assert f"harness run table9 --item ultrafeedback:{ITEM} --seeds 5" in explained.stdout


def test_a_list_is_read_in_gold_order():
    """Responses are listed best first; a list whose gold-best response alone tops it is right."""
    trace = {"rubric": [{"criterion": "a", "weight": 2}, {"criterion": "b", "weight": 3}],
             "verdicts": [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], "failures": []}
    record = EvalRecord("e", "nectar_lmsys", "n1", 0, 7, "listwise", (2 / 5, 3 / 5, 1.0), gold_ranks=(3, 2, 1),
                        trace=trace)
    case = case_results([record], {"G2": "e"})["G2"]
    assert case["order"] == [2, 1, 0] and case["sums"] == [5.0, 3.0, 2.0]
    in_gold_order = [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    [rubric] = case["rubrics"]
    assert rubric["verdicts"] == [in_gold_order[i] for i in item_order(2, 7)]
    assert (case["acc"], case["ndcg"]) == (1.0, 1.0) and case["acc_sd"] is None


def _case_record(rubric: list[tuple[str, int]], verdicts: list[list[float]], *, repeat: int = 0,
                 spec: str = "dynamic-rubric:generator=openai:g2,verifier=openai:ver") -> EvalRecord:
    """A pair (preferred first) scored by `rubric` with `verdicts` (items x responses)."""
    total = sum(w for _, w in rubric)
    scores = tuple(sum(w * v[j] for (_, w), v in zip(rubric, verdicts)) / total for j in range(2))
    trace = {"rubric": [{"criterion": c, "weight": w} for c, w in rubric], "verdicts": verdicts, "failures": []}
    return EvalRecord(spec, "ultrafeedback", "u1", repeat, 100 + repeat, "pairwise", scores, preferred=0,
                      trace=trace)


def test_the_papers_numbers_are_means_over_five_rubrics_with_their_spread():
    """Five rubrics, each a repeat of its own: four get the pair right, one wrong. Acc. is 4/5 with sample
    standard deviation sqrt(1/5); nDCG is (4 + 1/log2(3)) / 5 (the wrong one ranks the gold-best second)."""
    right = [_case_record([("a", 3), ("b", 1), ("c", 2)], [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], repeat=r)
             for r in range(4)]
    wrong = _case_record([("d", 1)], [[0.0, 1.0]], repeat=4)
    case = case_results([wrong, *right], {"G2": wrong.evaluator})["G2"]
    assert [r["repeat"] for r in case["rubrics"]] == [0, 1, 2, 3, 4]
    assert case["sums"] == [4.0, 1.0]  # rubric 0's, as the paper's seed-0 sums
    assert (case["acc"], case["n_failed"]) == (pytest.approx(0.8), 0)
    assert case["acc_sd"] == pytest.approx(math.sqrt(0.2))
    wrong_ndcg = 1 / math.log2(3)
    assert case["ndcg"] == pytest.approx((4 + wrong_ndcg) / 5)
    assert case["ndcg_sd"] == pytest.approx(float(np.std([1, 1, 1, 1, wrong_ndcg], ddof=1)))
    # each rubric's items in an order of its own seed; the verdicts move with their items
    for r, record in zip(case["rubrics"], [*right, wrong]):
        assert r["items"] == [i + 1 for i in item_order(len(record.trace["rubric"]), record.seed)]
        assert r["verdicts"] == [record.trace["verdicts"][i - 1] for i in r["items"]]
    assert len({tuple(r["items"]) for r in case["rubrics"][:4]}) > 1


def test_a_batched_verifier_lists_each_rubric_as_it_was_read():
    """Batched verification answers the items in one sheet, so their order may change its verdicts; another
    order would need the verifier again, which a report does not call: the rubrics are listed as read."""
    from reports.case_study import render_markdown
    from reports.evaluator_tables import TABLE9_SPEC

    spec = "dynamic-rubric:generator=openai:g2,verifier=openai:ver,mode=batched"
    records = [_case_record([("a", 3), ("b", 1)], [[1.0, 0.0], [1.0, 1.0]], spec=spec, repeat=r) for r in range(5)]
    case = case_results(records, {"G2": spec})
    assert case["G2"]["verify_mode"] == "batched" and "mode=batched" in case["G2"]["order_note"]
    assert all(not r["shuffled"] and r["items"] == [1, 2] for r in case["G2"]["rubrics"])
    assert (case["G2"]["acc"], case["G2"]["ndcg"]) == (1.0, 1.0)
    table = render_markdown(TABLE9_SPEC, case, [])
    assert "| G2 | 4/1 | 1.0000 | 0.0000 | 1.00 | 0.0000 | 5 (0 failed) |" in table and "mode=batched" in table


def test_an_unscored_rubric_counts_failed():
    failed = EvalRecord("e", "ultrafeedback", "u1", 0, 7, "pairwise", (None, None), preferred=0,
                        trace={"failures": [{"stage": "generate_rubric", "category": "parse"}]})
    scored = _case_record([("a", 1)], [[1.0, 0.0]], repeat=1, spec="e")
    case = case_results([failed, scored], {"G0": "e"})["G0"]
    assert (case["acc"], case["ndcg"], case["n_failed"]) == (0.5, 0.5, 1)
    assert case["sums"] is None and case["rubrics"][0]["rubric"] is None
