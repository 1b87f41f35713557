from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.commands.prompts import read_prompts_file


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    return path


def test_reads_prompt_instruction_and_messages(tmp_path: Path):
    path = _write(
        tmp_path,
        '{"id": 1, "prompt": "hi", "system": "be brief"}\n\n'
        '{"id": "b", "instruction": "do"}\n'
        '{"id": "c", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},'
        ' {"role": "user", "content": "v"}]}\n',
    )
    records = read_prompts_file(path)
    assert [r.id for r in records] == ["1", "b", "c"]
    assert [m.role for m in records[0].messages] == ["system", "user"]
    assert records[2].messages[-1].content == "v"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b"\n', r"p.jsonl:2: invalid JSON"),
        ('{"prompt": "a"}\n', r"p.jsonl:1: missing or non-scalar 'id'"),
        ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', r"p.jsonl:2: duplicate id '1'"),
        ('{"id": 1, "text": "a"}\n', r"expected a 'prompt', 'instruction' or 'messages' field"),
        ('{"id": 1, "messages": [{"role": "bot", "content": "x"}]}\n', r"messages\[0\] must be"),
        ('[1, 2]\n', r"expected a JSON object"),
        ("\n", r"no records in file"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path: Path, text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        read_prompts_file(_write(tmp_path, text))


def test_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="prompts file not found"):
        read_prompts_file(tmp_path / "nope.jsonl")
