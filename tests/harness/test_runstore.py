import json
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.runstore import Manifest, RecordLog, RunDir


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_append_and_resume(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    with RecordLog(path, ("id", "repeat")) as log:
        log.append([{"id": "a", "repeat": 0, "v": 1}, {"id": "a", "repeat": 1, "v": 2}])
    log = RecordLog(path, ("id", "repeat"))
    assert ("a", 0) in log and ("a", 1) in log and ("b", 0) not in log
    assert len(log) == 2 and not log.torn_line_dropped


def test_torn_last_line_is_dropped_not_duplicated(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "a", "v": 1}\n{"id": "b", "v"')
    log = RecordLog(path, ("id",))
    assert log.torn_line_dropped
    assert [r["id"] for r in log] == ["a"]
    assert path.read_text() == '{"id": "a", "v": 1}\n'
    log.append([{"id": "b", "v": 2}])
    log.close()
    assert [r["id"] for r in _lines(path)] == ["a", "b"]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}')
    log = RecordLog(path, ("id",))
    assert not log.torn_line_dropped and len(log) == 2
    log.append([{"id": "c"}])
    log.close()
    assert [r["id"] for r in _lines(path)] == ["a", "b", "c"]


def test_malformed_middle_line_names_file_and_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "c"}\n')
    with pytest.raises(ConfigError, match=r"records.jsonl:2: malformed record line"):
        RecordLog(path, ("id",))


def test_last_record_wins_and_compact(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    log = RecordLog(path, ("id",))
    log.append([{"id": "a", "error": "x"}, {"id": "b", "error": None}])
    log.append([{"id": "a", "error": None}])
    assert log.get(("a",))["error"] is None and log.superseded == 1
    log.compact()
    assert _lines(path) == [{"id": "a", "error": None}, {"id": "b", "error": None}]
    assert log.superseded == 0


def test_manifest_keeps_first_start_and_sessions(tmp_path: Path):
    run = RunDir(tmp_path / "run", key_fields=("id",))
    first = run.manifest.start(command="demo", config={"a": 1})
    run.manifest.finish(status="interrupted")
    run.manifest.start(command="demo", config={"a": 1})
    run.manifest.finish(summary={"n": 3})
    data = Manifest(run.path / "manifest.json").read()
    assert data["started"] == first["started"]
    assert len(data["sessions"]) == 2 and data["status"] == "finished"
    assert data["config"] == {"a": 1} and data["summary"] == {"n": 3}
    assert data["versions"]["python"] and "numpy" in data["versions"]
