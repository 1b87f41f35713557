"""The `openai` backend against a real OpenAI-compatible server: vLLM's own, on the embedded SmolLM2 (loopback).

The server (`python -m vllm.entrypoints.openai.api_server`, float32, eager) starts once for the module (~50 s on
two CPU cores) and serves the same converted checkpoint the `hf` backend loads, so generation, token logprobs and
logprob verification through HTTP must agree with `hf:` in float32; the judge and rubric evaluators run through
`harness score` in a subprocess, as a user runs them (the 135M model rarely writes a verdict or rubric that
parses, so those tests check that every call was answered and only parsing failed).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_servers import serve_vllm, smollm2_checkpoint

from harness.backends import load_backend
from harness.backends.base import BackendOptions, GenerateRequest, LogprobRequest, SamplingParams, user_chat

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SERVED = "smollm2"



@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return smollm2_checkpoint()


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    """vLLM's OpenAI server on loopback; yields its base URL and stops it afterwards."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    yield from serve_vllm(checkpoint, SERVED, log, "--max-logprobs", "20", "--max-model-len", "4096")


@pytest.fixture(scope="module")
def hf():
    b = load_backend("smollm2-135m", BackendOptions(dtype="float32"))
    yield b
    asyncio.run(b.close())


def _openai(url: str):
    return load_backend(f"openai:{SERVED}", BackendOptions(base_url=url))


PROMPTS = [
    "What is the capital of France?",
    "Is Paris in France? Answer Yes or No.",
    "Write a haiku about rain.",
]


def test_generation_and_token_logprobs_match_hf(server: str, hf) -> None:
    requests = [GenerateRequest(user_chat(p), SamplingParams(max_tokens=24, logprobs=3)) for p in PROMPTS]

    async def both():
        backend = _openai(server)
        try:
            return await backend.generate(requests), await hf.generate(requests)
        finally:
            await backend.close()

    ours, theirs = asyncio.run(both())
    assert "Paris" in ours[0].texts[0]
    for a, b in zip(ours, theirs):
        assert a.ok, a.error
        assert a.texts == b.texts and a.usage == b.usage
        [x], [y] = a.logprobs, b.logprobs
        assert [t.token for t in x] == [t.token for t in y]
        assert max(abs(p.logprob - q.logprob) for p, q in zip(x, y)) < 2e-4


def test_logprob_verification_matches_hf(server: str, hf) -> None:
    from harness.commands.bench_verify import load_example
    from judges.verify import verify

    prompt, responses, rubric = load_example(4, 3)

    async def both():
        backend = _openai(server)
        try:
            ours = await verify(backend, prompt, responses, rubric, mode="logprob")
            theirs = await verify(hf, prompt, responses, rubric, mode="logprob")
            asks = await backend.next_token_logprobs([LogprobRequest(user_chat(PROMPTS[1]))], ["Yes", "No"])
            return ours, theirs, asks
        finally:
            await backend.close()

    ours, theirs, [asked] = asyncio.run(both())
    cells = [(a, b) for row_a, row_b in zip(ours.verdicts, theirs.verdicts) for a, b in zip(row_a, row_b)]
    assert len(cells) == 12 and all(a is not None for a, _ in cells), ours.verdicts
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in cells), (ours.verdicts, theirs.verdicts)
    assert asked.ok and all(-20 < v < 0 for v in asked.logprobs.values())


@pytest.mark.parametrize(
    "evaluator",
    [
        f"pairwise-judge:model=openai:{SERVED},max_tokens=64",
        f"dynamic-rubric:generator=openai:{SERVED},mode=logprob,gen_max_tokens=160",
    ],
)
def test_judges_score_sets_through_the_server(server: str, evaluator: str, tmp_path: Path) -> None:
    sets = tmp_path / "sets.jsonl"
    rows = [
        {"id": "capital", "prompt": "What is the capital of France?",
         "responses": ["The capital of France is Paris.", "France's capital is Lyon."]},
        {"id": "sum", "prompt": "What is 2 + 2?", "responses": ["4", "2 + 2 = 5"]},
    ]
    sets.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "score", "--evaluator", evaluator, "--input", str(sets), "--out", str(out),
         "--base-url", server, "--api-key-env", "HARNESS_TEST_KEY"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HARNESS_TEST_KEY": "local-server-key"},
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: the 135M model's answers did not parse
    calls = int(re.search(r"backend calls: (\d+)", proc.stdout).group(1))
    assert calls >= 2, proc.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["capital", "sum"]
    for record in records:  # every call reached the server and its answer came back; only parsing may fail
        categories = {f["category"] for f in record["trace"].get("failures") or ()}
        assert categories <= {"parse"}, record["trace"]["failures"]
        assert all(s is not None for s in record["scores"]) or categories == {"parse"}


def test_structured_outputs_prefill_and_n_through_the_server(server: str) -> None:
    """vLLM's server takes every capability the openai backend probes: `response_format` `json_schema` for the
    rubric, `structured_outputs` for a choice and a regex, `continue_final_message` for the sheet's prefill,
    `n > 1` and `min_tokens`; each constrained answer keeps to its constraint."""
    from harness.backends.base import assistant_text
    from judges.dynamic import rubric_constraint
    from judges.rubric import parse_rubric
    from judges.verify import SHEET_PREFILL, VERDICT_CHOICE, parse_answer_sheet, sheet_constraint

    ask = user_chat("Write a grading rubric for answers to: what is the capital of France?")
    requests = [
        # vLLM's server lets JSON carry free whitespace (xgrammar): room beyond the schema's 256-token bounds.
        GenerateRequest(ask, SamplingParams(max_tokens=512, constraint=rubric_constraint(256))),
        GenerateRequest(user_chat("Is Paris in France?"), SamplingParams(max_tokens=8, constraint=VERDICT_CHOICE)),
        GenerateRequest(user_chat("Answer three yes/no questions about the sea."),
                        SamplingParams(max_tokens=24, constraint=sheet_constraint(3)), SHEET_PREFILL),
        GenerateRequest(user_chat("Name a colour."), SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8)),
        GenerateRequest(user_chat("What is 2+2?"), SamplingParams(max_tokens=40, min_tokens=30)),
    ]

    async def run():
        backend = _openai(server)
        try:
            return await backend.generate(requests), backend.probed(), backend.capabilities()
        finally:
            await backend.close()

    (rubric, verdict, sheet, colours, held), probed, lacking = asyncio.run(run())
    for completion in (rubric, verdict, sheet, colours, held):
        assert completion.ok, completion.error
    assert len(parse_rubric(rubric.texts[0]).items) >= 1
    assert verdict.texts[0] in ("Yes", "No")
    assert sheet.continues_prefix and len(parse_answer_sheet(assistant_text(SHEET_PREFILL, sheet), 3)) == 3
    assert len(colours.texts) == 2
    assert held.usage.completion_tokens >= 30
    assert probed == {
        "structured output (json_schema)": "json_schema",
        "structured output (choice)": "structured_outputs",
        "structured output (regex)": "structured_outputs",
        "assistant prefill": "continue_final_message",
        "n > 1": True,
        "min_tokens": True,
    }
    assert lacking == {}
