"""The lm-eval bridge: our `hf` backend's loglikelihood equals lm-eval's own `hf` model on the same weights, and
`harness lm-eval` runs two local-data tasks (a generate_until and a multiple-choice task, YAML written here) through
smollm2-135m into a run directory with lm-eval's metrics, the second run answered by the call cache alone. A task
YAML lm-eval cannot read or build stops the verb with one error line naming the file and its problem."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the lmeval extra (lm-evaluation-harness) is not installed")
pytest.importorskip("transformers", reason="the hf extra is not installed")

PAIRS = [("The capital of France is", " Paris"), ("Question: 2+2=?\nAnswer:", " 4"), ("", "Hello world"),
         ("The sky is ", "blue."), ("Once upon a time", " there was a girl who lived near the forest.")]

ARITH = """task: harness_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: What is {{{{a}}}} plus {{{{b}}}}?\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "Question:"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  version: 1.0
"""
CHOICE = """task: harness_mmlu_pro_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{options}}}}"
doc_to_target: answer_index
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def test_hf_loglikelihood_equals_lm_evals_hf_model():
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from harness.backends import load_backend
    from harness.backends.base import BackendOptions, LoglikelihoodRequest

    backend = load_backend("smollm2-135m", BackendOptions(batch_size=3))
    ours = asyncio.run(backend.loglikelihood([LoglikelihoodRequest(c, t) for t, c in PAIRS]))
    theirs = HFLM(pretrained=backend._lm, tokenizer=backend._tok, batch_size=1).loglikelihood(
        [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)])
    assert [r.error for r in ours] == [None] * len(PAIRS)
    assert [r.logprob for r in ours] == pytest.approx([t[0] for t in theirs], abs=1e-3)
    assert [r.greedy for r in ours] == [t[1] for t in theirs]
    assert ours[0].greedy is True and ours[0].tokens == 1  # " Paris" is one token, the model's argmax


@pytest.fixture
def task_dir(tmp_path: Path, shared_data: Path) -> Path:
    """Two lm-eval tasks on local files: sums to write (generate_until), MMLU-Pro questions (multiple choice)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    arith = [{"a": a, "b": b, "answer": str(a + b)} for a, b in ((2, 2), (3, 5), (10, 7), (1, 1))]
    (tasks / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arith))
    rows = (shared_data / "mmlu_pro" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    (tasks / "mc.jsonl").write_text("".join(line + "\n" for line in rows))
    (tasks / "arith.yaml").write_text(ARITH.format(data=tasks / "arith.jsonl"))
    (tasks / "mc.yaml").write_text(CHOICE.format(data=tasks / "mc.jsonl"))
    return tasks


@pytest.mark.slow
def test_lm_eval_verb_runs_local_tasks_and_the_rerun_makes_no_model_calls(tmp_path: Path, task_dir: Path):
    tasks = task_dir
    rows = (tasks / "mc.jsonl").read_text(encoding="utf-8").splitlines()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "harness", "lm-eval", "--model", "smollm2-135m", "--tasks",
            "harness_arith,harness_mmlu_pro_mc", "--include-path", str(tasks), "--limit", "3", "--out", str(out)]

    first = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())["results"]
    assert set(results) == {"harness_arith", "harness_mmlu_pro_mc"}
    assert 0.0 <= results["harness_arith"]["exact_match,none"] <= 1.0
    assert 0.0 <= results["harness_mmlu_pro_mc"]["acc,none"] <= 1.0
    manifest = json.loads((out / "manifest.json").read_text())
    n_options = sum(len([o for o in json.loads(r)["options"]]) for r in rows[:3])
    requests = manifest["summary"]["requests"]
    assert requests == {"generate_until": 3, "loglikelihood": n_options}
    assert manifest["summary"]["calls"] == 3 + n_options and manifest["status"] == "finished"
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted((r["task"], r["doc_id"]) for r in records) == sorted(
        (t, d) for t in ("harness_arith", "harness_mmlu_pro_mc") for d in range(3))
    arith_sample = next(r["sample"] for r in records if r["task"] == "harness_arith" and r["doc_id"] == 0)
    assert arith_sample["target"] == "4" and "exact_match" in arith_sample
    assert "harness_arith" in (out / "table.md").read_text()
    assert f"backend calls: {3 + n_options}, cache hits: 0" in first.stdout

    second = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((out / "manifest.json").read_text())["summary"]
    assert again["calls"] == 0 and again["cache_hits"] == 3 + n_options
    assert json.loads((out / "results.json").read_text())["results"] == results
    assert "backend calls: 0" in second.stdout

    # The run recorded its calls: exported, they answer a replay with no model and an empty call cache.
    exported = tmp_path / "calls-export.sqlite"
    done = subprocess.run([sys.executable, "-m", "harness", "cache", "export", str(out), "--out", str(exported)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    replay = [*[a if a != str(out) else str(tmp_path / "replayed") for a in argv], "--replay", str(exported)]
    replayed = subprocess.run(replay, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "HARNESS_CALL_CACHE": str(tmp_path / "empty.sqlite")})
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert json.loads((tmp_path / "replayed" / "results.json").read_text())["results"] == results
    assert not (tmp_path / "empty.sqlite").exists()

    other = subprocess.run([a if a != "3" else "2" for a in argv], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "other settings" in other.stderr and "limit" in other.stderr


def test_simple_evaluate_takes_harness_lm_with_the_chat_template(task_dir: Path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from harness.lmeval import HarnessLM

    lm = HarnessLM("smollm2-135m")
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=["harness_arith"], limit=2, apply_chat_template=True,
                                      task_manager=TaskManager(include_path=str(task_dir), include_defaults=False))
        assert lm.calls == 2 and lm.requests["generate_until"] == 2
        [first, _] = out["samples"]["harness_arith"]
        [(context, gen_kwargs)] = first["arguments"]  # lm-eval keeps the JSON chat we gave it
        assert json.loads(context.prompt) == [{"role": "user", "content": "Question: What is 2 plus 2?\nAnswer:"}]
        assert gen_kwargs["until"] == ["\n", "Question:"]
        assert "exact_match,none" in out["results"]["harness_arith"]
    finally:
        lm.close()


class _NoLoglikelihood:
    """A backend that cannot score given text (as a chat server cannot)."""

    kind, model = "fake", "chat-only"

    async def loglikelihood(self, requests):
        from harness.backends.base import LoglikelihoodResult
        from harness.errors import Failure, FailureCategory

        return [LoglikelihoodResult(None, error=Failure(FailureCategory.UNSUPPORTED, "no prompt logprobs"))
                for _ in requests]


def test_a_failed_request_stops_with_the_task_document_and_reason():
    from lm_eval.api.instance import Instance

    from harness.lmeval import HarnessLM, LMEvalError

    lm = HarnessLM(_NoLoglikelihood())
    try:
        request = Instance("loglikelihood", {}, ("Q: 1+1?\nA:", " 2"), 0, metadata=("my_task", 7, 1))
        with pytest.raises(LMEvalError, match=r"1 of 1 loglikelihood requests failed; the first, task 'my_task' "
                                              r"document 7: unsupported: no prompt logprobs"):
            lm.loglikelihood([request])
    finally:
        lm.close()


# A task whose build fails in lm-eval: a bad value, or (in a group) a prompt function its module lacks.
POEM = """task: harness_poem
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: write_poem
doc_to_text: "Write about {{{{a}}}}."
doc_to_target: "{{{{answer}}}}"
"""
MEMBER = POEM.replace("harness_poem", "harness_member").replace("write_poem", "generate_until").replace(
    '"Write about {{{{a}}}}."', "!function prompts.missing")
BUILD_FAILURES = {
    "bad-output-type": ({"poem.yaml": POEM}, "harness_poem", "poem.yaml", [
        "lm-eval could not build task harness_poem: ValueError: Got invalid output_type 'write_poem', must be in "
        "'loglikelihood,multiple_choice,loglikelihood_rolling,generate_until'"]),
    "group-member": ({"member.yaml": MEMBER, "prompts.py": "def other(doc):\n    return ''\n",
                      "group.yaml": "group: harness_group\ntask:\n  - harness_member\n"}, "harness_group",
                     "member.yaml", ["lm-eval could not build task harness_member (in harness_group): "
                                     "AttributeError: Module", "has no function 'missing'"]),
}


def _lm_eval(tmp_path: Path, tasks: str, include: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harness", "lm-eval", "--model", "smollm2-135m", "--tasks", tasks,
            "--include-path", str(include), "--out", str(tmp_path / "run")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def _error_line(done: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a run that stopped on bad input (exit 2, no traceback)."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.parametrize("files, task, faulty, expected", BUILD_FAILURES.values(), ids=BUILD_FAILURES.keys())
def test_a_task_lm_eval_cannot_build_stops_with_its_yaml_before_any_model_call(
        tmp_path: Path, files: dict[str, str], task: str, faulty: str, expected: list[str]):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text(json.dumps({"a": "rain", "answer": "drops"}) + "\n")
    for name, text in files.items():
        (tasks / name).write_text(text.format(data=tasks / "data.jsonl") if name.endswith(".yaml") else text)

    line = _error_line(_lm_eval(tmp_path, task, tasks))
    assert line.startswith(f"error: {tasks / faulty}: "), line
    for part in expected:
        assert part in line, line
    assert not (tmp_path / "run").exists()  # stopped before the model loaded and the run directory was written


@pytest.mark.slow  # an unknown task makes lm-eval index its own ~15,000 task configs (seconds)
def test_unknown_tasks_name_each_yaml_file_lm_eval_could_not_read(tmp_path: Path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "broken.yaml").write_text("task: harness_broken\ndataset_path: json\n  test_split: [test\n")
    latin1 = "task: harness_latin1\ndoc_to_text: \"café\"\n".encode("latin-1")
    (tasks / "latin1.yaml").write_bytes(latin1)
    (tasks / "_template.yaml").write_text("output_type: generate_until\n")  # loads, so not reported

    line = _error_line(_lm_eval(tmp_path, "harness_broken,harness_latin1", tasks))
    assert line == (
        f"error: unknown lm-eval task(s) harness_broken, harness_latin1 (nor in {tasks}); lm-eval could not read "
        f"2 file(s) there: {tasks / 'broken.yaml'}: YAML error at line 3, column 13: mapping values are not "
        f"allowed in this context; {tasks / 'latin1.yaml'}: not UTF-8 at byte {latin1.index(0xE9)} (0xe9)")
