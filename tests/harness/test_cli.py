"""The CLI as a user meets it: instant help, honest stubs, one-line errors for bad input."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def harness(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def test_help_imports_no_heavy_library():
    code = (
        "import sys\n"
        "from harness.commands.cli import main\n"
        "for argv in (['harness', '--help'], ['harness', 'generate', '--help'], ['harness', 'list', 'models']):\n"
        "    sys.argv = argv\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for verb in ("generate", "run", "eval", "score", "report", "compare", "train", "list", "cache", "bench", "doctor"):
        assert verb in proc.stdout


def test_train_without_a_config_says_what_it_needs():
    proc = harness("train", "generator")
    assert proc.returncode == 2
    assert "--config" in proc.stderr
    assert "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "prompt": "hello"}\n')
    return path


def _bad_inputs(tmp_path: Path, prompts: Path) -> dict[str, tuple[list[str], str]]:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": \n')
    out = str(tmp_path / "out.jsonl")
    return {
        "malformed prompts line": (
            ["generate", "--model", "smollm2-135m", "--prompts", str(bad), "--out", out],
            "bad.jsonl:2: invalid JSON",
        ),
        "unknown alias": (
            ["generate", "--model", "smollm3-999m", "--prompts", str(prompts), "--out", out],
            "unknown model alias 'smollm3-999m'; valid aliases: gemma3-270m, smollm2-135m",
        ),
        "missing gguf": (
            ["generate", "--model", f"hf:{tmp_path}/missing.gguf", "--prompts", str(prompts), "--out", out],
            "missing.gguf",
        ),
        "unreachable server": (
            [
                "generate",
                "--model",
                "openai:some-model",
                "--base-url",
                f"http://127.0.0.1:{_free_port()}/v1",
                "--prompts",
                str(prompts),
                "--out",
                out,
            ],
            "cannot reach OpenAI-compatible server at http://127.0.0.1:",
        ),
    }


@pytest.mark.parametrize("case", ["malformed prompts line", "unknown alias", "missing gguf", "unreachable server"])
def test_bad_input_gives_one_clear_line(case: str, tmp_path: Path, prompts: Path):
    args, message = _bad_inputs(tmp_path, prompts)[case]
    proc = harness(*args)
    assert proc.returncode != 0
    assert message in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    debug = harness("--debug", *args)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_cache_stats_and_clear(tmp_path: Path):
    proc = harness("cache", "stats")
    assert proc.returncode == 0, proc.stderr
    assert "entries: 0" in proc.stdout and "hits:    0" in proc.stdout
    proc = harness("cache", "clear", "--yes")
    assert proc.returncode == 0 and "deleted 0 entries" in proc.stdout


def test_list_models_shows_aliases():
    proc = harness("list", "models")
    assert proc.returncode == 0, proc.stderr
    for name in ("openai:NAME", "hf:NAME", "vllm:NAME", "smollm2-135m", "gemma3-270m"):
        assert name in proc.stdout


def test_doctor_reports_environment():
    proc = harness("doctor")
    for name in ("python", "torch", "cuda", "vllm", "cache dir", "model smollm2-135m"):
        assert name in proc.stdout, proc.stdout


def test_report_on_a_folder_that_is_not_a_run(tmp_path: Path):
    proc = harness("report", str(tmp_path))
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"error: {tmp_path}: not a run directory (no manifest.json)"


def test_backend_options_are_declared_once_for_every_verb_and_the_config():
    """Every verb that builds models takes every `BackendOptions` field, under one flag each, and the values given
    reach the verb as the config's `backend:` keys."""
    import dataclasses

    from typer.testing import CliRunner

    from harness.backends.base import BackendOptions
    from harness.commands import cli
    from harness.commands.options import Backend, Outputs, takes_groups

    fields = [f.name for f in dataclasses.fields(BackendOptions)]
    flags = {f.name: f.metadata["flag"] or "--" + f.name.replace("_", "-") for f in dataclasses.fields(BackendOptions)}
    for verb in ("generate", "run", "plan", "serve", "eval", "score", "lm-eval", "bench verify", "bench reward",
                 "bench structured"):
        shown = CliRunner().invoke(cli.app, [*verb.split(), "--help"], env={"COLUMNS": "400"}).output
        missing = [flag for flag in flags.values() if flag not in shown]
        assert not missing, f"harness {verb} lacks {missing}"

    seen = {}

    @takes_groups
    def verb(name: str, *, backend: Backend, outputs: Outputs) -> None:
        seen.update(name=name, backend=dict(backend), outputs=outputs)

    import typer

    app = typer.Typer()
    app.command()(verb)
    result = CliRunner().invoke(app, ["x", "--concurrency", "3", "--tensor-parallel", "2", "--enforce-eager",
                                      "--dtype", "float32", "--wait"])
    assert result.exit_code == 0, result.output
    assert seen["backend"] == {"concurrency": 3, "tensor_parallel_size": 2, "enforce_eager": True,
                               "dtype": "float32"}
    assert set(seen["backend"]) <= set(fields) and seen["outputs"] == Outputs(wait=True)
    refused = CliRunner().invoke(app, ["x", "--concurrency", "0"])
    assert refused.exit_code == 2 and "--concurrency" in refused.output


def test_no_verb_is_longer_than_40_lines():
    import ast

    from harness.commands import cli

    tree = ast.parse(Path(cli.__file__).read_text(encoding="utf-8"))
    long = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.decorator_list and n.end_lineno - n.lineno + 1 > 40}
    assert not long, f"verbs over 40 lines (move the work into a module): {long}"


def test_run_options_are_declared_once_in_the_run_config():
    """Every verb's `--limit`, `--seeds`, `--seed`, `--data-dir`, `--out`, `--parallel`, `--preset` and
    `--coevolve` is `RunConfig`'s field of that name: one flag, its docstring as the help and its minimum, whatever
    the verb's default."""
    import typer
    from typer.testing import CliRunner

    from harness.commands import cli
    from harness.commands.options import EvalRun, takes_groups
    from harness.config import RunConfig

    command = typer.main.get_command(cli.app)
    taken = {"run": 8, "plan": 8, "serve": 8, "eval": 6, "score": 2, "generate": 3, "lm-eval": 2}
    for verb, count in taken.items():
        params = command.commands[verb].params
        found = {}
        for p in params:
            name = p.name.rpartition("__")[2]
            field = RunConfig.model_fields.get(name)
            if field is None or getattr(p, "help", None) != " ".join((field.description or "-").split()):
                continue
            found[name] = p
            assert p.opts == ["--" + name.replace("_", "-")], (verb, p.opts)
        assert len(found) == count, (verb, sorted(found))
        shown = CliRunner().invoke(cli.app, [verb, "--help"], env={"COLUMNS": "400"}).output
        for name in found:
            flag = "--" + name.replace("_", "-")
            assert shown.count(f" {flag} ") == 1, (verb, flag)

    seen = {}

    @takes_groups
    def verb(name: str, *, args: EvalRun) -> None:
        seen.update(name=name, args=args)

    app = typer.Typer()
    app.command()(verb)
    result = CliRunner().invoke(app, ["x", "--limit", "3", "--data-dir", "d"])
    assert result.exit_code == 0, result.output
    assert seen["args"] == EvalRun(limit=3, data_dir=Path("d"), seeds=1, seed=0, parallel=8)
    refused = CliRunner().invoke(app, ["x", "--seeds", "0"])
    assert refused.exit_code == 2 and "--seeds" in refused.output
