"""`harness run` / `eval` / `report` end to end: resume after SIGKILL, reports without model calls, config checks."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults import Gate

from harness.loopback import chat_completion, json_response, serve_in_thread

ROW = "Qwen3-8B zero-shot"
HANG_GUARD_S = 600
"""How long a test waits for an event before it calls the run hung: a failure guard, never what passes."""


class CountingJudge:
    """A pairwise judge server: a deterministic verdict from the request, a little latency, a request log."""

    def __init__(self, latency_s: float = 0.02) -> None:
        self.latency_s = latency_s
        self.requests: list[str] = []
        self._lock = threading.Lock()

    async def __call__(self, request):
        import asyncio

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        text = body["messages"][-1]["content"]
        with self._lock:
            self.requests.append(text)
        await asyncio.sleep(self.latency_s)
        verdict = "[[A]]" if hashlib.sha256(text.encode()).digest()[0] % 3 else "[[B]]"
        return json_response(chat_completion([f"Verdict: {verdict}"]))


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"only_rows: ['{ROW}']\n"
        f"rows: {{'{ROW}': 'pairwise-judge:model=openai:judge'}}\n"
        "benchmarks: [ultrafeedback]\n"
        f"backend: {{base_url: '{url}', concurrency: 4}}\n"
    )
    return path


def _args(config: Path, out: Path, data: Path) -> list[str]:
    return [sys.executable, "-m", "harness", "run", "table1", "--config", str(config), "--limit", "60", "--seeds",
            "1", "--parallel", "2", "--data-dir", str(data), "--out", str(out)]


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path: Path, shared_data: Path):
    """SIGKILL once 15 of 60 sets are saved (the judge holds every game after the first 32 until the process
    is dead), a resume, then a fresh uninterrupted run: the same records and results, no set judged twice."""
    judge = CountingJudge()
    gate = Gate(judge, let_through=32)  # two games a set: 15 or 16 sets whole (at most two in flight)
    with serve_in_thread(gate) as url:
        config = _config(tmp_path, url)
        env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
        out = tmp_path / "killed"
        proc = subprocess.Popen(_args(config, out, shared_data), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + HANG_GUARD_S
            path = out / "records.jsonl"
            while not (path.exists() and path.read_text().count("\n") >= 15):
                assert proc.poll() is None and time.monotonic() < deadline, "ended or hung before 15 sets"
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(HANG_GUARD_S)
        gate.open(drop_held=True)  # the games the killed process waited for are never judged
        finished = len(_records(out))
        assert 15 <= finished <= 16, "the kill lands mid-run"

        before = len(judge.requests)
        resumed = subprocess.run(_args(config, out, shared_data), env=env, capture_output=True, text=True,
                                 timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        # Finished records are not scored again: at most the two games of each unfinished set reach the server.
        assert len(judge.requests) - before <= 2 * (60 - finished)
        assert f"{finished} already done" in resumed.stdout

        fresh_env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "fresh.sqlite")}
        whole = tmp_path / "whole"
        uninterrupted = subprocess.run(_args(config, whole, shared_data), env=fresh_env, capture_output=True,
                                       text=True, timeout=300)
        assert uninterrupted.returncode == 0, uninterrupted.stderr

        # A second identical run makes no model calls and reports from the records alone.
        before = len(judge.requests)
        again = subprocess.run(_args(config, out, shared_data), env=env, capture_output=True, text=True,
                               timeout=300)
        assert len(judge.requests) == before
    assert again.returncode == 0, again.stderr
    assert "60 sets (60 complete, 0 with failures, 60 already done)" in again.stdout
    assert "backend calls: 0" in again.stdout

    records = _records(out)
    keys = [(r["evaluator"], r["benchmark"], r["item"], r["repeat"]) for r in records]
    assert len(keys) == len(set(keys)) == 60  # nothing duplicated, nothing lost
    by_key = {(r["item"], r["repeat"]): r["scores"] for r in records}
    assert by_key == {(r["item"], r["repeat"]): r["scores"] for r in _records(whole)}
    ours = json.loads((out / "results.json").read_text())["results"]
    assert ours == json.loads((whole / "results.json").read_text())["results"]
    assert ours[ROW]["benchmarks"]["ultrafeedback"]["acc"]["n"] == 60
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s.get("status") for s in manifest["sessions"]] == [None, "finished", "finished"]  # killed: no status
    # Every setting of the row is recorded, defaults included (the canonical spec leaves them out).
    assert manifest["evaluator_settings"] == {"pairwise-judge:model=openai:judge": {
        "model": "openai:judge", "temperature": 0.0, "max_tokens": 512, "structured": True}}


def test_report_rerenders_without_models(tmp_path: Path):
    from harness.records import EvalRecord
    from harness.runstore import Output, OutputPaths
    from reports.report import write_reports

    paths = OutputPaths.run_dir(tmp_path / "run")
    recs = []
    for i, (a, b) in enumerate([(0.9, 0.1), (0.2, 0.8), (0.5, 0.5), (None, 0.3)]):
        for spec, flip in (("x:y", False), ("x:z", True)):
            scores = (b, a) if flip and a is not None else (a, b)
            recs.append(EvalRecord(spec, "judgebench", f"i{i}", 0, 0, "pairwise", scores, preferred=0))
    with Output(paths, EvalRecord, command="run", settings={}, config={"table": "table1", "preset": "cpu",
                "seeds": 1}, extra={"rows": {ROW: "x:y", "DR-Generator-8B": "x:z"}}) as output:
        output.log.append(recs)
    payload = write_reports(paths.records.parent)
    cell = payload["results"][ROW]["benchmarks"]["judgebench"]["acc"]
    assert (cell["value"], cell["n"], cell["n_failed"], cell["tie_rate"]) == (0.25, 4, 1, 0.25)
    run = paths.records.parent
    md = (run / "table.md").read_text()
    assert f"| {ROW} | **<u>25.0</u>** |" in md  # the best row, and the best dynamic-rubric row
    assert "| *paper* | 36.4 |" in md  # the paper's number beside ours
    tex = (run / "table.tex").read_text()
    assert r"\toprule" in tex and r"\textbf{\underline{25.0}}" in tex
    csv = (run / "table.csv").read_text().splitlines()
    assert csv[0].startswith("row,evaluator,benchmark,metric,value") and len(csv) == 1 + 2 * 8


def test_config_rejects_unknown_keys_and_rows(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: 2\nsurprise: 1\n")
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "table1", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "bad.yaml: surprise: Extra inputs are not permitted" in proc.stderr
    bad.write_text("rows: {'No such row': 'x'}\n")
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "table1", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "unknown row(s) ['No such row']" in proc.stderr


def test_results_do_not_depend_on_record_order():
    import random

    from reports.results import compute_results

    from harness.records import EvalRecord

    recs = [
        EvalRecord("e", "ultrafeedback", f"i{i}", 0, 0, "pairwise", (2.0 if random.Random(i).random() < 0.2 else 0.0, 1.0),
                   preferred=0)
        for i in range(60)
    ]
    shuffled = list(recs)
    random.Random(1).shuffle(shuffled)
    assert compute_results(recs, {"row": "e"}) == compute_results(shuffled, {"row": "e"})


def test_listwise_records_give_top1_and_ndcg_over_repeats():
    from reports.results import compute_results

    from harness.records import EvalRecord

    def rec(item, repeat, scores, gold):
        return EvalRecord("e", "nectar_lmsys", item, repeat, 0, "listwise", tuple(scores), gold_ranks=tuple(gold))

    recs = [
        rec("a", 0, [0.9, 0.5, 0.1], [1, 2, 3]),  # perfect: top-1 right, nDCG 1
        rec("b", 0, [0.5, 0.5, 0.1], [1, 2, 3]),  # tied top: wrong; nDCG tie-averaged
        rec("a", 1, [0.1, 0.5, 0.9], [1, 2, 3]),  # reversed
        rec("b", 1, [0.9, None, 0.1], [1, 2, 3]),  # unscorable: wrong, nDCG 0, n_failed
    ]
    cell = compute_results(recs, {"row": "e"})["row"]["benchmarks"]["nectar_lmsys"]
    assert cell["acc"]["per_repeat"] == [0.5, 0.0]
    # Repeat 0: (1 + tie-averaged nDCG of [0.5, 0.5, 0.1] vs relevance [2, 1, 0]) / 2.
    ideal = 2 + 1 / 1.5849625007211562
    tied = ((2 + 1) / 2 * (1 + 1 / 1.5849625007211562)) / ideal
    assert abs(cell["ndcg"]["per_repeat"][0] - (1 + tied) / 2) < 1e-12
    assert cell["acc"]["n_failed"] == 1 and cell["acc"]["value"] == 0.25 and cell["acc"]["repeats"] == 2
