"""Table 9, the case study: one pair scored by G0 and G2 (a loopback pair of scripted rubric generators and a
scripted verifier), with hand-computed weighted sums, nDCG and Acc. over five repeats beside the paper's."""

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
    assert (server.count("g0"), server.count("g2")) == (5, 5)  # one rubric per repeat
    case = results(out)["case_study"]
    assert case["G0"]["sums"] == [10.0, 10.0] and case["G0"]["total_weight"] == 12
    assert case["G0"]["verdicts"] == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    assert case["G0"]["ndcg"] == pytest.approx(TIE_NDCG) and case["G0"]["acc"] == 0.0
    assert case["G2"]["sums"] == [7.0, 3.0] and case["G2"]["scores"] == pytest.approx([1.0, 3 / 7])
    assert case["G2"]["ndcg"] == 1.0 and case["G2"]["acc"] == 1.0
    assert [len(case[r]["repeats"]) for r in ("G0", "G2")] == [5, 5]
    table = (out / "table.md").read_text()
    assert "| G0 | 10/10 | 0.8155 | 0.00 | 5 (0 failed) |" in table
    assert "| *paper* | 15/15 | 0.8155 | 0.00 | 5 |" in table
    assert "| G2 | 7/3 | 1.0000 | 1.00 | 5 (0 failed) |" in table
    assert "| *paper* | 53/24 | 1.0000 | 1.00 | 5 |" in table
    assert f"| 1 | The response is longer than {len(other)} characters. | 4 | yes | no |" in table
    lines = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    means = {r["row"]: r for r in lines if r["repeat"] == "mean"}
    assert (means["G2"]["paper_sums"], means["G2"]["acc"], means["G0"]["paper_ndcg"]) == ("53/24", "1.0", "0.8155")
    assert r"\quad\textit{paper} & 53/24 & 1.0000 & 1.00 & 5 \\" in (out / "table.tex").read_text()
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
    assert case["verdicts"] == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert (case["acc"], case["ndcg"]) == (1.0, 1.0)
