"""A new policy benchmark, with its own metric, judge and table, added as one module plus its registration (an
installed package's entry points), runs through `harness run`, `report` and `compare` like the built-in ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.loopback import chat_completion, json_response, serve_in_thread

MODULE = '''
"""Toy: say a number bigger than the one asked for; a judge model says whether it is."""

from typing import Any

import numpy as np

from benchmarks.base import PolicyItem
from benchmarks.scoring import Metric
from harness.backends.base import GenerateRequest, Message, SamplingParams, user_chat
from harness.errors import Failure, FailureCategory
from reports.tables import Column, PolicySetup, Row, TableSpec


def _judged(r) -> bool:
    return bool(r.scores) and r.scores[0] is not None


BIGGER = Metric("bigger", "Bigger", "share of answers the judge found bigger", lambda r: r.scores[0] if _judged(r)
                else 0.0, lambda r: False, weights=lambda rs: np.array([float(_judged(r)) for r in rs]),
                failed=lambda r: not _judged(r))


class Toy:
    name, display, kind, metrics = "toy", "Toy", "policy", (BIGGER,)

    def load(self, *, data_dir=None, limit=None, seed=0):
        items = [PolicyItem(f"toy:{n}", (Message("user", f"Say a number bigger than {n}."),), {"n": n})
                 for n in range(6)]
        return items[:limit]

    def record_fields(self, item):
        return {"n": str(item.meta["n"])}, {}


class ToyJudge:
    def __init__(self, backend, *, strict: bool = True):
        self.backend, self.strict, self.requests = backend, strict, 0

    @property
    def settings(self) -> dict[str, Any]:
        return {"strict": self.strict}

    async def judge_all(self, pairs, *, seed):
        asks = [GenerateRequest(user_chat(f"Is {text!r} bigger than {item.meta['n']}? yes or no"),
                                SamplingParams(max_tokens=4)) for item, text in pairs]
        self.requests += len(asks)
        return await self.backend.generate(asks)

    def read(self, item, text, completion):
        if not completion.ok:
            return (None,), {"judgment": None}, (("judge", completion.error),)
        said = completion.texts[0].strip().lower()
        if said not in ("yes", "no"):
            return (None,), {"judgment": said}, (("judge", Failure(FailureCategory.PARSE, f"said {said!r}")),)
        return (1.0 if said == "yes" else 0.0,), {"judgment": said}, ()


TOY = Toy()
TOY_TABLE = TableSpec(
    name="toy_table", title="Toy", rows=(Row("Policy", None, {"paper": "openai:p", "cpu": "openai:p"}),),
    columns=(Column("toy", "bigger"),), paper={},
    setups={"paper": PolicySetup(judge="openai:judge"), "cpu": PolicySetup(judge="openai:judge")}, default_seeds=1,
)
'''

ENTRY_POINTS = """
[harness.benchmark]
toy = toy_bench:TOY

[harness.judge]
toy = toy_bench:ToyJudge

[harness.table]
toy_table = toy_bench:TOY_TABLE
"""


async def server(request):
    """Policies `good` say a bigger number, `bad` a smaller one; the judge checks it."""
    if request.path.endswith("/models"):
        return json_response({"object": "list", "data": []})
    body = request.json()
    text = body["messages"][-1]["content"]
    if text.startswith("Is "):
        said, n = text.split("'")[1], int(text.rsplit(" than ", 1)[1].split("?")[0])
        return json_response(chat_completion(["yes" if int(said) > n else "no"]))
    n = int(text.rsplit(" than ", 1)[1].rstrip("."))
    return json_response(chat_completion([str(n + 1 if body["model"] == "good" or n % 2 else n - 1)]))


def install(folder: Path, dist: str, modules: dict[str, str], entry_points: str) -> Path:
    """A distribution `dist` on `folder` (put on PYTHONPATH): its modules and its entry points, as pip installs
    them."""
    info = folder / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    for name, text in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return folder


def runner(tmp_path: Path, *folders: Path):
    """`harness ARGS` in a subprocess that sees the plugins installed on `folders` (and reads entry points)."""
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DISABLE_PLUGIN_AUTOLOAD"}
    env.update(PYTHONPATH=os.pathsep.join([*map(str, folders), str(Path.cwd())]),
               HARNESS_CALL_CACHE=str(tmp_path / "calls.sqlite"))

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                              timeout=600, env=env)

    return harness


def test_a_plugin_benchmark_runs_through_run_report_and_compare(tmp_path: Path):
    harness = runner(tmp_path, install(tmp_path / "plugin", "toy", {"toy_bench": MODULE}, ENTRY_POINTS))

    listed = harness("list", "benchmarks")
    assert listed.returncode == 0 and "toy " in listed.stdout and "bigger" in listed.stdout
    with serve_in_thread(server) as url:
        for name, policy in (("base", "good"), ("cand", "bad")):
            config = tmp_path / f"{name}.yaml"
            config.write_text(json.dumps({"rows": {"Policy": f"openai:{policy}"}, "backend": {"base_url": url}}))
            done = harness("run", "toy_table", "--config", str(config), "--out", str(tmp_path / name))
            assert done.returncode == 0, done.stderr
    base = json.loads((tmp_path / "base" / "results.json").read_text())["results"]["Policy"]["benchmarks"]
    cand = json.loads((tmp_path / "cand" / "results.json").read_text())["results"]["Policy"]["benchmarks"]
    assert base["toy"]["bigger"]["value"] == 1.0 and cand["toy"]["bigger"]["value"] == 0.5
    table = (tmp_path / "base" / "table.md").read_text()
    assert "| Policy | **100.0** |" in table
    assert "x10" not in table  # the notes under it are its own: none of Table 2's WildBench/WritingBench scales
    report = harness("report", str(tmp_path / "cand"))
    assert report.returncode == 0 and "| Policy | **50.0** |" in report.stdout, report.stdout + report.stderr
    gate = harness("compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(tmp_path / "gate"))
    cells = json.loads((tmp_path / "gate" / "compare.json").read_text())["cells"]
    assert [(c["benchmark"], c["metric"], c["diff"]) for c in cells] == [("toy", "bigger", -0.5)], gate.stdout


def test_a_policy_benchmark_runs_as_one_cell_without_a_table(tmp_path: Path):
    """`harness eval --policy SPEC --judge SPEC -b BENCH`: a policy benchmark registered without any table answers,
    is judged and is reported as one cell (a policy table of its own, judge in the notes); the wrong spec for the
    benchmark's kind, a judged benchmark without --judge and --judge for a checked one are one line, exit 2."""
    harness = runner(tmp_path, install(tmp_path / "plugin", "toy", {"toy_bench": MODULE},
                                       ENTRY_POINTS.split("[harness.table]")[0]))
    with serve_in_thread(server) as url:
        done = harness("eval", "--policy", "openai:good", "--judge", "openai:judge", "-b", "toy", "--base-url", url,
                       "--max-tokens", "8", "--out", str(tmp_path / "cell"))
        assert done.returncode == 0, done.stderr
        assert "| openai:good | **100.0** |" in done.stdout and "- judge: openai:judge" in done.stdout
        payload = json.loads((tmp_path / "cell" / "results.json").read_text())
        assert payload["kind"] == "policy" and payload["results"]["openai:good"]["benchmarks"]["toy"]["bigger"][
            "value"] == 1.0
        manifest = json.loads((tmp_path / "cell" / "manifest.json").read_text())
        assert manifest["generation"]["max_tokens"] == 8 and manifest["judge"]["model"] == "openai:judge"
        refused = {
            ("-e", "openai:good", "-b", "toy"): "'toy' is a policy benchmark: give --policy SPEC",
            ("--policy", "openai:good", "-b", "toy"): "'toy' is judged by a model: give --judge SPEC",
            ("--policy", "openai:good", "-b", "judgebench"): "'judgebench' is a pairwise evaluator benchmark: give "
                                                                "--evaluator SPEC; --policy: for policy benchmarks",
            ("--policy", "openai:good", "--judge", "openai:judge", "-b", "math500"): "'math500' is checked without "
                                                                                     "a model",
        }
        for args, said in refused.items():
            got = harness("eval", *args, "--base-url", url, "--out", str(tmp_path / "refused"))
            assert got.returncode == 2 and said in got.stderr and len(got.stderr.strip().splitlines()) == 1, (
                args, got.stderr)
        assert not (tmp_path / "refused").exists()


BROKEN = MODULE.replace('name, display, kind, metrics = "toy", "Toy", "policy", (BIGGER,)',
                        'name, kind, metrics = "toy", "policy", (BIGGER,)')


def test_a_broken_plugin_is_one_line_before_any_call_and_the_listing_shows_the_rest(tmp_path: Path):
    """A benchmark without `display`, a target that does not import, a built-in's name and a name two plugins
    claim: `harness list` shows each as `broken: NAME (why)` beside every working entry, and a run that names one
    stops with one line naming the plugin, its distribution and what is missing, before any model call."""
    assert "display =" not in BROKEN and "display," not in BROKEN
    first = install(tmp_path / "a", "broken-bench", {"broken_bench": BROKEN}, """
[harness.benchmark]
nodisplay = broken_bench:TOY
nomodule = no_such_module:THING
judgebench = broken_bench:TOY
twice = broken_bench:TOY
""")
    second = install(tmp_path / "b", "other-bench", {}, "[harness.benchmark]\ntwice = other_bench:THING\n")
    harness = runner(tmp_path, first, second)
    listed = harness("list", "benchmarks")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    broken = {line.split(" ", 2)[1]: line for line in lines if line.startswith("broken: ")}
    assert set(broken) == {"nodisplay", "nomodule", "judgebench", "twice"}, lines
    origin = "plugin nodisplay = broken_bench:TOY of distribution broken-bench"
    assert f"({origin}): a benchmark needs name, display, kind, metrics and load; it has no display" \
        in broken["nodisplay"]
    assert "cannot import no_such_module:THING: ModuleNotFoundError" in broken["nomodule"]
    assert "the benchmark name 'judgebench' is built in" in broken["judgebench"]
    assert "2 plugins name this benchmark" in broken["twice"] and "other-bench" in broken["twice"]
    working = [line.split()[0] for line in lines if not line.startswith("broken: ")]
    assert {"judgebench", "ultrafeedback", "aeollm"} <= set(working)  # the built-ins, judgebench included

    called: list[str] = []

    async def server(request):
        called.append(request.path)
        return json_response({"object": "list", "data": []})

    with serve_in_thread(server) as url:
        for bench, said in (("nodisplay", f"({origin}): a benchmark needs"), ("twice", "2 plugins name this"),
                            ("nomodule", "cannot import no_such_module:THING")):
            done = harness("eval", "-e", "pairwise-judge:model=openai:judge", "--base-url", url, "-b", bench,
                           "--out", str(tmp_path / bench))
            assert done.returncode == 2, done.stderr
            (line,) = done.stderr.strip().splitlines()
            assert line.startswith(f"error: benchmark {bench!r}") and said in line, line
    assert called == []
