"""Model-major scheduling: model sets packed into phases that fit a device budget, shared models kept resident,
and a run whose three local models do not fit together running with at most two loaded at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.schedule import DoesNotFit, phase_of, schedule

A, B, C, V = (frozenset({m}) for m in "ABCV")
COST = {"A": 1.0, "B": 1.0, "C": 1.0, "V": 1.0}


def test_unbounded_is_one_phase_and_releases_nothing():
    (phase,) = schedule([A | V, B | V, C], cost=COST, budget=None)
    assert phase.models == {"A", "B", "C", "V"} and phase.release_after == frozenset()


def test_sets_sharing_a_model_are_neighbours_and_the_shared_model_stays():
    phases = schedule([C, A | V, frozenset(), B | V], cost=COST, budget=2.0)
    assert [p.models for p in phases] == [{"A", "V"}, {"B", "V"}, {"C"}]
    assert [p.release_after for p in phases] == [{"A"}, {"B", "V"}, frozenset()]
    assert phase_of(phases, frozenset()) == 0  # a unit without local models goes with the first phase
    assert phase_of(phases, C) == 2
    packed = schedule([A | V, B | V], cost=COST, budget=3.0)  # all three fit: one phase
    assert len(packed) == 1 and packed[0].models == {"A", "B", "V"}


def test_a_set_larger_than_the_budget_alone_does_not_fit():
    with pytest.raises(DoesNotFit, match=r"A 1.0, B 1.0, V 1.0; 3.0 in all\) exceed the budget of 2.0"):
        schedule([A | B | V], cost=COST, budget=2.0)
    assert issubclass(DoesNotFit, ConfigError)


@pytest.mark.slow
def test_three_local_models_where_two_fit_run_with_two_resident_at_most(tmp_path: Path, shared_data: Path):
    """Two policies and a local judge (table2): each policy's phase holds it and the judge; the judge stays."""
    from tiny_models import build_tiny_lm

    from harness.weights import model_size, read_config

    dirs = {name: build_tiny_lm(tmp_path / name, seed=seed, context=4096)
            for seed, name in enumerate(("policy-a", "policy-b", "judge"))}
    gib = model_size(read_config(dirs["judge"])).gib
    config = tmp_path / "t.yaml"
    config.write_text(json.dumps({
        "rows": {"Native Qwen3-8B": f"hf:{dirs['policy-a']}", "Native Qwen3-32B": f"hf:{dirs['policy-b']}"},
        "only_rows": ["Native Qwen3-8B", "Native Qwen3-32B"], "benchmarks": ["alpaca_eval2"],
        "judge": f"hf:{dirs['judge']}", "generation": {"max_tokens": 8},
        "devices": {"gpus": 1, "gpu_memory": gib * 2.5, "kv_cache": 0, "usable": 1.0},
    }))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "harness", "run", "table2", "--config", str(config), "--limit", "2",
                           "--data-dir", str(shared_data), "--out", str(out)],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    phases = manifest["schedule"]["phases"]
    key = {d: f"hf:{p}" for d, p in dirs.items()}
    assert [set(p["models"]) for p in phases] == [{key["policy-a"], key["judge"]}, {key["policy-b"], key["judge"]}]
    assert phases[0]["release_after"] == [key["policy-a"]]  # the judge stays for the second row
    engines = manifest["summary"]["engines"]
    assert engines["peak_resident"] == 2
    counts = engines["models"]
    assert {k: c["loads"] for k, c in counts.items()} == {key["policy-a"]: 1, key["policy-b"]: 1, key["judge"]: 1}
    assert counts[key["policy-a"]]["releases"] == 1 and counts[key["judge"]]["releases"] == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4  # every answer of both rows is recorded, judged or counted failed
