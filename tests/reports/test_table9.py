"""Table 9, the case study: one pair scored by G0 and G2 (a loopback pair of scripted rubric generators and a
scripted verifier), with hand-computed weighted sums, nDCG and Acc. over five seeded orders of each generator's one
rubric (the paper shuffles the rubric order), beside the paper's; further repeats are rubric samples of ours."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from rubric_server import RubricServer, harness, results, verdict

from harness.loopback import serve_in_thread
from harness.records import EvalRecord
from harness.registry import lookup
from reports.case_study import case_results

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
    assert (server.count("g0"), server.count("g2")) == (1, 1)  # one rubric per generator, as the paper
    case = results(out)["case_study"]
    assert case["G0"]["sums"] == [10.0, 10.0] and case["G0"]["total_weight"] == 12
    assert case["G0"]["verdicts"] == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    assert case["G0"]["ndcg"] == pytest.approx(TIE_NDCG) and case["G0"]["acc"] == 0.0
    assert case["G2"]["sums"] == [7.0, 3.0] and case["G2"]["scores"] == pytest.approx([1.0, 3 / 7])
    assert case["G2"]["ndcg"] == 1.0 and case["G2"]["acc"] == 1.0
    assert [len(case[r]["repeats"]) for r in ("G0", "G2")] == [1, 1] and case["G2"]["resampled"] is None
    # five orders of the rubric's items, seeded; verified item by item, each order gives the rubric's sums
    orders = case["G2"]["orders"]
    assert len(orders) == 5 and len({o["seed"] for o in orders}) == 5
    assert all(sorted(o["order"]) == [1, 2] for o in orders) and {tuple(o["order"]) for o in orders} == {(1, 2), (2, 1)}
    assert all(o["sums"] == [7.0, 3.0] and o["acc"] == 1.0 for o in orders)
    assert all(sorted(o["order"]) == [1, 2, 3] and o["sums"] == [10.0, 10.0] for o in case["G0"]["orders"])
    table = (out / "table.md").read_text()
    assert "| G0 | 10/10 | 0.8155 | 0.00 | 5 (0 failed) |" in table
    assert "| *paper* | 15/15 | 0.8155 | 0.00 | 5 |" in table
    assert "| G2 | 7/3 | 1.0000 | 1.00 | 5 (0 failed) |" in table
    assert "| *paper* | 53/24 | 1.0000 | 1.00 | 5 |" in table
    assert f"| 1 | The response is longer than {len(other)} characters. | 4 | yes | no |" in table
    lines = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    means = {r["row"]: r for r in lines if r["line"] == "mean"}
    assert [r["line"] for r in lines if r["row"] == "G2"] == ["order"] * 5 + ["mean", "repeat"]
    assert (means["G2"]["paper_sums"], means["G2"]["acc"], means["G0"]["paper_ndcg"]) == ("53/24", "1.0", "0.8155")
    assert r"\quad\textit{paper} & 53/24 & 1.0000 & 1.00 & 5 \\" in (out / "table.tex").read_text()
    explained = harness("report", str(out), "--explain", "G2", "ultrafeedback")
    assert explained.returncode == 0, explained.stderr
    assert f"harness run table9 --item ultrafeedback:{ITEM} --seeds 1" in explained.stdout


def test_a_list_is_read_in_gold_order():
    """Responses are listed best first; a list whose gold-best response alone tops it is right."""
    trace = {"rubric": [{"criterion": "a", "weight": 2}, {"criterion": "b", "weight": 3}],
             "verdicts": [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], "failures": []}
    record = EvalRecord("e", "nectar_lmsys", "n1", 0, 7, "listwise", (2 / 5, 3 / 5, 1.0), gold_ranks=(3, 2, 1),
                        trace=trace)
    case = case_results([record], {"G2": "e"})["G2"]
    assert case["order"] == [2, 1, 0] and case["sums"] == [5.0, 3.0, 2.0]
    assert case["verdicts"] == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert (case["acc"], case["ndcg"]) == (1.0, 1.0)


def _case_record(rubric: list[tuple[str, int]], verdicts: list[list[float]], *, repeat: int = 0,
                 spec: str = "dynamic-rubric:generator=openai:g2,verifier=openai:ver") -> EvalRecord:
    """A pair (preferred first) scored by `rubric` with `verdicts` (items x responses)."""
    total = sum(w for _, w in rubric)
    scores = tuple(sum(w * v[j] for (_, w), v in zip(rubric, verdicts)) / total for j in range(2))
    trace = {"rubric": [{"criterion": c, "weight": w} for c, w in rubric], "verdicts": verdicts, "failures": []}
    return EvalRecord(spec, "ultrafeedback", "u1", repeat, 100 + repeat, "pairwise", scores, preferred=0,
                      trace=trace)


def test_the_papers_numbers_are_over_rubric_orders_and_new_rubrics_are_samples_apart():
    """The paper shuffles one rubric's item order over 5 seeds: a second repeat (a new rubric that gets the pair
    wrong) does not enter the paper's Acc. and nDCG; it is a rubric sample, reported apart."""
    from reports.case_study import ORDER_SEEDS, rubric_orders

    right = _case_record([("a", 3), ("b", 1), ("c", 2)], [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    wrong = _case_record([("d", 1)], [[0.0, 1.0]], repeat=1)
    case = case_results([right, wrong], {"G2": right.evaluator})["G2"]
    assert (case["acc"], case["ndcg"], case["n_failed"]) == (1.0, 1.0, 0)
    assert case["resampled"] == {"acc": 0.5, "ndcg": pytest.approx((1.0 + 1 / math.log2(3)) / 2),
                                 "n_failed": 0}
    assert [o["order"] for o in case["orders"]] == [[i + 1 for i in o] for o in rubric_orders(3, right.seed)]
    assert len(case["orders"]) == ORDER_SEEDS and all(o["sums"] == [4.0, 1.0] for o in case["orders"])
    assert len({tuple(o["order"]) for o in case["orders"]}) > 1  # the orders do differ


def test_a_batched_verifier_reports_its_rubrics_own_order_only():
    """Batched verification answers the items in one sheet, so their order may change its verdicts; other orders
    would need the verifier again, which a report does not call: the row says so."""
    from reports.case_study import render_markdown
    from reports.evaluator_tables import TABLE9_SPEC

    spec = "dynamic-rubric:generator=openai:g2,verifier=openai:ver,mode=batched"
    record = _case_record([("a", 3), ("b", 1)], [[1.0, 0.0], [1.0, 1.0]], spec=spec)
    case = case_results([record], {"G2": spec})
    assert case["G2"]["orders"] is None and case["G2"]["verify_mode"] == "batched"
    assert (case["G2"]["acc"], case["G2"]["ndcg"]) == (1.0, 1.0)
    table = render_markdown(TABLE9_SPEC, case, [])
    assert "| G2 | 4/1 | 1.0000 | 1.00 | 1 (0 failed) |" in table and "mode=batched" in table


def test_an_unscored_rubric_counts_failed_under_every_order():
    record = EvalRecord("e", "ultrafeedback", "u1", 0, 7, "pairwise", (None, None), preferred=0,
                        trace={"failures": [{"stage": "generate_rubric", "category": "parse"}]})
    case = case_results([record], {"G0": "e"})["G0"]
    assert (case["acc"], case["ndcg"], case["n_failed"]) == (0.0, 0.0, 5)
