"""Figure 2 from a coevolve dir: its two panels run as runs of their own (the generators as evaluators, the policies
judged), drawn as grouped bars (PNG and PDF) with three bars per benchmark group, and reported, explained and
compared like any table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rubric_server import RubricServer, harness, results

from harness.config import RunConfig
from harness.errors import ConfigError
from harness.loopback import serve_in_thread
from reports.tables import get_table

STAGES = ("G1", "P1", "G2", "G2-stale", "P2", "P2-stale")


def coevolve_dir(root: Path, stages=STAGES) -> Path:
    """A coevolve.json as `harness train coevolve` writes it, its checkpoints served by the loopback."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "coevolve.json").write_text(json.dumps({
        "base": {"G0": "openai:g0", "P0": "openai:p0"},
        "stages": [{"name": s, "spec": f"openai:{s.lower()}"} for s in stages],
        "config": {"verifier": "openai:ver"}}))
    return root


@pytest.mark.slow
def test_fig2_from_a_coevolve_dir(tmp_path: Path, shared_data: Path):
    server = RubricServer({"g1": [("The response contains a digit.", 3)],
                           "g2": [("The response is longer than 500 characters.", 4)],
                           "g2-stale": [("The response mentions water.", 2)]})
    config, out = tmp_path / "fig2.yaml", tmp_path / "fig2"
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    with serve_in_thread(server) as url:
        # One config for both panels: each takes its own benchmarks; the judge reaches the policy panel only.
        config.write_text(json.dumps({"benchmarks": ["ultrafeedback", "alpaca_eval2"], "judge": "openai:judge",
                                      "backend": {"base_url": url, "concurrency": 8}}))
        args = ["run", "fig2", "--coevolve", str(coevolve_dir(tmp_path / "co")), "--config", str(config),
                "--limit", "3", "--seeds", "1", "--data-dir", str(shared_data), "--out", str(out)]
        done = harness(*args, env=env)
        assert done.returncode == 0, done.stderr
        asked = dict(server.requests)
        assert {m: asked[m] for m in ("g1", "g2", "g2-stale", "p1", "p2", "p2-stale")} == dict.fromkeys(
            ("g1", "g2", "g2-stale", "p1", "p2", "p2-stale"), 3)
        again = harness(*args, env=env)
        assert again.returncode == 0 and dict(server.requests) == asked  # the rerun resumes: no model call
    assert (out / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "figure.pdf").read_bytes()[:5] == b"%PDF-"
    found = results(out)
    assert found["figure"]["bars"] == {"fig2a": {"UltraFeedback": 3}, "fig2b": {"AlpacaEval 2 WR": 3}}
    panel_a = found["panels"]["fig2a"]
    assert panel_a["rows"]["G2-stale"] == "dynamic-rubric:generator=openai:g2-stale,verifier=openai:ver"
    assert found["panels"]["fig2b"]["rows"] == {"P1": "openai:p1", "P2": "openai:p2", "P2-stale": "openai:p2-stale"}
    assert list(panel_a["results"]["G1"]["benchmarks"]) == ["ultrafeedback"]
    table = (out / "table.md").read_text()
    assert "### Figure 2 (a)" in table and "### Figure 2 (b)" in table and "| *paper* | - |" in table
    assert (out / "table.csv").read_text().startswith("panel,row,evaluator,benchmark,metric,value")
    (out / "figure.png").unlink()
    report = harness("report", str(out))
    assert report.returncode == 0 and (out / "figure.png").is_file() and "Figure 2 (b)" in report.stdout
    explained = harness("report", str(out), "--explain", "P2", "alpaca_eval2")
    assert explained.returncode == 0 and "harness run fig2b" in explained.stdout, explained.stderr
    gate = harness("compare", str(out), str(out), "--out", str(tmp_path / "gate"))
    cells = json.loads((tmp_path / "gate" / "compare.json").read_text())
    assert gate.returncode == 0 and {c["row"] for c in cells["cells"]} == {"G1", "G2", "G2-stale", "P1", "P2",
                                                                          "P2-stale"}


def test_a_coevolve_dir_without_the_stale_controls_is_refused(tmp_path: Path):
    co = coevolve_dir(tmp_path / "co", stages=("G1", "P1", "G2", "P2"))
    with pytest.raises(ConfigError, match="has no stage G2-stale"):
        get_table("fig2a").resolve(RunConfig(coevolve=co))
    spec, _ = get_table("table9").resolve(RunConfig(coevolve=co, items={"judgebench": ["x"]}))
    assert [r.spec("paper") for r in spec.rows] == [
        "dynamic-rubric:generator=openai:g0,verifier=openai:ver",
        "dynamic-rubric:generator=openai:g2,verifier=openai:ver"]


def test_each_panel_takes_its_own_rows_and_judge_from_the_figures_config():
    cfg = RunConfig(rows={"G2": "dynamic-rubric:generator=openai:mine", "P2": "openai:mine"},
                    benchmarks=["ultrafeedback", "alpaca_eval2"], judge="openai:judge",
                    bench_options={"alpaca_eval2": {}})
    _, evaluators = get_table("fig2a").resolve(cfg)
    _, policies = get_table("fig2b").resolve(cfg)
    assert (evaluators.rows, evaluators.benchmarks, evaluators.judge, evaluators.bench_options) == (
        {"G2": "dynamic-rubric:generator=openai:mine"}, ["ultrafeedback"], None, {})
    assert (policies.rows, policies.benchmarks, policies.judge) == ({"P2": "openai:mine"}, ["alpaca_eval2"],
                                                                   "openai:judge")
