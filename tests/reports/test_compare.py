"""`harness compare`: planted regressions and improvements, unchanged and incomparable runs, and its statistics."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import metrics
from harness.records import EvalRecord
from harness.runstore import Manifest
from reports.compare import CompareConfig, compare_runs, read_run, render_markdown
from reports.results import compute_results

ROW = "DR-Generator-8B"
VERIFIER = "hf:verifier"
MODELS = {"hf:base-gen": {"kind": "hf", "weights": "aa"}, "hf:cand-gen": {"kind": "hf", "weights": "bb"},
          VERIFIER: {"kind": "hf", "weights": "vv"}}


def _pairwise(spec: str, bench: str, item: str, repeat: int, correct: bool, meta=None) -> EvalRecord:
    return EvalRecord(spec, bench, item, repeat, 0, "pairwise", (1.0, 0.0) if correct else (0.0, 1.0),
                      meta=meta or {}, preferred=0)


def make_run(path: Path, records: list[EvalRecord], *, rows: dict[str, str], data: dict[str, str] | None = None,
             models: dict | None = None) -> Path:
    """A run directory written through the run store's own manifest and record format."""
    benches = sorted({r.benchmark for r in records})
    settings = {"table": "table1", "rows": rows, "benchmarks": benches, "limit": None, "seeds": 1, "seed": 0,
                "data": data or {b: "fp-" + b for b in benches}, "models": models or MODELS}
    Manifest(path / "manifest.json").start(command="run", settings=settings, config={}, extra={"rows": rows})
    (path / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def _spec(generator: str, verifier: str | None = VERIFIER, **extra: str) -> str:
    parts = [f"generator={generator}"] + ([f"verifier={verifier}"] if verifier else [])
    parts += [f"{k}={v}" for k, v in extra.items()]
    return "dynamic-rubric:" + ",".join(parts)


BASE_SPEC, CAND_SPEC = _spec("hf:base-gen"), _spec("hf:cand-gen")


def _correctness(n: int, share: float, seed: int) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < share for _ in range(n)]


def _runs(tmp_path: Path, base: list[bool], cand: list[bool], **kw) -> tuple[Path, Path]:
    b = [_pairwise(BASE_SPEC, "ultrafeedback", f"i{i}", 0, ok) for i, ok in enumerate(base)]
    c = [_pairwise(CAND_SPEC, "ultrafeedback", f"i{i}", 0, ok) for i, ok in enumerate(cand)]
    return (make_run(tmp_path / "base", b, rows={ROW: BASE_SPEC}),
            make_run(tmp_path / "cand", c, rows={ROW: CAND_SPEC}, **kw))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "compare", *args], capture_output=True, text=True,
                          timeout=120)


def test_planted_regression_exits_1(tmp_path: Path):
    base = _correctness(300, 0.8, 1)
    cand = [ok and random.Random(i).random() > 0.25 for i, ok in enumerate(base)]  # ~20 points lost
    base_dir, cand_dir = _runs(tmp_path, base, cand)
    proc = _cli(str(base_dir), str(cand_dir), "--out", str(tmp_path / "gate"))
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "gate" / "compare.json").read_text())
    (cell,) = report["cells"]
    assert cell["verdict"] == "regression" and cell["ci_high"] * 100 < -1
    assert cell["diff"] == pytest.approx(np.mean(cand) - np.mean(base))
    assert cell["mcnemar"]["candidate_only"] == 0 and cell["mcnemar"]["base_only"] == sum(base) - sum(cand)
    assert cell["mcnemar"]["p"] < 1e-6
    assert "**regression**" in (tmp_path / "gate" / "compare.md").read_text()


def test_planted_improvement_exits_0_and_is_flagged(tmp_path: Path):
    base = _correctness(300, 0.5, 2)
    cand = [ok or random.Random(i).random() < 0.5 for i, ok in enumerate(base)]
    base_dir, cand_dir = _runs(tmp_path, base, cand)
    proc = _cli(str(base_dir), str(cand_dir))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((cand_dir / "compare.json").read_text())  # --out defaults to the candidate run
    assert report["improvements"] == 1 and report["regressions"] == 0
    assert "**improvement**" in proc.stdout


def test_unchanged_run_exits_0(tmp_path: Path):
    base = _correctness(100, 0.6, 3)
    base_dir, cand_dir = _runs(tmp_path, base, list(base))
    result = compare_runs(base_dir, cand_dir)
    (cell,) = result.cells
    assert (cell.diff, cell.ci_low, cell.ci_high) == (0.0, 0.0, 0.0)
    assert cell.verdict == "no significant change" and cell.mcnemar == {"base_only": 0, "candidate_only": 0, "p": 1.0}
    assert result.exit_code == 0


def test_a_small_loss_within_the_margin_is_no_change(tmp_path: Path):
    base = [True] * 200
    cand = [True] * 199 + [False]  # -0.5 points, interval [-1.5, 0]
    result = compare_runs(*_runs(tmp_path, base, cand))
    assert result.cells[0].verdict == "no significant change"
    strict = compare_runs(tmp_path / "base", tmp_path / "cand", CompareConfig(margins={"ultrafeedback": 0.0}))
    assert strict.cells[0].margin == 0.0 and strict.cells[0].ci_high <= 0


def test_a_gate_too_small_for_its_margin_says_underpowered_and_require_power_exits_3(tmp_path: Path):
    """100 items, one seed, a 7-point drop (10 items lost, 3 gained) against a 2-point margin: the interval cannot
    exclude the margin, so the cell is underpowered (not "no significant change"), with its half-width and the
    items that would do; exit 0, and 3 with --require-power."""
    base = [i % 10 < 7 for i in range(100)]
    cand = list(base)
    lost = [i for i, ok in enumerate(base) if ok][:10]
    gained = [i for i, ok in enumerate(base) if not ok][:3]
    for i in lost:
        cand[i] = False
    for i in gained:
        cand[i] = True
    base_dir, cand_dir = _runs(tmp_path, base, cand)
    proc = _cli(str(base_dir), str(cand_dir), "--margin", "2", "--out", str(tmp_path / "gate"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "gate" / "compare.json").read_text())
    (cell,) = report["cells"]
    assert cell["diff"] == pytest.approx(-0.07) and cell["ci_high"] * 100 > -2
    assert cell["verdict"] == "underpowered" and report["underpowered"] == 1
    assert cell["half_width"] == pytest.approx((cell["ci_high"] - cell["ci_low"]) / 2)
    assert cell["half_width"] * 100 > 2
    assert cell["items_needed"] == int(np.ceil(100 * (cell["half_width"] * 100 / 2) ** 2)) > 100
    assert "underpowered" in (tmp_path / "gate" / "compare.md").read_text()
    assert "underpowered: 1 cell(s) could not have seen a change of their margin" in proc.stderr
    required = _cli(str(base_dir), str(cand_dir), "--margin", "2", "--require-power", "--out", str(tmp_path / "g2"))
    assert required.returncode == 3, required.stdout + required.stderr
    wide_margin = compare_runs(base_dir, cand_dir, CompareConfig(margin=20.0, require_power=True))
    assert wide_margin.cells[0].verdict == "no significant change" and wide_margin.exit_code == 0


@pytest.mark.parametrize(
    ("cand_spec", "data", "models", "message"),
    [
        (CAND_SPEC, {"ultrafeedback": "other"}, None, "benchmark 'ultrafeedback': dataset fingerprints differ"),
        (_spec("hf:cand-gen", "hf:other-verifier"), None, None, "setting 'verifier' differs"),
        (_spec("hf:cand-gen", None), None, None,
         "setting 'verifier' differs (BASE hf:verifier, CAND hf:cand-gen)"),  # the implicit verifier is the generator
        (_spec("hf:cand-gen", gen_max_tokens="64"), None, None, "setting 'gen_max_tokens' differs"),
        (CAND_SPEC, None, {**MODELS, VERIFIER: {"kind": "hf", "weights": "changed"}},
         "verifier 'hf:verifier' is not the same model in both runs"),
        ("scalar-rm:model=hf:x", None, None, "evaluator kinds differ"),
    ],
)
def test_incomparable_runs_exit_2_naming_the_difference(tmp_path, cand_spec, data, models, message):
    base = _correctness(50, 0.5, 4)
    b = [_pairwise(BASE_SPEC, "ultrafeedback", f"i{i}", 0, ok) for i, ok in enumerate(base)]
    c = [_pairwise(cand_spec, "ultrafeedback", f"i{i}", 0, ok) for i, ok in enumerate(base)]
    base_dir = make_run(tmp_path / "base", b, rows={ROW: BASE_SPEC})
    cand_dir = make_run(tmp_path / "cand", c, rows={ROW: cand_spec}, data=data, models=models)
    proc = _cli(str(base_dir), str(cand_dir))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert json.loads((cand_dir / "compare.json").read_text())["comparable"] is False


def test_different_items_or_rows_are_incomparable(tmp_path: Path):
    base = _correctness(40, 0.5, 5)
    base_dir, cand_dir = _runs(tmp_path, base, base[:37])
    result = compare_runs(base_dir, cand_dir)
    assert result.exit_code == 2
    assert "(item, repeat) sets differ: 3 only in BASE (i37#0, i38#0, i39#0)" in result.differences[0]
    other = make_run(tmp_path / "other", [_pairwise(CAND_SPEC, "ultrafeedback", f"i{i}", 0, True) for i in range(40)],
                     rows={"Another row": CAND_SPEC})
    differences = compare_runs(base_dir, other).differences
    assert "row 'DR-Generator-8B' is only in BASE" in differences and "row 'Another row' is only in CAND" in differences


def test_not_a_run_is_a_clear_error(tmp_path: Path):
    proc = _cli(str(tmp_path), str(tmp_path))
    assert proc.returncode == 2 and f"BASE_RUN {tmp_path}: not a run directory" in proc.stderr


def test_values_are_the_reports_avg_at_k_for_every_declared_metric(tmp_path: Path):
    """Repeats averaged per item, listwise nDCG and RM-Bench's weighted overall agree with results.json."""
    rng = random.Random(7)
    records = {"base": [], "cand": []}
    for which, spec in (("base", BASE_SPEC), ("cand", CAND_SPEC)):
        for i in range(30):
            for repeat in range(3):
                scores = tuple(rng.random() for _ in range(4))
                records[which].append(EvalRecord(spec, "nectar_lmsys", f"l{i}", repeat, 0, "listwise", scores,
                                                 gold_ranks=(1, 2, 3, 4)))
                meta = {"domain_group": ["chat", "code"][i % 2], "chosen_style": str(i % 3),
                        "rejected_style": str(repeat), "domain": "x"}
                records[which].append(_pairwise(spec, "rm_bench", f"r{i}", repeat, rng.random() < 0.5, meta))
    base_dir = make_run(tmp_path / "base", records["base"], rows={ROW: BASE_SPEC})
    cand_dir = make_run(tmp_path / "cand", records["cand"], rows={ROW: CAND_SPEC})
    cells = {(c.benchmark, c.metric): c for c in compare_runs(base_dir, cand_dir).cells}
    assert set(cells) == {("nectar_lmsys", "acc"), ("nectar_lmsys", "ndcg"), ("rm_bench", "acc"),
                          ("rm_bench", "pooled_acc")}
    for which, spec in (("base", BASE_SPEC), ("cand", CAND_SPEC)):
        reported = compute_results(records[which], {ROW: spec})[ROW]["benchmarks"]
        for (bench, metric), cell in cells.items():
            value = cell.base if which == "base" else cell.candidate
            assert value == pytest.approx(reported[bench][metric]["value"], abs=1e-12), (bench, metric)
    assert cells[("nectar_lmsys", "ndcg")].mcnemar is None and cells[("rm_bench", "acc")].mcnemar is not None
    assert cells[("nectar_lmsys", "acc")].repeats == 3 and cells[("nectar_lmsys", "acc")].n_items == 30


def test_paired_bootstrap_against_hand_values_and_scipy():
    base = np.array([1, 0, 1, 1, 0, 1, 0, 0], dtype=float)
    # A constant shift of every item: every resample has the same difference.
    assert metrics.paired_bootstrap_ci(base, base + 0.25) == (pytest.approx(0.25), pytest.approx(0.25))
    # One resample by hand: the same item indices on both sides, weighted means.
    w = np.array([1, 2, 1, 2, 1, 2, 1, 2], dtype=float)
    cand = np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=float)
    idx = np.random.default_rng(0).integers(0, 8, size=(1, 8))[0]
    by_hand = (cand[idx] * w[idx]).sum() / w[idx].sum() - (base[idx] * w[idx]).sum() / w[idx].sum()
    assert metrics.paired_bootstrap_ci(base, cand, weights=w, n_resamples=1, seed=0) == (
        pytest.approx(by_hand), pytest.approx(by_hand))
    # Against scipy's paired percentile bootstrap (its own generator: agree to Monte Carlo error).
    from scipy import stats

    rng = np.random.default_rng(3)
    b = (rng.random(400) < 0.6).astype(float)
    c = np.where(rng.random(400) < 0.2, 1 - b, b)
    ours = metrics.paired_bootstrap_ci(b, c, n_resamples=20000, seed=1)
    theirs = stats.bootstrap((b, c), lambda x, y: np.mean(y) - np.mean(x), paired=True, vectorized=False,
                             n_resamples=20000, method="percentile", random_state=2).confidence_interval
    assert ours == (pytest.approx(theirs.low, abs=0.006), pytest.approx(theirs.high, abs=0.006))


@pytest.mark.parametrize(("b", "c"), [(0, 0), (1, 9), (9, 1), (5, 5), (3, 12), (40, 61), (0, 7)])
def test_mcnemar_exact_equals_the_binomial_test(b, c):
    from scipy import stats

    expected = 1.0 if b + c == 0 else stats.binomtest(min(b, c), b + c, 0.5).pvalue
    assert metrics.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)
    if (b, c) == (1, 9):
        assert metrics.mcnemar_exact(b, c) == 2 * (1 + 10) / 1024  # by hand: 2 P(X <= 1), X ~ Bin(10, 1/2)


def test_config_file_and_bad_config(tmp_path: Path):
    base_dir, cand_dir = _runs(tmp_path, [True] * 20, [True] * 20)
    cfg = tmp_path / "gate.yaml"
    cfg.write_text("margin: 2\nmargins: {ultrafeedback.acc: 0.5}\nn_resamples: 200\n")
    proc = _cli(str(base_dir), str(cand_dir), "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((cand_dir / "compare.json").read_text())
    assert report["cells"][0]["margin"] == 0.5 and report["config"]["n_resamples"] == 200
    cfg.write_text("margn: 2\n")
    proc = _cli(str(base_dir), str(cand_dir), "--config", str(cfg))
    assert proc.returncode == 2 and "margn" in proc.stderr
    cfg.write_text("margins: {ultrafedback: 0}\n")  # a misspelt benchmark was ignored: the default margin applied
    proc = _cli(str(base_dir), str(cand_dir), "--config", str(cfg))
    assert proc.returncode == 2, proc.stdout
    assert "margins: 'ultrafedback': unknown benchmark 'ultrafedback' (did you mean 'ultrafeedback'?)" in proc.stderr
    cfg.write_text("margins: {ultrafeedback.ndcg: 0}\n")
    proc = _cli(str(base_dir), str(cand_dir), "--config", str(cfg))
    assert proc.returncode == 2 and "has no metric 'ndcg'; it declares: acc" in proc.stderr
    cfg.write_text("margins: {ultrafeedback: 0\nseed: [\n")
    proc = _cli(str(base_dir), str(cand_dir), "--config", str(cfg))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{cfg}: the compare config is not valid YAML:" in proc.stderr and "line 2, column" in proc.stderr


def _judged(spec: str, item: int, preference: float | None, *, category: str = "parse") -> EvalRecord:
    """An AlpacaEval 2 policy record: the judge's preference, or a failed judgment of `category`."""
    failures = [] if preference is not None else [
        {"stage": "judge", "response": None, "item": None, "category": category, "message": "no m/M", "attempts": 1}]
    annotation = {"instruction": f"q{item}", "output_1": "ref", "generator_1": "ref", "output_2": "answer"}
    return EvalRecord(spec, "alpaca_eval2", f"alpaca_eval:{item:04d}", 0, 0, "policy", (preference,),
                      meta={"index": str(item)}, trace={"failures": failures, "annotation": annotation})


def _policy_runs(tmp_path: Path, base: list, cand: list, *, category: str = "parse") -> tuple[Path, Path]:
    judge = {"model": "openai:judge", "options": {}, "settings": {}}
    runs = []
    for name, spec, prefs in (("base", "openai:p1", base), ("cand", "openai:p2", cand)):
        records = [_judged(spec, i, p, category=category) for i, p in enumerate(prefs)]
        path = make_run(tmp_path / name, records, rows={ROW: spec}, models={})
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["settings"]["judge"] = judge
        (path / "manifest.json").write_text(json.dumps(manifest))
        runs.append(path)
    return runs[0], runs[1]


def test_a_judged_metric_pairs_only_items_both_runs_scored(tmp_path: Path):
    """Final judge failures (parse) weigh 0: the item is dropped from both sides and counted; the base's value
    over the paired items is printed beside its own results.json value."""
    base = [2.0, 2.0, 1.0, 1.5]
    cand = [1.0, None, 1.0, 1.5]  # item 1 could not be judged in CAND
    result = compare_runs(*_policy_runs(tmp_path, base, cand))
    wr = next(c for c in result.cells if c.metric == "win_rate")
    assert (wr.paired, wr.dropped, wr.base_failed, wr.candidate_failed) == (3, 1, 0, 1)
    assert wr.base == pytest.approx((1.0 + 0.0 + 0.5) / 3) and wr.candidate == pytest.approx(0.5 / 3)
    assert wr.base_reported == pytest.approx((1 + 1 + 0 + 0.5) / 4)  # results.json: all four judged items
    reported = compute_results(read_run(tmp_path / "base", "BASE_RUN").records, {ROW: "openai:p1"})
    assert reported[ROW]["benchmarks"]["alpaca_eval2"]["win_rate"]["value"] == pytest.approx(wr.base_reported)
    assert wr.verdict != "incomplete" and result.exit_code in (0, 1)
    markdown = render_markdown(result)
    assert "| 3/4 | 0/1 |" in markdown
    assert "BASE is 50.0 over the paired items and 62.5 in its results.json (1 of 4 item(s) dropped, not" in markdown


def test_every_judgment_failed_is_unscored_and_a_retryable_failure_is_incomplete(tmp_path: Path):
    result = compare_runs(*_policy_runs(tmp_path / "final", [2.0, 1.0], [None, None]))
    assert {c.verdict for c in result.cells} == {"unscored"} and result.exit_code == 3
    assert all(c.base is None and c.paired == 0 for c in result.cells)
    result = compare_runs(*_policy_runs(tmp_path / "retry", [2.0, 1.0], [2.0, None], category="server_error"))
    assert {c.verdict for c in result.cells} == {"incomplete"} and result.exit_code == 3
    assert all(c.candidate_to_retry == 1 and c.paired == 1 for c in result.cells)


def test_a_run_still_being_written_is_refused_naming_its_writer(tmp_path: Path):
    from harness.lock import OutputLock

    base_dir, cand_dir = _runs(tmp_path, [True] * 5, [True] * 5)
    lock = OutputLock(cand_dir / "lock", what=str(cand_dir))
    lock.acquire()
    try:
        proc = _cli(str(base_dir), str(cand_dir))
    finally:
        lock.release()
    assert proc.returncode == 2
    assert f"error: CAND_RUN {cand_dir} is being written by another harness process (pid {os.getpid()}" in proc.stderr
    assert _cli(str(base_dir), str(cand_dir)).returncode == 0  # released: the same command gates


class _Judge:
    """A loopback pairwise judge: a verdict from a hash of the request text."""

    async def __call__(self, request):
        import hashlib

        from harness.loopback import chat_completion, json_response

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        text = request.json()["messages"][-1]["content"]
        verdict = "[[A]]" if hashlib.sha256(text.encode()).digest()[0] % 3 else "[[B]]"
        return json_response(chat_completion([f"Verdict: {verdict}"]))


@pytest.mark.slow
def test_explain_names_the_cell_and_its_command_reproduces_it(tmp_path: Path, shared_data: Path):
    """`report --explain` on a real `harness run`; the printed `harness eval` makes the same cell (compare: 0)."""
    import os
    import shlex

    from harness.loopback import serve_in_thread

    row = "Qwen3-8B zero-shot"
    env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    with serve_in_thread(_Judge()) as url:
        config = tmp_path / "run.yaml"
        config.write_text(f"only_rows: ['{row}']\nrows: {{'{row}': 'pairwise-judge:model=openai:judge'}}\n"
                          f"benchmarks: [ultrafeedback]\nbackend: {{base_url: '{url}'}}\n")
        run = tmp_path / "run"
        args = ["run", "table1", "--config", str(config), "--limit", "12", "--seeds", "2", "--data-dir",
                str(shared_data), "--out", str(run)]
        done = subprocess.run([sys.executable, "-m", "harness", *args], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        explained = subprocess.run([sys.executable, "-m", "harness", "report", str(run), "--explain", row,
                                    "ultrafeedback"], env=env, capture_output=True, text=True, timeout=60)
        assert explained.returncode == 0, explained.stderr
        text = explained.stdout
        manifest = json.loads((run / "manifest.json").read_text())
        fingerprint = manifest["settings"]["data"]["ultrafeedback"]
        assert f"dataset: fingerprint {fingerprint}, 12 items" in text
        assert "under test: openai:judge  identity {" in text and "run seed 0, 2 repeats" in text
        assert "n 12 per repeat, n_failed 0" in text
        command = next(line for line in text.splitlines() if line.startswith("reproduce: "))[len("reproduce: "):]
        argv = shlex.split(command)
        assert argv[:2] == ["harness", "eval"]
        again = tmp_path / "again"
        redo = subprocess.run([sys.executable, "-m", "harness", *argv[1:], "--out", str(again), "--base-url", url],
                              env=env, capture_output=True, text=True, timeout=300)
        assert redo.returncode == 0, redo.stderr
    gate = _cli(str(run), str(again))
    assert gate.returncode == 0, gate.stderr
    cells = json.loads((again / "compare.json").read_text())["cells"]
    assert [(c["row"], c["diff"], c["n_items"], c["repeats"]) for c in cells] == [(row, 0.0, 12, 2)]
    missing = subprocess.run([sys.executable, "-m", "harness", "report", str(run), "--explain", "Nope",
                              "ultrafeedback"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"no row 'Nope'; rows: {row}" in missing.stderr


@pytest.mark.slow
def test_real_cpu_preset_runs_rerun_from_the_cache_and_gate(tmp_path: Path, shared_data: Path):
    """The CPU preset's reward-model row (SmolLM2-135M, lm-token0) on real JudgeBench pairs: a rerun into a new
    run directory is served by the call cache (counted) and passes the gate (changed settings: the tests above)."""
    import os

    env = {**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    spec = "scalar-rm:model=smollm2-135m,head=lm-token0"

    def run(out: str, evaluator: str = spec) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "eval", "--evaluator", evaluator, "--benchmark",
                               "judgebench", "--label", "Skywork-27B", "--limit", "3", "--data-dir",
                               str(shared_data), "--out", str(tmp_path / out)],
                              env=env, capture_output=True, text=True, timeout=600)

    first, second = run("base"), run("cand")
    assert first.returncode == 0, first.stderr
    assert "backend calls: 6, cache hits: 0" in first.stdout  # two responses per pair
    assert second.returncode == 0 and "backend calls: 0, cache hits: 6" in second.stdout
    gate = _cli(str(tmp_path / "base"), str(tmp_path / "cand"))
    assert gate.returncode == 0, gate.stderr
    (cell,) = json.loads((tmp_path / "cand" / "compare.json").read_text())["cells"]
    assert cell["diff"] == 0.0 and cell["n_items"] == 3
