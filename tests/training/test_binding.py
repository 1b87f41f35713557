"""Checkpoints are bound to their settings: a rerun with the same settings trains again (`train generator|policy`)
or keeps the finished stage (`train coevolve`); other settings are refused before any model call with one line
naming every difference, and `--overwrite` discards; a directory that holds no checkpoint is never discarded."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from training import checkpoint

SETTINGS = {"kind": "generator", "lam": 1.0, "grpo": {"max_steps": 1}, "parents": {"model": {"weights": "a"}}}


def _start(path: Path, settings=SETTINGS) -> dict:
    return checkpoint.start(path, kind="generator", settings=settings, config={}, parents={})


def test_a_dir_is_new_unfinished_finished_or_other(tmp_path: Path):
    out = tmp_path / "g"
    assert checkpoint.check(out, SETTINGS).state == "new"
    out.mkdir()
    assert checkpoint.check(out, SETTINGS).state == "new"
    manifest = _start(out)
    assert checkpoint.check(out, SETTINGS).state == "unfinished"
    checkpoint.finish(out, manifest, status="finished")
    assert checkpoint.check(out, json.loads(json.dumps(SETTINGS))).state == "finished"
    other = checkpoint.check(out, {**SETTINGS, "lam": 0.5, "grpo": {"max_steps": 2}})
    assert other.state == "other" and not other.foreign
    assert other.changes == ("grpo.max_steps: 1 -> 2", "lam: 1.0 -> 0.5")


def test_unreadable_old_and_foreign_dirs_are_other(tmp_path: Path):
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / checkpoint.MANIFEST).write_text('{"format": 1, "sett')
    torn = checkpoint.check(tmp_path / "torn", SETTINGS)
    assert torn.state == "other" and "cannot be read" in torn.changes[0] and not torn.foreign
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / checkpoint.MANIFEST).write_text('{"kind": "policy", "config": {}}')
    old = checkpoint.check(tmp_path / "old", SETTINGS)
    assert old.state == "other" and "another version of the harness (manifest format none" in old.changes[0]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a checkpoint")
    foreign = checkpoint.check(tmp_path / "mine", SETTINGS)
    assert foreign.state == "other" and foreign.foreign
    with pytest.raises(ConfigError, match=r"no harness checkpoint\); choose a new or empty --output-dir"):
        checkpoint.discard(foreign)
    assert (tmp_path / "mine" / "notes.txt").is_file()
    checkpoint.discard(old)
    assert not (tmp_path / "old").exists()


def test_the_refusal_is_one_line_naming_every_difference(tmp_path: Path):
    a = checkpoint.Binding(tmp_path / "G1", "other", ("lam: 1.0 -> 0.5",))
    b = checkpoint.Binding(tmp_path / "P1", "other", tuple(f"k{i}: 0 -> 1" for i in range(8)))
    text = str(checkpoint.refusal([a, b]))
    assert "\n" not in text
    assert f"{tmp_path / 'G1'} holds a checkpoint trained with other settings (lam: 1.0 -> 0.5)" in text
    assert "k5: 0 -> 1; and 2 more)" in text and text.endswith("or pass --overwrite to discard them")


def test_the_digest_follows_the_settings():
    assert checkpoint.digest(SETTINGS) == checkpoint.digest(json.loads(json.dumps(SETTINGS)))
    assert checkpoint.digest(SETTINGS) != checkpoint.digest({**SETTINGS, "lam": 0.5})


# --- through the CLI, with tiny random models ---

TINY_GRPO = {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 16, "max_steps": 1,
             "learning_rate": 1e-3}


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "train", *args], capture_output=True, text=True,
                          timeout=600)


def _hashes(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_train_policy_refuses_a_dir_trained_with_other_settings(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    out = tmp_path / "p1"
    config = tmp_path / "p.yaml"
    config.write_text(json.dumps({
        "model": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}", "verifier": f"hf:{tiny_lm}", "output_dir": str(out),
        "gen_max_tokens": 96, "data": {"limit": 2, "policy_rules": {"max_prompt_chars": 300}}, "grpo": TINY_GRPO}))
    args = ("policy", "--config", str(config), "--data-dir", str(nectar_dir))
    first = _train(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    trained = _hashes(out)

    refused = _error(_train(*args, "--max-steps", "2"))
    assert f"{out} holds a checkpoint trained with other settings (grpo.max_steps: 1 -> 2)" in refused
    assert "--overwrite" in refused and _hashes(out) == trained

    again = _train(*args)  # the same command again: the finished checkpoint stands, untouched
    assert again.returncode == 0 and _hashes(out) == trained, again.stderr[-3000:]
    assert "policy checkpoint:" in again.stdout

    overwritten = _train(*args, "--max-steps", "2", "--overwrite")
    assert overwritten.returncode == 0, overwritten.stderr[-3000:]
    manifest = json.loads((out / "dr_manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["settings"]["grpo"]["max_steps"] == 2
    assert manifest["parents"]["generator"]["identity"]["weights"]

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    kept = _error(_train(*args, "--output-dir", str(foreign), "--overwrite"))
    assert "holds files but no dr_manifest.json" in kept and (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_coevolve_keeps_bound_stages_and_refuses_changed_ones(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    co = tmp_path / "co"
    base = {"policy": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}", "verifier": f"hf:{tiny_lm}",
            "output_dir": str(co), "rounds": 1, "gen_max_tokens": 96, "set_size": 2, "set_max_tokens": 12,
            "data": {"generator_limit": 2, "policy_limit": 2,
                     "generator_rules": {"max_prompt_chars": 300, "min_useful": 2},
                     "policy_rules": {"max_prompt_chars": 300}},
            # A generator's rollouts decode under the rubric grammar, whose smallest budget is 43 tokens.
            "generator_grpo": {**TINY_GRPO, "max_completion_length": 44}, "policy_grpo": TINY_GRPO}
    config = tmp_path / "co.yaml"

    def coevolve(*extra: str, **change) -> subprocess.CompletedProcess:
        config.write_text(json.dumps({**base, **change}))
        return _train("coevolve", "--config", str(config), "--data-dir", str(nectar_dir), *extra)

    first = coevolve()
    assert first.returncode == 0, first.stderr[-3000:]
    trained = _hashes(co)

    same = coevolve()
    assert same.returncode == 0 and same.stdout.count(" kept ") == 2, same.stderr[-3000:]
    assert {k: v for k, v in _hashes(co).items() if k != "coevolve.json"} == {
        k: v for k, v in trained.items() if k != "coevolve.json"}

    for change, shown in (({"lam": 0.5}, "lam: 1.0 -> 0.5"), ({"objective": "disc"}, "objective: both -> disc"),
                          ({"verify_mode": "logprob"}, "verify_mode: per_item -> logprob")):
        line = _error(coevolve(**change))
        assert f"{co / 'G1'} holds a checkpoint trained with other settings ({shown}" in line
        assert f"{co / 'P1'} holds a checkpoint trained with other settings (parents.generator.settings: " in line
        assert {k: v for k, v in _hashes(co).items() if k != "coevolve.json"} == {
            k: v for k, v in trained.items() if k != "coevolve.json"}

    overwritten = coevolve("--overwrite", lam=0.5)
    assert overwritten.returncode == 0 and overwritten.stdout.count(" trained ") == 2, overwritten.stderr[-3000:]
    g1 = json.loads((co / "G1" / "dr_manifest.json").read_text())
    summary = json.loads((co / "coevolve.json").read_text())
    assert g1["settings"]["lam"] == summary["config"]["lam"] == 0.5
    assert summary["stages"][0]["settings"] == checkpoint.digest(g1["settings"])

    more = coevolve("--rounds", "2", lam=0.5)  # more rounds keep the bound stages and add the new ones
    assert more.returncode == 0, more.stderr[-3000:]
    assert [line.split()[1] for line in more.stdout.splitlines() if line[:2] in ("G1", "P1", "G2", "P2")] == [
        "kept", "kept", "trained", "trained"]
