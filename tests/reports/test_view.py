"""`harness view`: the page of a loopback table1 run (a scripted rubric generator and verifier, a pairwise
judge), of policy runs (a loopback policy and judge; a checker), of two runs (the records whose outcome changed,
and the command `harness compare` prints to open them), and of a synthetic 20,000-record run.

The embedded data is checked against the benchmarks' declared metrics; the browser tests open the pages in
Debian's Chromium through Selenium and its `chromium-driver` (skipped where either is not installed; CI installs
both), click through them and save screenshots.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.loopback import chat_completion, json_response, serve_in_thread
from harness.records import EvalRecord
from harness.runstore import Manifest

DR_ROW, JUDGE_ROW = "DR-Generator-8B", "Qwen3-8B zero-shot"
RUBRICS = {
    # criterion -> weight; the first is repeated once, so the parser merges it (the page says so)
    "gen": [("The response is written in the language the prompt asks for.", 3),
            ("The response is shorter than 400 characters.", 2),
            ("The response contains a digit.", 1),
            ("The response is written in the language the prompt asks for.", 3)],
    "gen2": [("The response is longer than 1000 characters.", 1),
             ("The response spans several lines.", 2)],
}


def verdict(criterion: str, response: str) -> str:
    """The scripted verifier: `yes`, `no`, or `failed` (it answers `Perhaps`, also when re-asked)."""
    if "shorter than 400" in criterion:
        return "yes" if len(response) < 400 else "no"
    if "digit" in criterion:
        return "yes" if re.search(r"\d", response) else "no"
    if "longer than 1000" in criterion:
        return "yes" if len(response) > 1000 else "no"
    if "several lines" in criterion:
        return "yes" if "\n" in response else "no"
    byte = hashlib.sha256(response.encode()).digest()[0]
    return "failed" if byte % 7 == 0 else "yes" if byte % 2 else "no"


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class Loopback:
    """Plays every model of the runs here, telling them apart by the request.

    Rubric generators `gen` and `gen2` write `RUBRICS[model]`; the verifier answers by `verdict`; the pairwise
    judge prefers by a hash of its prompt; the policy answers `<think>plan</think>The answer is (B).`; the
    AlpacaEval judge gives the policy P = 0.8 for an answer shown first, else 0.3; the Arena-Hard judge says
    `[[A>B]]` in game 1 and `[[A=B]]` in game 2.
    """

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        with self._lock:
            self.calls += 1
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        model = body.get("model")
        if "You are writing a grading rubric" in first:
            items = [{"criterion": c, "weight": w} for c, w in RUBRICS[model]]
            return json_response(chat_completion([json.dumps(items)]))
        if "Does the response meet this criterion?" in first:
            response = _between(first, "[Response]\n", "\n[End of Response]")
            said = verdict(_between(first, "Criterion: ", "\n"), response)
            return json_response(chat_completion([{"yes": "Yes", "no": "No"}.get(said, "Perhaps")]))
        if "<response_a>" in first:
            label = "[[A]]" if hashlib.sha256(first.encode()).digest()[0] % 3 else "[[B]]"
            return json_response(chat_completion([f"Both are fine; verdict:\n{label}"]))
        if "[Output M]" in first:
            return self._alpaca(body, first)
        if "<|The Start of Assistant A's Answer|>" in first:
            shown_a = _between(first, "<|The Start of Assistant A's Answer|>", "<|The End")
            policy_a = "The answer is (B)." in shown_a
            return json_response(chat_completion(["[[A=B]]" if policy_a else "[[A>B]]"]))
        if body.get("logprobs"):  # a probe of the server's logprobs
            top = [{"token": t, "logprob": math.log(0.5)} for t in ("yes", "no")]
            return json_response(chat_completion(["yes"], logprobs=[{"content": [
                {"token": "yes", "logprob": math.log(0.5), "top_logprobs": top}]}]))
        return json_response(chat_completion(["<think>a private plan</think>The answer is (B)."]))

    def _alpaca(self, body: dict, text: str):
        policy_first = "The answer is (B)." in _between(text, "[Output m]\n", "\n[End of Output m]")
        p_m = 0.8 if policy_first else 0.7  # P(m): the first output is better
        top = [{"token": "m", "logprob": math.log(p_m)}, {"token": "M", "logprob": math.log(1 - p_m)}]
        return json_response(chat_completion(["m"], logprobs=[{"content": [
            {"token": "m", "logprob": math.log(p_m), "top_logprobs": top}]}]))


def harness(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def table1_run(tmp_path: Path, url: str, data: Path, out: Path, *, generator: str = "gen",
               env: dict | None = None) -> Path:
    """A table1 run of two rows on 6 UltraFeedback pairs x 2 repeats: a dynamic rubric (generator `generator`, the
    verifier `ver`) and a pairwise judge, every model behind `url`."""
    config = tmp_path / f"table1-{generator}.yaml"
    config.write_text(
        f"only_rows: ['{JUDGE_ROW}', '{DR_ROW}']\n"
        f"rows: {{'{DR_ROW}': 'dynamic-rubric:generator=openai:{generator},verifier=openai:ver',\n"
        f"       '{JUDGE_ROW}': 'pairwise-judge:model=openai:judge'}}\n"
        f"benchmarks: [ultrafeedback]\nbackend: {{base_url: '{url}', concurrency: 8, max_attempts: 2}}\n")
    done = harness("run", "table1", "--config", str(config), "--limit", "6", "--seeds", "2", "--data-dir",
                   str(data), "--out", str(out), env=env)
    assert done.returncode in (0, 1), done.stderr  # 1: the `Perhaps` verdicts are recorded parse failures
    return out


def page_data(page: Path) -> tuple[dict, list[dict]]:
    """The page's embedded data block and its records' details, as the page's script reads them."""
    text = page.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S).group(1))
    details = []
    for block in re.findall(r'<script type="application/json" id="details-\d+">(.*?)</script>', text, re.S):
        details += json.loads(block)
    return data, details


def records(run: Path) -> list[EvalRecord]:
    return [EvalRecord.from_json(json.loads(line)) for line in (run / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def loopback():
    server = Loopback()
    with serve_in_thread(server) as url:
        yield url


def policy_runs(tmp_path: Path, url: str, data: Path, *, env: dict | None = None) -> tuple[Path, Path]:
    """A table2 run (AlpacaEval 2 and Arena-Hard v2.0, 2 items each) and a fig3 run (MMLU-Pro, 3 questions, no
    few-shot examples), the policy and the judge behind `url`."""
    table2, fig3 = tmp_path / "table2.yaml", tmp_path / "fig3.yaml"
    table2.write_text(f"only_rows: ['Native Qwen3-8B']\nrows: {{'Native Qwen3-8B': 'openai:policy'}}\n"
                      f"judge: openai:judge\nbenchmarks: [alpaca_eval2, arena_hard_v2]\n"
                      f"backend: {{base_url: '{url}', concurrency: 8, max_attempts: 2}}\n")
    fig3.write_text(f"only_rows: ['Native Qwen3-8B']\nrows: {{'Native Qwen3-8B': 'openai:policy'}}\n"
                    f"benchmarks: [mmlu_pro]\nbench_options: {{mmlu_pro: {{shots: 0}}}}\n"
                    f"backend: {{base_url: '{url}', concurrency: 8, max_attempts: 2}}\n")
    outs = []
    for table, config, limit in (("table2", table2, "2"), ("fig3", fig3, "3")):
        out = tmp_path / table
        done = harness("run", table, "--config", str(config), "--limit", limit, "--seeds", "1", "--data-dir",
                       str(data), "--out", str(out), env=env)
        assert done.returncode == 0, done.stderr
        outs.append(out)
    return outs[0], outs[1]


SYNTHETIC_ROWS = {DR_ROW: "dynamic-rubric:generator=hf:gen-a,verifier=hf:ver",
                  JUDGE_ROW: "dynamic-rubric:generator=hf:gen-b,verifier=hf:ver"}
_WORDS = ("the answer states each step and checks the result against the question before it concludes with a "
          "short summary of what was found and why it holds").split()


def _text(rng, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def synthetic_run(root: Path, *, items: int, repeats: int) -> Path:
    """A finished table1 run of the two `SYNTHETIC_ROWS` (dynamic rubrics: 5 weighted items, per-item verdicts
    with the verifier's answers, the generator's raw text; some verdicts failed) on `items` UltraFeedback-shaped
    pairs written under `root/data` x `repeats`: 2 x items x repeats records, no model involved."""
    import random

    from benchmarks.base import fingerprint
    from reports.results import benchmark

    rng = random.Random(0)
    data = root / "data"
    (data / "ultrafeedback").mkdir(parents=True)
    with open(data / "ultrafeedback" / "ultrafeedback_binarized_test_prefs_first500.jsonl", "w") as fh:
        for _ in range(items):
            prompt = _text(rng, 60)
            fh.write(json.dumps({"chosen": [{"role": "user", "content": prompt},
                                            {"role": "assistant", "content": _text(rng, 150)}],
                                 "rejected": [{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": _text(rng, 120)}]}) + "\n")
    loaded = benchmark("ultrafeedback").load(data_dir=data, limit=items, seed=0)
    run = root / "run"
    settings = {"table": "table1", "rows": SYNTHETIC_ROWS, "benchmarks": ["ultrafeedback"], "limit": items,
                "seeds": repeats, "seed": 0, "data": {"ultrafeedback": fingerprint(loaded)}, "models": {}}
    Manifest(run / "manifest.json").start(command="run", settings=settings, config={
        "table": "table1", "preset": "paper", "seeds": repeats, "data_dir": str(data)}, extra={
        "rows": SYNTHETIC_ROWS, "benchmark_kinds": {"ultrafeedback": "pairwise"}})
    with open(run / "records.jsonl", "w") as fh:
        for spec in SYNTHETIC_ROWS.values():
            for item in loaded:
                for repeat in range(repeats):
                    fh.write(json.dumps(_synthetic_record(rng, spec, item, repeat).to_json()) + "\n")
    return run


def _synthetic_record(rng, spec: str, item, repeat: int) -> EvalRecord:
    rubric = [{"criterion": f"The response {_text(rng, 8)}.", "weight": rng.randint(1, 5)} for _ in range(5)]
    verdicts = [[rng.choice((0.0, 1.0, 1.0)) for _ in range(2)] for _ in rubric]
    failures = []
    if rng.random() < 0.05:
        verdicts[0][1] = None
        failures.append({"stage": "verify", "response": 1, "item": 0, "category": "parse",
                         "message": "no Yes or No after a re-ask", "attempts": 2})
    total = sum(r["weight"] for r in rubric)
    scores = [None if any(v[k] is None for v in verdicts) else
              sum(r["weight"] * v[k] for r, v in zip(rubric, verdicts, strict=True)) / total for k in range(2)]
    answers = [["Yes" if v == 1.0 else "No" if v == 0.0 else "Perhaps" for v in row] for row in verdicts]
    trace = {"failures": failures, "rubric": rubric, "verdicts": verdicts, "pass_rates": None,
             "discriminability": None, "saturated_share": None, "order": [1, 0] if repeat % 2 else [0, 1],
             "raw": {"generator": json.dumps(rubric), "verifier": {"answers": answers, "retries": []}},
             "calls": 11}
    return EvalRecord(spec, "ultrafeedback", item.id, repeat, 1000 + repeat, "pairwise", tuple(scores),
                      meta=dict(item.meta), preferred=item.preferred, trace=trace)


# ---------- runs shared by the tests of this module (each with its own call cache) ----------

@pytest.fixture(scope="module")
def table1_runs(tmp_path_factory, loopback, shared_data: Path) -> tuple[Path, Path]:
    """A base and a candidate table1 run: the same rows, the candidate's rubric generator `gen2`."""
    root = tmp_path_factory.mktemp("table1")
    env = {"HARNESS_CALL_CACHE": str(root / "calls.sqlite")}
    return (table1_run(root, loopback, shared_data, root / "base", env=env),
            table1_run(root, loopback, shared_data, root / "cand", generator="gen2", env=env))


@pytest.fixture(scope="module")
def policy_pages(tmp_path_factory, loopback, shared_data: Path) -> tuple[Path, Path]:
    """The pages of a table2 run and a fig3 run."""
    pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")
    root = tmp_path_factory.mktemp("policy")
    runs = policy_runs(root, loopback, shared_data, env={"HARNESS_CALL_CACHE": str(root / "calls.sqlite")})
    pages = []
    for run in runs:
        done = harness("view", str(run))
        assert done.returncode == 0, done.stderr
        pages.append(run / "view.html")
    return pages[0], pages[1]


def _by_key(run: Path) -> dict[tuple, EvalRecord]:
    return {(r.evaluator, r.item, r.repeat): r for r in records(run)}


def _index(data: dict, details: list[dict]):
    """(run, evaluator spec, benchmark, item, repeat, status, flags, detail) per record of the page."""
    f = {name: i for i, name in enumerate(data["index_fields"])}
    for row, detail in zip(data["index"], details, strict=True):
        run = data["runs"][row[f["run"]]]
        yield (row[f["run"]], run["evaluators"][row[f["evaluator"]]]["spec"],
               data["benches"][row[f["bench"]]]["name"], row[f["item"]], row[f["repeat"]], row[f["status"]],
               row[f["flags"]], detail)


def test_table1_page_counts_each_record_by_its_benchmarks_metric(table1_runs, shared_data: Path):
    from benchmarks.scoring import PAIRWISE_ACC
    from reports.results import benchmark

    base, _ = table1_runs
    done = harness("view", str(base))
    assert done.returncode == 0, done.stderr
    assert f"wrote {base / 'view.html'} (" in done.stdout and "24 records)" in done.stdout
    data, details = page_data(base / "view.html")
    assert benchmark("ultrafeedback").metrics[0] == PAIRWISE_ACC
    by_key = _by_key(base)
    items = {i.id: i for i in benchmark("ultrafeedback").load(data_dir=shared_data, limit=6, seed=0)}
    shown = data["items"][data["runs"][0]["data"]["ultrafeedback"]]
    assert {k: (v["prompt"], tuple(v["responses"])) for k, v in shown.items()} == \
        {k: (i.prompt, i.responses) for k, i in items.items()}
    seen = set()
    for _, spec, _, item, repeat, status, flags, detail in _index(data, details):
        record = by_key[(spec, item, repeat)]
        seen.add((spec, item, repeat))
        assert status == (0 if PAIRWISE_ACC.per_item(record) == 1.0 else 1)
        assert flags == int(PAIRWISE_ACC.tied(record)) + 2 * int(PAIRWISE_ACC.failed(record))
        assert detail["scores"] == [None if s is None else round(s, 4) for s in record.scores]
        assert detail["gold"] == record.preferred
        if spec.startswith("dynamic-rubric"):
            # the scripted rubric, its repeated first criterion merged, and the scripted verdicts
            criteria = [c for c, _ in RUBRICS["gen"][:3]]
            assert [r["criterion"] for r in detail["trace"]["rubric"]] == criteria
            assert detail["trace"]["raw"]["rubric_merged"] == 1
            expected = [[{"yes": 1.0, "no": 0.0}.get(verdict(c, resp)) for resp in items[item].responses]
                        for c in criteria]
            assert detail["trace"]["verdicts"] == expected
        else:
            assert len(detail["trace"]["raw"]["games"]) == 2  # both orders
    assert seen == set(by_key) and len(seen) == 24
    statuses = {s for *_, s, _, _ in _index(data, details)}
    assert statuses == {0, 1}  # the run has right and wrong records, so the checks above see both


def test_policy_pages_show_answers_judgments_and_checks(policy_pages):
    from reports.results import benchmark

    table2, fig3 = policy_pages
    data, details = page_data(table2)
    rows = list(_index(data, details))
    assert {b for _, _, b, *_ in rows} == {"alpaca_eval2", "arena_hard_v2"} and len(rows) == 4
    for _, spec, bench, item, _, status, _, detail in rows:
        assert spec == "openai:policy" and status == 2  # judged metrics give values, not right or wrong
        assert "<think>" in detail["answer"]["raw"] and detail["answer"]["judged"] == "The answer is (B)."
        assert "judge" not in detail["trace"]  # the run's judge: shown once, in the overview
        if bench == "arena_hard_v2":
            games = detail["trace"]["judgment"]["games"]
            assert [(g["model_as_a"], g["verdict"]) for g in games] == [(False, "A>B"), (True, "A=B")]
        else:
            assert detail["trace"]["judgment"]["preference"] in (1.8, 1.3)
        item = data["items"][data["runs"][0]["data"][bench]][item]
        assert item["messages"][0][0] == "user" and item["messages"][0][1]
    assert any(b["name"] == "arena_hard_v2" and "baseline_answer" in it["meta"]
               for b in data["benches"] for fp, its in data["items"].items() for it in its.values())

    data, details = page_data(fig3)
    mmlu = benchmark("mmlu_pro").metrics[0]
    rows = list(_index(data, details))
    assert len(rows) == 3
    for _, _, bench, item, _, status, _, detail in rows:
        gold = data["items"][data["runs"][0]["data"][bench]][item]["meta"]["answer"]
        judgment = detail["trace"]["judgment"]
        assert (judgment["letter"], judgment["gold"]) == ("B", gold)
        assert status == (0 if gold == "B" else 1) and mmlu.binary


def test_two_runs_list_the_records_whose_outcome_changed(table1_runs):
    from benchmarks.scoring import PAIRWISE_ACC

    base, cand = table1_runs
    gate = harness("compare", str(base), str(cand))
    assert gate.returncode in (0, 1, 3), gate.stderr
    line = next(x for x in gate.stdout.splitlines() if x.startswith("items that changed, side by side: "))
    argv = shlex.split(line.split(": ", 1)[1])
    assert argv[:2] == ["harness", "view"] and argv[-1] == "--open"
    assert argv[2:] == [str(base), str(cand), "--out", str(cand / "compare.html"), "--open"]
    done = harness(*argv[1:-1])  # as printed, without opening a browser
    assert done.returncode == 0, done.stderr
    data, details = page_data(cand / "compare.html")
    b_recs, c_recs = _by_key(base), _by_key(cand)
    b_spec, c_spec = (json.loads((r / "manifest.json").read_text())["rows"][DR_ROW] for r in (base, cand))
    expected = set()
    for (spec, item, repeat), record in b_recs.items():
        if spec != b_spec:
            continue  # the pairwise judge is the same model in both runs
        before, after = PAIRWISE_ACC.per_item(record), PAIRWISE_ACC.per_item(c_recs[(c_spec, item, repeat)])
        if before != after:
            expected.add((item, repeat, "right to wrong" if before else "wrong to right"))
    found = {(c["item"], c["repeat"], c["change"]) for c in data["changes"]}
    assert found == expected
    assert {c for *_, c in found} == {"right to wrong", "wrong to right"}
    assert f"{len(expected)} changed)" in done.stdout
    gated = json.loads((cand / "compare.json").read_text())  # written by `harness compare` above
    assert data["gate"]["exit_code"] == gated["exit_code"] == gate.returncode
    assert [(c["row"], c["metric"], c["verdict"]) for c in data["gate"]["cells"]] == \
        [(c["row"], c["metric"], c["verdict"]) for c in gated["cells"]]
    index = list(_index(data, details))
    for c in data["changes"]:
        assert c["rows"] == [DR_ROW]
        assert index[c["base"]][:5] == (0, b_spec, "ultrafeedback", c["item"], c["repeat"])
        assert index[c["cand"]][:5] == (1, c_spec, "ultrafeedback", c["item"], c["repeat"])


def gate_runs(root: Path) -> tuple[Path, Path]:
    """Two synthetic table1 runs on 6 items x 1 repeat (no failures) that the gate judges apart: DR_ROW is right
    on every item in the base and wrong on every item in the candidate (a regression); JUDGE_ROW is right on
    items 1-3 in the base and on items 2-4 in the candidate (no change on average, but 6 items cannot see one
    of compare's default margin of 1 point: underpowered)."""
    right = {DR_ROW: ({0, 1, 2, 3, 4, 5}, set()), JUDGE_ROW: ({0, 1, 2}, {1, 2, 3})}
    runs = []
    for side, name in enumerate(("base", "cand")):
        run = synthetic_run(root / name, items=6, repeats=1)
        label = {spec: label for label, spec in SYNTHETIC_ROWS.items()}
        order: dict[str, int] = {}

        def scored(line: dict, side: int = side) -> dict:
            n = order.setdefault(line["item"], len(order))
            good = n in right[label[line["evaluator"]]][side]
            wins = line["preferred"] if good else 1 - line["preferred"]
            return {**line, "scores": [float(k == wins) for k in range(2)],
                    "trace": {**line["trace"], "failures": []}}

        _rewrite(run, scored)
        runs.append(run)
    return runs[0], runs[1]


def _renamed_first_item(line: dict) -> dict:
    """A record line of a synthetic run, its item renamed if it is the first item (the runs then pair in part)."""
    return {**line, "item": line["item"] + "-new"} if line["item"].endswith(":0") else line


def test_two_run_page_shows_the_gates_verdict_per_cell(tmp_path: Path):
    """The page of two runs holds `harness compare`'s cells (rounded): a regression, and an underpowered cell
    with its detectable half-width and the items it would need; runs compare would not compare hold its
    differences instead of verdicts."""
    from reports.compare import compare_runs

    base, cand = gate_runs(tmp_path)
    page = tmp_path / "gate.html"
    done = harness("view", str(base), str(cand), "--out", str(page))
    assert done.returncode == 0 and not done.stderr, done.stderr
    gate = page_data(page)[0]["gate"]
    assert gate["exit_code"] == 1 and gate["differences"] == [] and gate["alpha"] == 0.05
    cells = {c["row"]: c for c in gate["cells"]}
    assert set(cells) == {DR_ROW, JUDGE_ROW} and {c["metric"] for c in gate["cells"]} == {"acc"}
    drop = cells[DR_ROW]
    assert (drop["verdict"], drop["base"], drop["candidate"], drop["diff"]) == ("regression", 1.0, 0.0, -1.0)
    assert (drop["ci_low"], drop["ci_high"], drop["half_width"], drop["items_needed"]) == (-1.0, -1.0, 0.0, 1)
    weak = cells[JUDGE_ROW]
    expected = next(c for c in compare_runs(base, cand).cells if c.row == JUDGE_ROW)
    assert weak["verdict"] == expected.verdict == "underpowered"
    assert weak["half_width"] == round(expected.half_width, 4)
    assert weak["half_width"] * 100 > weak["margin"] == 1
    assert weak["items_needed"] == expected.items_needed > 6 and (weak["paired"], weak["n_items"]) == (6, 6)
    assert weak["diff"] == 0.0 and weak["ci_low"] < -0.01 < 0.01 < weak["ci_high"]
    assert all(isinstance(v, int) or v is None or len(repr(v)) <= 7
               for c in gate["cells"] for v in c.values() if not isinstance(v, str))  # rounded: 4 decimals

    partial = synthetic_run(tmp_path / "partial", items=6, repeats=1)
    _rewrite(partial, _renamed_first_item)
    done = harness("view", str(base), str(partial), "--out", str(tmp_path / "partial.html"))
    assert done.returncode == 0, done.stderr
    gate = page_data(tmp_path / "partial.html")[0]["gate"]
    assert gate["exit_code"] == 2 and gate["differences"] == compare_runs(base, partial).differences
    assert any("(item, repeat) sets differ" in d for d in gate["differences"])


HOSTILE = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">&amp; @@DATA@@'


def test_record_text_is_embedded_as_data_never_as_markup(tmp_path: Path):
    """Prompts, responses and raw model texts that look like markup (or like the page's own markers) stay
    text; a raw text beyond the bound is cut with a note; moved data is reported, not shown."""
    from reports.view.items import RAW_CHARS

    run = synthetic_run(tmp_path, items=3, repeats=1)
    lines = (run / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["trace"]["raw"]["generator"] = HOSTILE + "x" * (RAW_CHARS + 500)
    first["trace"]["rubric"][0]["criterion"] = HOSTILE
    (run / "records.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    done = harness("view", str(run), "--out", str(tmp_path / "page.html"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "page.html").read_text()
    assert "pwned" in text and text.count("</script>") == text.count("<script")  # none but the page's own
    data, details = page_data(tmp_path / "page.html")
    (hostile,) = [d for d in details if d["trace"]["rubric"][0]["criterion"] == HOSTILE]
    raw = hostile["trace"]["raw"]["generator"]
    assert raw.startswith(HOSTILE) and len(raw) < RAW_CHARS + 200
    assert raw.endswith(f"[{len(HOSTILE) + 500:,} more characters cut: records.jsonl and the data files hold the "
                        "whole text]")
    assert not data["runs"][0]["items_missing"]
    script = (Path(__import__("reports.view", fromlist=["x"]).__file__).parent / "view.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script

    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "data", moved)
    path = moved / "ultrafeedback" / "ultrafeedback_binarized_test_prefs_first500.jsonl"
    path.write_text(path.read_text().replace("the", "teh"))
    done = harness("view", str(run), "--data-dir", str(moved), "--out", str(tmp_path / "moved.html"))
    assert done.returncode == 0, done.stderr
    data, _ = page_data(tmp_path / "moved.html")
    assert "are not the ones the run saw" in data["runs"][0]["items_missing"]["ultrafeedback"]
    assert not data["items"]


def test_a_folder_without_a_run_is_a_clear_error(tmp_path: Path):
    done = harness("view", str(tmp_path))
    assert done.returncode == 2 and f"error: RUN {tmp_path}: not a run directory (no manifest.json)" in done.stderr


def test_a_figure_of_panels_names_its_panels(tmp_path: Path):
    from reports.panels import PANELS_FILE

    (tmp_path / PANELS_FILE).write_text(json.dumps({"table": "fig2", "panels": ["fig2a", "fig2b"]}))
    done = harness("view", str(tmp_path))
    assert done.returncode == 2 and "a figure of panels (fig2)" in done.stderr, done.stderr
    assert f"{tmp_path / 'fig2a'}, {tmp_path / 'fig2b'}" in done.stderr


def test_a_record_whose_failure_has_an_unknown_category_is_refused_naming_its_line(tmp_path: Path):
    """A failure category this harness does not know makes the record line malformed: `view` (as `report`,
    `compare` and a resumed run, which read records the same way) says which file and line, in one line."""
    run = synthetic_run(tmp_path, items=3, repeats=1)
    lines = (run / "records.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["trace"]["failures"] = [{"stage": "verify", "response": 0, "item": 0, "category": "gremlins",
                                    "message": "chewed the cable", "attempts": 1}]
    (run / "records.jsonl").write_text("\n".join([lines[0], json.dumps(second), *lines[2:]]) + "\n")
    for argv in (("view", str(run), "--out", str(tmp_path / "page.html")), ("report", str(run))):
        done = harness(*argv)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"error: {run / 'records.jsonl'}:2: not a eval/1 record (trace failure 1: "
                                      "unknown category 'gremlins'; known: rate_limit,"), done.stderr
    assert not (tmp_path / "page.html").exists()


def _rewrite(run: Path, change) -> None:
    lines = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    (run / "records.jsonl").write_text("".join(json.dumps(change(line)) + "\n" for line in lines))


def test_two_runs_with_no_record_in_common_are_refused_as_compare_finds_them(tmp_path: Path):
    """Two runs with no items in common, or no rows in common, have no changes to show: `view` refuses them
    with the differences `harness compare` names (the same rule), where it used to print `0 changed`. Runs that
    pair in part (a candidate still running) are shown, with compare's differences as a note."""
    base = synthetic_run(tmp_path / "base", items=3, repeats=1)
    same = synthetic_run(tmp_path / "same", items=3, repeats=1)
    done = harness("view", str(base), str(same), "--out", str(tmp_path / "same.html"))
    assert done.returncode == 0 and "12 records, 0 changed)" in done.stdout and not done.stderr, done.stderr

    other_items = synthetic_run(tmp_path / "items", items=3, repeats=1)
    _rewrite(other_items, lambda line: {**line, "item": "other-" + line["item"]})
    other_rows = synthetic_run(tmp_path / "rows", items=3, repeats=1)
    manifest = json.loads((other_rows / "manifest.json").read_text())
    manifest["rows"] = {f"{label} (new)": spec for label, spec in manifest["rows"].items()}
    (other_rows / "manifest.json").write_text(json.dumps(manifest))
    for cand, expected in ((other_items, "(item, repeat) sets differ: 3 only in BASE"),
                           (other_rows, "row 'DR-Generator-8B' is only in BASE")):
        page = tmp_path / f"{cand.parent.name}.html"
        done = harness("view", str(base), str(cand), "--out", str(page))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and not page.exists(), done.stderr
        head = f"error: runs have no record in common (BASE {base}, CAND {cand}), as `harness compare` finds: "
        assert done.stderr.startswith(head) and expected in done.stderr, done.stderr
        gate = harness("compare", str(base), str(cand), "--out", str(tmp_path / "gate"))
        assert gate.returncode == 2
        said = gate.stderr.strip().removeprefix("error: runs are not comparable: ")
        assert done.stderr.strip().removeprefix(head) == said

    partial = synthetic_run(tmp_path / "partial", items=3, repeats=1)
    lines = (partial / "records.jsonl").read_text().splitlines()
    (partial / "records.jsonl").write_text("".join(line + "\n" for line in lines
                                                   if json.loads(line)["item"] != json.loads(lines[0])["item"]))
    done = harness("view", str(base), str(partial), "--out", str(tmp_path / "partial.html"))
    assert done.returncode == 0 and "0 changed)" in done.stdout, done.stderr
    assert done.stderr.startswith("note: `harness compare` would not compare these runs (the page pairs what it "
                                  "can): ") and "only in BASE" in done.stderr, done.stderr


# ---------- in a real browser: Debian's Chromium driven by Selenium through Debian's chromium-driver ----------

def announce(config: pytest.Config, line: str) -> None:
    """Print `line` on the terminal even while output is captured (versions, sizes, times, screenshot paths)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest, tmp_path_factory):
    """Headless Chromium (`chromium` and `chromedriver` from the system; nothing is downloaded: Selenium gets both
    paths and runs offline). Missing ones skip the test here and fail it in CI, which installs them."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if path is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (the dev extra)")
    if missing:
        message = f"needs {', '.join(missing)} (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # Selenium Manager may look for nothing and fetch nothing
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1500,1100"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        scratch = tmp_path_factory.mktemp("chromium")  # its profile and sockets, not left in the system's /tmp
        options.add_argument(f"--user-data-dir={scratch / 'profile'}")
        service = Service(executable_path=driver, env={**os.environ, "TMPDIR": str(scratch)})
        drv = webdriver.Chrome(options=options, service=service)
    version = drv.capabilities["browserVersion"]
    driver_version = drv.capabilities["chrome"]["chromedriverVersion"].split()[0]
    announce(request.config, f"\nChromium {version} ({chromium}), chromedriver {driver_version} ({driver})")
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where screenshots go: $HARNESS_VIEW_SCREENSHOTS, else a temporary folder."""
    folder = Path(os.environ.get("HARNESS_VIEW_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _wait(drv, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, timeout).until(condition)


def open_page(drv, page: Path) -> float:
    """Load `page` and wait until its script has rendered the overview; the seconds that took."""
    from selenium.webdriver.common.by import By

    drv.get_log("browser")  # start from an empty log
    start = time.perf_counter()
    drv.get(page.resolve().as_uri())
    _wait(drv, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    seconds = time.perf_counter() - start
    assert drv.execute_script("return performance.getEntriesByType('resource').length") == 0  # fetched nothing
    return seconds


def click_cell(drv, row: str, bench: str):
    """Click the overview's (row, benchmark) cell and wait for the item view of its first record."""
    from selenium.webdriver.common.by import By

    drv.find_element(By.CSS_SELECTOR, f'button.cell[data-cell="{row}|{bench}"]').click()
    _wait(drv, lambda d: d.find_elements(By.CSS_SELECTOR, "#item .record.sel"))


def save_shot(drv, request: pytest.FixtureRequest, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    assert drv.save_screenshot(str(path)) and path.stat().st_size > 0
    announce(request.config, f"screenshot: {path}")
    return path


def js_errors(drv) -> list[dict]:
    return [entry for entry in drv.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.mark.slow
def test_browser_cell_to_verdict_matrix_and_wrong_only(browser, table1_runs, shared_data: Path, shots: Path,
                                                       request: pytest.FixtureRequest):
    """A cell of the loopback table1 run opens its items; an item shows the scripted rubric's yes/no/failed
    pattern; "wrong only" leaves exactly the records the benchmark's metric counts wrong; `j` steps on."""
    from selenium.webdriver.common.by import By

    from benchmarks.scoring import PAIRWISE_ACC
    from reports.results import benchmark

    base, _ = table1_runs
    assert harness("view", str(base)).returncode == 0
    open_page(browser, base / "view.html")
    save_shot(browser, request, shots, "table1-overview")
    click_cell(browser, DR_ROW, "ultrafeedback")

    items = {i.id: i for i in benchmark("ultrafeedback").load(data_dir=shared_data, limit=6, seed=0)}
    criteria = [c for c, _ in RUBRICS["gen"][:3]]
    pattern = {key: [[verdict(c, r) for r in item.responses] for c in criteria] for key, item in items.items()}
    target = next(key for key, p in pattern.items() if {"yes", "no", "failed"} <= {v for row in p for v in row})
    row = browser.find_element(By.CSS_SELECTOR, f'#list .vrow[data-item="{target}"][data-repeat="1"]')
    index = row.get_attribute("data-index")
    row.click()
    block = _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f'#item .record.sel[data-record="{index}"]'))
    cells = block.find_elements(By.CSS_SELECTOR, "table.matrix td[data-verdict]")
    shown = [[None] * 2 for _ in criteria]
    for cell in cells:
        m, k = int(cell.get_attribute("data-m")), int(cell.get_attribute("data-k"))
        shown[m][k] = cell.get_attribute("data-verdict")
    assert shown == pattern[target]
    assert all(c.text.startswith("failed: parse") for c in cells if c.get_attribute("data-verdict") == "failed")
    assert [c.text for c in block.find_elements(By.CSS_SELECTOR, "table.matrix tbody td:nth-child(2)")] == criteria
    browser.execute_script("arguments[0].scrollIntoView()", block)
    save_shot(browser, request, shots, "table1-item")

    spec = json.loads((base / "manifest.json").read_text())["rows"][DR_ROW]
    wrong = {(r.item, r.repeat) for r in records(base) if r.evaluator == spec and PAIRWISE_ACC.per_item(r) == 0.0}
    assert wrong and len(wrong) < 12  # some right, some wrong: the filter has something to do
    assert browser.find_element(By.ID, "count").text == "12 of 24 records"
    browser.find_element(By.ID, "f-wrong").click()
    _wait(browser, lambda d: d.find_element(By.ID, "count").text == f"{len(wrong)} of 24 records")
    rows = browser.find_elements(By.CSS_SELECTOR, "#list .vrow")
    assert {(r.get_attribute("data-item"), int(r.get_attribute("data-repeat"))) for r in rows} == wrong
    assert {r.get_attribute("data-status") for r in rows} == {"wrong"}

    first, second = (r.get_attribute("data-index") for r in rows[:2])
    rows[0].click()  # the list is redrawn: its rows are new elements after this
    _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#list .vrow.sel").get_attribute("data-index")
          == first)
    browser.find_element(By.TAG_NAME, "body").send_keys("j")
    _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#item .record.sel").get_attribute("data-record")
          == second)
    assert js_errors(browser) == []


@pytest.mark.slow
def test_browser_policy_items_and_the_two_run_drill_down(browser, policy_pages, table1_runs, shots: Path,
                                                         request: pytest.FixtureRequest):
    """Arena-Hard's two games and the folded reasoning; a checker's extracted answer against the gold one; the
    records that changed between two runs, side by side."""
    from selenium.webdriver.common.by import By

    table2, fig3 = policy_pages
    open_page(browser, table2)
    click_cell(browser, "Native Qwen3-8B", "arena_hard_v2")
    block = browser.find_element(By.CSS_SELECTOR, "#item .record.sel")
    verdicts = block.find_elements(By.CSS_SELECTOR, 'table.games td[data-role="verdict"]')
    assert [v.text for v in verdicts] == ["[[A>B]]", "[[A=B]]"]
    assert block.find_element(By.CSS_SELECTOR, 'pre[data-role="answer"]').text == "The answer is (B)."
    folded = block.find_element(By.XPATH, './/pre[@data-role="raw-answer"]/ancestor::details')
    assert folded.get_attribute("open") is None  # the reasoning stays folded until asked for
    save_shot(browser, request, shots, "policy-arena-item")

    open_page(browser, fig3)
    click_cell(browser, "Native Qwen3-8B", "mmlu_pro")
    block = browser.find_element(By.CSS_SELECTOR, "#item .record.sel")
    assert block.find_element(By.CSS_SELECTOR, 'td[data-role="extracted"]').text == "B"
    gold = block.find_element(By.CSS_SELECTOR, 'td[data-role="gold"]').text
    assert block.get_attribute("data-status") == ("right" if gold == "B" else "wrong")

    base, cand = table1_runs
    assert harness("view", str(base), str(cand)).returncode == 0
    data, _ = page_data(cand / "compare.html")
    open_page(browser, cand / "compare.html")
    browser.find_element(By.ID, "tab-changes").click()
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#change-list .vrow")) == len(data["changes"]))
    browser.find_element(By.CSS_SELECTOR, '#change-list .vrow[data-change="right to wrong"]').click()
    sides = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#change .sidebyside .record"))
    assert [s.get_attribute("data-status") for s in sides] == ["right", "wrong"]
    save_shot(browser, request, shots, "two-runs-change")
    assert js_errors(browser) == []


@pytest.mark.slow
def test_browser_two_run_page_opens_on_the_gate(browser, tmp_path: Path, shots: Path,
                                                 request: pytest.FixtureRequest):
    """The two-run page's overview starts with the gate's table: each cell's verdict as a visible state (its own
    class and `data-verdict`), the underpowered cell's detectable half-width and items needed; runs compare would
    not compare show its differences and no verdict."""
    from selenium.webdriver.common.by import By

    base, cand = gate_runs(tmp_path)
    page = tmp_path / "gate.html"
    assert harness("view", str(base), str(cand), "--out", str(page)).returncode == 0
    cells = {c["row"]: c for c in page_data(page)[0]["gate"]["cells"]}
    open_page(browser, page)
    first = browser.find_element(By.CSS_SELECTOR, "#overview > *")
    assert first.get_attribute("id") == "gate" and first.get_attribute("data-exit") == "1"
    rows = {r.get_attribute("data-row"): r for r in first.find_elements(By.CSS_SELECTOR, "table.gate tr.gate-cell")}
    assert {row: r.get_attribute("data-verdict") for row, r in rows.items()} == \
        {DR_ROW: "regression", JUDGE_ROW: "underpowered"}
    weak = rows[JUDGE_ROW]
    assert weak.find_element(By.CSS_SELECTOR, 'td[data-role="half-width"]').text == \
        f"±{cells[JUDGE_ROW]['half_width'] * 100:.2f}"
    assert weak.find_element(By.CSS_SELECTOR, 'td[data-role="items-needed"]').text == \
        str(cells[JUDGE_ROW]["items_needed"])
    for row, verdict in ((DR_ROW, "regression"), (JUDGE_ROW, "underpowered")):
        badge = rows[row].find_element(By.CSS_SELECTOR, ".verdict")
        assert badge.text == verdict and f"verdict-{verdict}" in badge.get_attribute("class").split()
        assert badge.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"  # styled: a visible state
    assert rows[DR_ROW].find_element(By.CSS_SELECTOR, 'td[data-role="diff"]').text == \
        "-100.00 [-100.00, -100.00]"
    save_shot(browser, request, shots, "two-runs-gate")

    partial = synthetic_run(tmp_path / "partial", items=6, repeats=1)
    _rewrite(partial, _renamed_first_item)
    assert harness("view", str(base), str(partial), "--out", str(tmp_path / "partial.html")).returncode == 0
    differences = page_data(tmp_path / "partial.html")[0]["gate"]["differences"]
    open_page(browser, tmp_path / "partial.html")
    gate = browser.find_element(By.ID, "gate")
    assert gate.get_attribute("data-comparable") == "false" and not gate.find_elements(By.CSS_SELECTOR, "table")
    assert [li.text for li in gate.find_elements(By.CSS_SELECTOR, "ul.gate-differences li")] == differences
    assert js_errors(browser) == []


@pytest.mark.slow
def test_browser_opens_and_filters_20000_records(browser, tmp_path: Path, shots: Path,
                                                 request: pytest.FixtureRequest):
    """A synthetic run of 20,000 records: the page's size, the time to open it, to filter it and to open an
    item (measured and printed; the bounds only catch a page that freezes)."""
    from selenium.webdriver.common.by import By

    run = synthetic_run(tmp_path, items=2000, repeats=5)
    built = harness("view", str(run))
    assert built.returncode == 0, built.stderr
    page = run / "view.html"
    data, _ = page_data(page)
    f = {name: i for i, name in enumerate(data["index_fields"])}
    n_wrong = sum(row[f["status"]] == 1 for row in data["index"])
    opened = open_page(browser, page)
    assert browser.execute_script("return window.harnessView.records") == 20000
    browser.find_element(By.ID, "tab-items").click()
    timed = ("const t = performance.now(); document.getElementById('f-wrong').click(); "
             "return performance.now() - t;")
    filter_ms = browser.execute_script(timed)
    assert browser.find_element(By.ID, "count").text == f"{n_wrong} of 20000 records"
    browser.execute_script("document.getElementById('f-q').value = 'test_prefs:1999';")
    search_ms = browser.execute_script(timed)  # wrong only off again, the search on
    assert browser.find_element(By.ID, "count").text == "10 of 20000 records"
    item_ms = browser.execute_script("const t = performance.now(); document.querySelector('#list .vrow').click(); "
                                     "return performance.now() - t;")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#item .record.sel table.matrix"))
    save_shot(browser, request, shots, "synthetic-20000-item")
    size = page.stat().st_size
    announce(request.config, f"20,000 records: page {size / 1e6:.1f} MB; open {opened:.2f} s; filter wrong only "
             f"{filter_ms:.0f} ms; search {search_ms:.0f} ms; open an item {item_ms:.0f} ms")
    assert opened < 30 and filter_ms < 2000 and search_ms < 5000 and item_ms < 2000
    assert js_errors(browser) == []
