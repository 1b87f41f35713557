"""Fixtures of the training tests: a data dir holding real Nectar rows where the `nectar` benchmark reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

RANKED = "ablation_baseline_no_tiebreak_rankings.jsonl"
"""The authors' 194 ranked Nectar rows (`../shared/data/nectar/PROVENANCE.md`)."""


@pytest.fixture
def nectar_dir(tmp_path: Path, shared_data: Path) -> Path:
    """A data dir whose `nectar/rlaif.jsonl` holds the ranked rows (the layout `--data-dir` reads)."""
    folder = tmp_path / "data" / "nectar"
    folder.mkdir(parents=True)
    shutil.copyfile(shared_data / "nectar" / RANKED, folder / "rlaif.jsonl")
    return folder.parent


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random causal LM (byte-level tokenizer, long context: it can write a schema-decoded rubric), built
    once per session; every role of a training job can use it."""
    pytest.importorskip("transformers")
    from tiny_models import build_tiny_lm

    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "base", context=4096, byte_level=True)
