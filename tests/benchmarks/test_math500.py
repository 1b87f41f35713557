"""MATH-500: the loader on the local file, math-verify's checks (gold self-check 500/500, corrupted answers fail,
a pathological expression times out as a counted failure without hanging), and `harness run fig3` (MATH-500,
MMLU-Pro, CodeScope) end to end with a loopback policy: table, CSV, the figure as PNG and PDF, and `harness compare`
catching a policy that lost MATH-500."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.math500 import PROMPT_SUFFIX, Math500
from harness.errors import ConfigError

pytest.importorskip("math_verify", reason="the verifiable extra (math-verify) is not installed")

HANG_GUARD_S = 600
"""A bound that only stops a hang: math-verify's checks take milliseconds, its pool's start seconds."""


@pytest.fixture(scope="module")
def items(shared_data: Path):
    return Math500().load(data_dir=shared_data)


def test_the_local_file_gives_the_500_problems(items, shared_data: Path, tmp_path: Path):
    assert len(items) == 500 and len({i.id for i in items}) == 500
    first = items[0]
    assert first.id == "math500:test/precalculus/807.json"
    assert first.meta["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.messages[0].content.endswith(PROMPT_SUFFIX)
    assert Math500().load(data_dir=shared_data, limit=3) == items[:3]
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": ""}) + "\n")
    with pytest.raises(ConfigError, match="missing field"):
        Math500().load(data_dir=tmp_path)


def test_math_verify_self_check_corruption_and_a_timeout(items):
    from judges.math_check import MathChecker

    checker = MathChecker(timeout_s=HANG_GUARD_S, workers=2)
    try:
        found = [checker.check(i.meta["answer"], f"So the answer is $\\boxed{{{i.meta['answer']}}}$.") for i in items]
        assert sum(ok is True for ok, *_ in found) == 500
        corrupted = [checker.check(i.meta["answer"], f"$\\boxed{{{i.meta['answer']} + 1}}$")[0] for i in items[:40]]
        assert sum(ok is True for ok in corrupted) == 0
        assert checker.check("3", "I am not sure.")[0] is False  # no answer at all: wrong, not a failure
    finally:
        checker.close()
    quick = MathChecker(timeout_s=2, workers=1)
    try:
        ok, _, _, failure = quick.check("1", "$\\boxed{9^{9^{9^{9^{9}}}}!}$")  # never finishes: cut off
        assert ok is None and failure is not None and failure.message == "timeout: math-verify took over 2 s"
        # A fresh worker replaces the killed one; its start (seconds on a busy machine) is outside the bound.
        assert quick.check("2", "$\\boxed{2}$")[0] is True
    finally:
        quick.close()


def test_fig3_runs_a_loopback_policy_and_draws_the_figure(tmp_path: Path, shared_data: Path, items):
    from harness.loopback import chat_completion, json_response, serve_in_thread

    from benchmarks.codescope import CodeScope
    from benchmarks.mmlu_pro import MMLUPro

    answers = {i.messages[0].content: i.meta["answer"] for i in items[:4]}
    letters = {i.messages[0].content: i.meta["answer"] for i in MMLUPro().load(data_dir=shared_data, limit=4, shots=0)}
    smells = {i.messages[0].content: i.meta["gold"] for i in CodeScope().load(data_dir=shared_data, limit=4)}
    stops = []

    async def policy(request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        text = body["messages"][-1]["content"]
        if text in letters:  # MMLU-Pro: right on the first and third question
            stops.append(body.get("stop"))
            gold = letters[text]
            shown = gold if sorted(letters).index(text) % 2 == 0 else "ABCDEFGHIJ"[("ABCDEFGHIJ".index(gold) + 1) % 3]
            return json_response(chat_completion([f"<think>the answer is ({gold})</think>So the answer is ({shown})."]))
        if text in smells:  # CodeScope: the gold label on the first question only, no label on the last
            rank = sorted(smells).index(text)
            shown = [smells[text].title(), "blob" if smells[text] != "blob" else "data class", "long method?",
                     "I cannot tell."][rank]
            return json_response(chat_completion([shown]))
        answer = answers.get(text)
        right = answer is not None and sorted(answers).index(text) != 3 and body["model"] != "worse"
        shown = answer if right else "0"
        return json_response(chat_completion([f"<think>\\boxed{{{answer}}}</think>The answer is $\\boxed{{{shown}}}$."]))

    config = tmp_path / "fig3.yaml"
    with serve_in_thread(policy) as url:
        config.write_text("only_rows: ['Native Qwen3-8B']\nrows: {'Native Qwen3-8B': 'openai:policy'}\n"
                          "bench_options: {mmlu_pro: {shots: 0}}\n"  # the local data has no validation split
                          # a check's bound covers the checker pool's start: a busy machine needs over 10 s
                          f"judge_settings: {{math500: {{timeout_s: {HANG_GUARD_S}}}}}\n"
                          f"backend: {{base_url: '{url}'}}\n")
        argv = [sys.executable, "-m", "harness", "run", "fig3", "--config", str(config), "--limit", "4", "--seeds",
                "2", "--data-dir", str(shared_data)]
        done = subprocess.run([*argv, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
        # The same table with a policy that gets every MATH-500 problem wrong, for the gate.
        config.write_text(config.read_text().replace("openai:policy", "openai:worse"))
        worse = subprocess.run([*argv, "--out", str(tmp_path / "worse")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "run"
    cells = json.loads((out / "results.json").read_text())["results"]["Native Qwen3-8B"]["benchmarks"]
    # Three of the four problems answered right in both repeats; the thinking (which holds the gold) is never
    # checked.
    assert cells["math500"]["acc"]["value"] == pytest.approx(0.75) and cells["math500"]["acc"]["repeats"] == 2
    assert cells["mmlu_pro"]["acc"]["value"] == pytest.approx(0.5)
    assert sum(cells["mmlu_pro"]["details"]["acc"][0]["per_category_n"].values()) == 4
    # Right on the first question; wrong on the second; the third is right only where its gold is long method;
    # the fourth names no label.
    smell_right = 1 + (smells[sorted(smells)[2]] == "long method")
    assert cells["codescope"]["acc"]["value"] == pytest.approx(smell_right / 4)
    assert cells["codescope"]["acc"]["n_failed"] == 2  # the unextracted answer, in both repeats
    assert stops and all("Question:" in s for s in stops)  # MMLU-Pro's stop string reaches the request
    assert f"| Native Qwen3-8B | **75.0** | **50.0** | **{100 * smell_right / 4:.1f}** |" in (out / "table.md").read_text()
    assert "judge: none (deterministic checkers)" in (out / "table.md").read_text()
    png, pdf = (out / "figure.png").read_bytes(), (out / "figure.pdf").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000 and pdf.startswith(b"%PDF")
    import matplotlib.image

    pixels = matplotlib.image.imread(out / "figure.png")
    assert pixels.std() > 0.01  # not a blank image

    assert worse.returncode == 0, worse.stderr[-2000:]
    gate = subprocess.run([sys.executable, "-m", "harness", "compare", str(out), str(tmp_path / "worse"), "--margin",
                           "1"], capture_output=True, text=True, timeout=120)
    assert gate.returncode == 1, gate.stdout + gate.stderr  # MATH-500 fell from 75 to 0: a regression
    verdicts = {c["benchmark"]: c["verdict"] for c in json.loads((tmp_path / "worse" / "compare.json").read_text())["cells"]}
    assert verdicts == {"math500": "regression", "mmlu_pro": "no significant change",
                        "codescope": "no significant change"}


def test_a_checks_bound_starts_when_a_worker_takes_it_and_a_timeout_stops_no_other():
    """The workers' start (a fresh Python importing math-verify) is outside every check's bound, and the check
    that times out is the only one stopped: the check beside it, in the other worker, finishes."""
    from concurrent.futures import ThreadPoolExecutor

    from judges.math_check import MathChecker

    checker = MathChecker(timeout_s=1.5, workers=2)
    try:
        assert checker.check("2", "$\\boxed{2}$")[0] is True  # its worker started first, outside the 1.5 s
        with ThreadPoolExecutor(2) as pool:
            hang = pool.submit(checker.check, "1", "$\\boxed{9^{9^{9^{9^{9}}}}!}$")
            fine = [pool.submit(checker.check, str(n), f"$\\boxed{{{n}}}$") for n in range(3)]
            assert [f.result()[0] for f in fine] == [True, True, True]
            assert hang.result()[3].message == "timeout: math-verify took over 1.5 s"
    finally:
        checker.close()
