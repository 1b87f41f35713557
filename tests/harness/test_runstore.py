import json
from pathlib import Path

import pytest

from harness.errors import ConfigError, Failure, FailureCategory
from harness.lock import OutputBusyError
from harness.records import EvalRecord, GenerationRecord, ScoreRecord
from harness.runstore import Manifest, Output, OutputPaths, RecordLog, settings_diff


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def gen(rid: str, sample: int = 0, text: str | None = "t", error: Failure | None = None) -> GenerationRecord:
    return GenerationRecord(rid, sample, "m", text if error is None else None, error)


def test_records_round_trip_and_name_their_schema():
    fail = Failure(FailureCategory.TIMEOUT, "slow", 3)
    trace = {"failures": [{"stage": "verify", "response": 1, "item": 0, "category": "parse", "message": "x",
                           "attempts": 2}]}
    records = [
        gen("a", 1),
        gen("b", 0, error=fail),
        ScoreRecord("s", "e:x", 7, (0.5, None), trace),
        EvalRecord("e:x", "judgebench", "i1", 2, 9, "pairwise", (1.0, 0.0), {"k": "v"}, preferred=0),
        EvalRecord("e:x", "nectar_lmsys", "i2", 0, 9, "listwise", (1.0, 0.5, None), gold_ranks=(2, 1, 3)),
    ]
    for record in records:
        data = json.loads(json.dumps(record.to_json()))
        assert data["schema"] == record.SCHEMA and type(record).from_json(data) == record
    assert records[1].failures == (fail,) and records[0].failures == ()
    [f] = records[2].failures
    assert f.category is FailureCategory.PARSE and f.message == "verify response 1 item 0: x"
    assert records[2].n_unscored == 1 and records[3].key == ("e:x", "judgebench", "i1", 2)
    with pytest.raises(ValueError, match="pairwise"):
        EvalRecord("e", "b", "i", 0, 0, "pairwise", (1.0, 0.0))  # no `preferred`


def test_a_line_of_another_schema_is_refused_with_file_and_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(gen("a").to_json()) + "\n" + json.dumps({"id": "b", "sample": 0}) + "\n")
    with pytest.raises(ConfigError, match=r"records.jsonl:2: not a generation/1 record .*no schema field"):
        RecordLog(path, GenerationRecord)


def test_append_and_resume(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    log = RecordLog(path, GenerationRecord, writable=True)
    log.append([gen("a", 0), gen("a", 1)])
    log.close()
    log = RecordLog(path, GenerationRecord)
    assert ("a", 0) in log and ("a", 1) in log and ("b", 0) not in log
    assert len(log) == 2 and not log.torn_line


def test_torn_last_line_is_cut_by_the_writer_and_left_alone_by_a_reader(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    good = json.dumps(gen("a").to_json()) + "\n"
    path.write_text(good + '{"schema": "generation/1", "id": "b", "sa')
    before = path.read_bytes()
    reader = RecordLog(path, GenerationRecord)
    assert reader.torn_line and [r.id for r in reader] == ["a"]
    assert path.read_bytes() == before  # a reader (harness report during a run) never touches the file
    with pytest.raises(RuntimeError, match="reading"):
        reader.append([gen("c")])
    writer = RecordLog(path, GenerationRecord, writable=True)
    assert writer.torn_line and path.read_text() == good
    writer.append([gen("b")])
    writer.close()
    assert [r["id"] for r in _lines(path)] == ["a", "b"]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(gen("a").to_json()) + "\n" + json.dumps(gen("b").to_json()))
    log = RecordLog(path, GenerationRecord, writable=True)
    assert not log.torn_line and len(log) == 2
    log.append([gen("c")])
    log.close()
    assert [r["id"] for r in _lines(path)] == ["a", "b", "c"]


def test_malformed_middle_line_names_file_and_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    line = json.dumps(gen("a").to_json())
    path.write_text(f"{line}\nnot json\n{line}\n")
    with pytest.raises(ConfigError, match=r"records.jsonl:2: malformed record line"):
        RecordLog(path, GenerationRecord)


def test_last_record_wins_and_compact(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    log = RecordLog(path, GenerationRecord, writable=True)
    failed = gen("a", error=Failure(FailureCategory.TIMEOUT, "x"))
    log.append([failed, gen("b")])
    log.append([gen("a")])
    assert log.get(("a", 0)).error is None and log.superseded == 1
    log.compact()
    assert [(x["id"], x["error"]) for x in _lines(path)] == [("a", None), ("b", None)]
    assert log.superseded == 0


def test_compaction_that_dies_before_the_rename_leaves_the_log_intact(tmp_path: Path, monkeypatch):
    import os

    path = tmp_path / "records.jsonl"
    log = RecordLog(path, GenerationRecord, writable=True)
    log.append([gen("a", error=Failure(FailureCategory.TIMEOUT, "x")), gen("a"), gen("b")])
    before = path.read_bytes()

    def killed(*args):
        raise KeyboardInterrupt  # the process dies between writing the new file and renaming it

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        log.compact()
    monkeypatch.undo()
    assert path.read_bytes() == before and path.with_name("records.jsonl.tmp").exists()
    again = RecordLog(path, GenerationRecord, writable=True)  # the next writer removes the half-written copy
    assert not path.with_name("records.jsonl.tmp").exists()
    assert sorted(again.get(k).id for k in (("a", 0), ("b", 0))) == ["a", "b"] and again.superseded == 1


def _output(out: Path, settings: dict, **kwargs) -> Output:
    return Output(OutputPaths.file(out), GenerationRecord, command="generate", settings=settings, config={},
                  **kwargs)


def test_an_output_is_bound_to_its_settings(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    with _output(out, {"model": "a", "seed": 0}) as output:
        output.log.append([gen("x")])
    before = out.read_bytes()
    with _output(out, {"model": "a", "seed": 0}) as output:  # same settings: resume
        assert output.resumed and len(output.log) == 1
    with pytest.raises(ConfigError) as info:
        with _output(out, {"model": "b", "seed": 1}):
            pass
    assert "other settings (model: a -> b; seed: 0 -> 1)" in str(info.value) and "--overwrite" in str(info.value)
    assert out.read_bytes() == before
    with _output(out, {"model": "b", "seed": 1}, overwrite=True) as output:
        assert len(output.log) == 0 and not output.resumed
    manifest = Manifest(out.with_name("out.jsonl.manifest.json")).read()
    assert manifest["settings"] == {"model": "b", "seed": 1} and len(manifest["sessions"]) == 1


def test_the_lock_names_its_holder(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    with _output(out, {}):
        with pytest.raises(OutputBusyError, match=r"out.jsonl is being written by another harness process \(pid "):
            with _output(out, {}):
                pass
    with _output(out, {}):  # released
        pass


def test_settings_diff_names_nested_settings():
    old = {"models": {"judge": {"model": "a", "base_url": "u"}}, "seed": 0}
    new = {"models": {"judge": {"model": "b", "base_url": "u"}}, "seed": 0, "limit": 5}
    assert settings_diff(old, new) == ["limit: (unset) -> 5", "models.judge.model: a -> b"]


def test_manifest_keeps_first_start_and_sessions(tmp_path: Path):
    out = tmp_path / "run"
    paths = OutputPaths.run_dir(out)
    with Output(paths, EvalRecord, command="run", settings={"a": 1}, config={"x": 1}) as output:
        output.log.append([EvalRecord("e", "b", "i", 0, 0, "pairwise", (1.0, 0.0), preferred=0)])
    first = Manifest(paths.manifest).read()
    with Output(paths, EvalRecord, command="run", settings={"a": 1}, config={"x": 2}):
        pass
    data = Manifest(paths.manifest).read()
    assert data["started"] == first["started"] and data["config"] == {"x": 2}
    assert [s["status"] for s in data["sessions"]] == ["finished", "finished"] and data["status"] == "finished"
    assert data["versions"]["python"] and "numpy" in data["versions"]
