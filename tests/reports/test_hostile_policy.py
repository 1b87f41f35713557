"""Policy tables and the gate against a flaky policy server, as a user meets them: answers that fail at the
backend are recorded, counted in every metric and retried on rerun; `harness compare` never passes a candidate
whose answers failed, pairs only the items both runs scored, and says how its values relate to each run's own
results.json."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_policy_tables import ROW, TableServer, data_dir  # noqa: F401  (the fixture is used by name)

from harness.loopback import HttpResponse, serve_in_thread

pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")

BENCHES = ("alpaca_eval2", "arena_hard_v2")
LIMIT = 4


class FlakyPolicy(TableServer):
    """`TableServer` whose policy answers HTTP 500 to the prompts in `failing` (until they are cleared)."""

    def __init__(self, failing: set[str] = frozenset()) -> None:
        super().__init__()
        self.failing = set(failing)
        self.refused = 0
        self._refusals = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/chat/completions"):
            messages = request.json()["messages"]
            if len(messages) == 1 and messages[0]["content"] in self.failing:
                with self._refusals:
                    self.refused += 1
                return HttpResponse(500, b'{"error": {"message": "overloaded"}}')
        return await super().__call__(request)


def prompts(data: Path, pick) -> set[str]:
    """The user prompts of the items `pick(index)` selects, in each benchmark's first LIMIT items."""

    from harness.registry import lookup

    found = set()
    for bench in BENCHES:
        for index, item in enumerate(lookup("benchmark", bench).load(data_dir=data, limit=LIMIT)):
            if pick(index):
                found.add(item.messages[-1].content)
    return found


def run_table2(tmp_path: Path, url: str, out: Path, data: Path) -> subprocess.CompletedProcess:
    """table2 into `out`, its policy named after `out` (so the base's answers are not the candidate's cache)."""
    config = tmp_path / f"{out.name}.yaml"
    config.write_text(
        f"only_rows: ['{ROW}']\nrows: {{'{ROW}': 'openai:policy-{out.name}'}}\njudge: openai:judge-model\n"
        f"benchmarks: [{', '.join(BENCHES)}]\n"
        f"backend: {{base_url: '{url}', concurrency: 4, max_attempts: 1}}\n"
    )
    args = [sys.executable, "-m", "harness", "run", "table2", "--config", str(config), "--limit", str(LIMIT),
            "--data-dir", str(data), "--out", str(out)]
    return subprocess.run(args, capture_output=True, text=True, timeout=3600)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=3600)


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["results"][ROW]["benchmarks"]


def test_failed_answers_are_counted_retried_and_never_pass_the_gate(tmp_path: Path, data_dir: Path):  # noqa: F811
    base, cand = tmp_path / "base", tmp_path / "cand"
    failing = prompts(data_dir, lambda i: i % 2 == 1)  # half of each benchmark's items
    server = FlakyPolicy()
    with serve_in_thread(server) as url:
        assert run_table2(tmp_path, url, base, data_dir).returncode == 0
        server.failing = failing
        first = run_table2(tmp_path, url, cand, data_dir)
        assert server.refused == len(failing)

        # The run finishes with its failure summary and its tables; nothing crashes on the failed answers.
        assert first.returncode == 1, first.stderr
        assert "Traceback" not in first.stderr and "server_error" in first.stdout + first.stderr
        found = results(cand)
        alpaca = found["alpaca_eval2"]["win_rate"]
        assert alpaca["n"] == LIMIT and alpaca["n_failed"] == 2
        assert "all 805 instructions" in found["alpaca_eval2"]["unavailable"]["lc_win_rate"][0]
        arena_failed = sum(cell["n_failed"] for name, cell in found["arena_hard_v2"].items()
                           if name in ("hard_prompt", "creative_writing"))
        assert arena_failed == 2, "a failed answer must be counted in its category, not lost"
        records = [json.loads(line) for line in (cand / "records.jsonl").read_text().splitlines()]
        unanswered = [r for r in records if r["trace"]["answer"] is None]
        assert len(unanswered) == 4 and all(r["meta"] for r in unanswered)
        assert (cand / "table.md").is_file()
        report = cli("report", str(cand))
        assert report.returncode in (0, 1) and "Traceback" not in report.stderr, report.stderr

        # The gate: the candidate is unfinished, so it is not gated, and the failures are in compare.md.
        gate = cli("compare", str(base), str(cand), "--out", str(tmp_path / "gate"))
        assert gate.returncode == 3, gate.stdout + gate.stderr
        assert "not gated" in gate.stderr
        shown = json.loads((tmp_path / "gate" / "compare.json").read_text())
        markdown = (tmp_path / "gate" / "compare.md").read_text()
        wr = next(c for c in shown["cells"] if c["metric"] == "win_rate")
        assert wr["verdict"] == "incomplete" and wr["candidate_to_retry"] == 2
        assert (wr["paired"], wr["dropped"], wr["candidate_failed"]) == (2, 2, 2)
        base_alpaca = results(base)["alpaca_eval2"]["win_rate"]["value"]
        assert wr["base_reported"] == pytest.approx(base_alpaca)  # the base's own results.json value
        assert "**incomplete**" in markdown and "| 2/4 | 0/2 |" in markdown
        assert "CAND holds 2 record(s) with a failure of the backend" in markdown
        # Where the paired base value is not its results.json value, compare.md gives both and why.
        arena = next(c for c in shown["cells"] if c["benchmark"] == "arena_hard_v2")
        assert arena["base_reported"] == pytest.approx(results(base)["arena_hard_v2"]["hard_prompt"]["value"])
        assert (f"BASE is {arena['base'] * 100:.1f} over the paired items and {arena['base_reported'] * 100:.1f} "
                "in its results.json (2 of 4 item(s) dropped, not scored on both sides)") in markdown

        # Rerunning the candidate's command retries only the failed answers; then the gate judges it.
        server.failing = set()
        calls = server.calls
        again = run_table2(tmp_path, url, cand, data_dir)
        assert again.returncode == 0, again.stderr
        assert server.calls > calls
    gate = cli("compare", str(base), str(cand), "--out", str(tmp_path / "final"))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "0 not gated" in gate.stdout


def test_a_cell_whose_every_answer_failed_is_unscored_not_a_crash(tmp_path: Path, data_dir: Path):  # noqa: F811
    base, cand = tmp_path / "base", tmp_path / "cand"
    server = FlakyPolicy()
    with serve_in_thread(server) as url:
        assert run_table2(tmp_path, url, base, data_dir).returncode == 0
        server.failing = prompts(data_dir, lambda i: True)
        assert run_table2(tmp_path, url, cand, data_dir).returncode == 1
    gate = cli("compare", str(base), str(cand), "--out", str(tmp_path / "gate"))
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "Traceback" not in gate.stderr
    cells = json.loads((tmp_path / "gate" / "compare.json").read_text())["cells"]
    assert {c["verdict"] for c in cells} == {"incomplete"} and all(c["candidate"] is None for c in cells)
    assert "no item was scored on both sides" in (tmp_path / "gate" / "compare.md").read_text()


class UnrankedLabel(TableServer):
    """AlpacaEval's judge whose top logprobs never list `M` (a label outside them has logprob -inf)."""

    def _alpaca(self, body: dict, text: str):
        import math

        from harness.loopback import chat_completion, json_response

        self.judge_texts.append(text)
        top = [{"token": "m", "logprob": math.log(0.9)}, {"token": "x", "logprob": math.log(0.1)}]
        return json_response(chat_completion(["m"], logprobs=[{"content": [
            {"token": "m", "logprob": math.log(0.9), "top_logprobs": top}]}]))


def _strict(text: str, where: Path):
    def refuse(constant: str):
        raise AssertionError(f"{where}: {constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_records_and_artefacts_are_strict_json(tmp_path: Path, data_dir: Path):  # noqa: F811
    out = tmp_path / "run"
    with serve_in_thread(UnrankedLabel()) as url:
        config = tmp_path / "c.yaml"
        config.write_text(f"only_rows: ['{ROW}']\nrows: {{'{ROW}': 'openai:policy'}}\njudge: openai:judge-model\n"
                          f"benchmarks: [alpaca_eval2]\nbackend: {{base_url: '{url}'}}\n")
        done = cli("run", "table2", "--config", str(config), "--limit", "2", "--data-dir", str(data_dir), "--out",
                   str(out))
    assert done.returncode == 0, done.stderr
    records = [_strict(line, out / "records.jsonl") for line in (out / "records.jsonl").read_text().splitlines()]
    for record in records:
        raw = record["trace"]["judgment"]["raw"]
        assert raw["unranked"] == ["M"] and set(raw["logprobs"]) == {"m"}
        assert record["scores"][0] in (1.0, 2.0)  # P(policy's label) is 1 or 0 with only `m` ranked
    for name in ("manifest.json", "results.json"):
        _strict((out / name).read_text(), out / name)


def test_a_misspelt_benchmark_in_bench_options_is_refused_before_any_call(tmp_path: Path, data_dir: Path):  # noqa: F811
    server = TableServer()
    with serve_in_thread(server) as url:
        config = tmp_path / "c.yaml"
        config.write_text(f"only_rows: ['{ROW}']\nrows: {{'{ROW}': 'openai:policy'}}\njudge: openai:judge-model\n"
                          f"backend: {{base_url: '{url}'}}\n")
        done = cli("run", "table2", "--config", str(config), "--limit", "1", "--data-dir", str(data_dir),
                   "--bench-option", "wrtingbench.subset=style", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: bench_options: 'wrtingbench' is not a benchmark of this run (did you "
                                   "mean 'writingbench'?); its benchmarks: alpaca_eval2, arena_hard_v2, wildbench, "
                                   "writingbench")
    assert server.calls == 0 and not (tmp_path / "run" / "records.jsonl").exists()


@pytest.mark.parametrize("text, what", [("rows: {a: b\nseed: [\n", "not valid YAML: "),
                                         (b"rows: {a: \xff}\n", "not UTF-8 text"),
                                         ("- a list\n", "a config is a mapping of settings, got list")])
def test_a_broken_run_config_is_one_line_naming_the_file(tmp_path: Path, text, what):
    config = tmp_path / "broken.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    done = cli("run", "table2", "--config", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {config}: ") and what in line, line
