"""`openai:` against vLLM's OpenAI server in the two roles a chat endpoint cannot play, equal to `hf:` in process.

Two servers (`python -m vllm.entrypoints.openai.api_server`, float32, eager; ~40 s each to start on two CPU cores),
one per test class, so at most one runs at a time:

- the embedded SmolLM2 (the `smollm2-135m` alias's checkpoint) with `--enable-tokenizer-info-endpoint`, so an
  empty context starts from the BOS the server names: loglikelihoods through `/v1/completions` with prompt logprobs
  equal `hf:`'s to 1e-3, and an lm-eval multiple-choice task runs through `harness lm-eval --model openai:...`
  with the same per-choice loglikelihoods as `--model smollm2-135m`;
- a tiny random `LlamaForSequenceClassification` (num_labels=1) written here with SmolLM2's tokenizer, on the
  pooling runner: reward-model scores through `/classify` equal `hf:`'s raw logits to 1e-3, and `harness score`
  with `scalar-rm:model=openai:...` gives the same scores.

Each server is also the other role's "wrong server": the LM server refuses scores with a ConfigError that names
the pooling runner, and the pooling server has no completions, so loglikelihoods fail as unsupported.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_servers import serve_vllm, smollm2_checkpoint

from harness.backends import load_backend
from harness.backends.base import BackendOptions, LoglikelihoodRequest, Message, ScoreRequest, user_chat
from harness.errors import ConfigError, FailureCategory

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LM, RM = "smollm2", "tiny-rm"
TOLERANCE = 1e-3



@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return smollm2_checkpoint()


def served(url: str, name: str):
    return load_backend(f"openai:{name}", BackendOptions(base_url=url))


def both(url: str, name: str, local, method: str, requests: list) -> tuple[list, list, dict, dict]:
    """`method` on the server (through `openai:`) and on `local`; with what the server was found to do."""

    async def go():
        backend = served(url, name)
        try:
            ours = await getattr(backend, method)(requests)
            return ours, await getattr(local, method)(requests), backend.probed(), backend.capabilities()
        finally:
            await backend.close()

    return asyncio.run(go())


PAIRS = [("The capital of France is", " Paris"), ("Question: 2+2=?\nAnswer:", " 4"), ("", "Hello world"),
         ("The sky is ", "blue."), ("Once upon a time", " there was a girl who lived near the forest.")]
LOGLIKELIHOODS = [LoglikelihoodRequest(c, t) for t, c in PAIRS] + [
    LoglikelihoodRequest(" B", "The answer is", user_chat("Pick A or B.")),  # the chat template's rendering
]
CAPITALS = [
    {"question": "What is the capital of France?", "choices": ["Paris", "London", "Rome"], "answer": 0},
    {"question": "What is the capital of Italy?", "choices": ["Madrid", "Rome", "Berlin"], "answer": 1},
    {"question": "What is 2 + 2?", "choices": ["3", "5", "4"], "answer": 2},
]
TASK = """task: served_capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="class")
def lm_server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The SmolLM2 server, for one class's tests (it stops before the next class's server starts)."""
    log = tmp_path_factory.mktemp("vllm-lm") / "server.log"
    yield from serve_vllm(checkpoint, LM, log, "--max-model-len", "2048", "--enable-tokenizer-info-endpoint")


@pytest.fixture(scope="class")
def lm_hf():
    backend = load_backend("smollm2-135m", BackendOptions(dtype="float32"))
    yield backend
    asyncio.run(backend.close())


class TestLanguageModelServer:
    """The SmolLM2 server: loglikelihoods and lm-eval tasks; refuses reward-model scores."""

    def test_loglikelihoods_equal_hf(self, lm_server: str, lm_hf) -> None:
        ours, theirs, probed, lacking = both(lm_server, LM, lm_hf, "loglikelihood", LOGLIKELIHOODS)
        assert [r.error for r in ours] == [None] * len(LOGLIKELIHOODS)
        gap = max(abs(a.logprob - b.logprob) for a, b in zip(ours, theirs))
        print(f"loglikelihood max |openai - hf| = {gap:.2e} over {len(ours)} requests")
        assert gap < TOLERANCE, [(a.logprob, b.logprob) for a, b in zip(ours, theirs)]
        assert [(a.greedy, a.tokens, a.truncated) for a in ours] == [(b.greedy, b.tokens, b.truncated) for b in theirs]
        assert ours[0].greedy is True and ours[0].tokens == 1  # " Paris": one token, the model's argmax
        assert probed["prompt logprobs"] == "prompt_logprobs" and lacking == {}
        facts = probed["tokenizer endpoint"]
        assert (facts.max_model_len, facts.chat_template, facts.prefix_text) == (2048, True, "<|im_start|>")

    def test_an_lm_eval_task_runs_through_the_server_as_on_hf(self, lm_server: str, tmp_path: Path) -> None:
        """A multiple-choice task (loglikelihood requests) through `harness lm-eval --model openai:...`, plain and
        with the chat template: the same per-choice loglikelihoods and greedy flags as the in-process model's."""
        pytest.importorskip("lm_eval", reason="the lmeval extra (lm-evaluation-harness) is not installed")
        tasks = tmp_path / "tasks"
        tasks.mkdir()
        (tasks / "capitals.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CAPITALS))
        (tasks / "capitals.yaml").write_text(TASK.format(data=tasks / "capitals.jsonl"))
        for chat in ([], ["--apply-chat-template"]):
            records = {}
            for model, extra in ((f"openai:{LM}", ["--base-url", lm_server]), ("smollm2-135m", [])):
                out = tmp_path / f"{model.replace(':', '-')}{'-chat' if chat else ''}"
                proc = subprocess.run(
                    [sys.executable, "-m", "harness", "lm-eval", "--model", model, *extra, *chat, "--tasks",
                     "served_capitals", "--include-path", str(tasks), "--out", str(out)],
                    capture_output=True, text=True, timeout=600, check=False,
                )
                assert proc.returncode == 0, proc.stderr[-3000:]
                manifest = json.loads((out / "manifest.json").read_text())
                assert manifest["summary"]["requests"] == {"loglikelihood": 9}
                results = json.loads((out / "results.json").read_text())["results"]["served_capitals"]
                assert 0.0 <= results["acc,none"] <= 1.0
                records[model] = {r["doc_id"]: r["sample"] for r in map(json.loads, (out / "records.jsonl").open())}
            ours, theirs = records[f"openai:{LM}"], records["smollm2-135m"]
            assert sorted(ours) == sorted(theirs) == [0, 1, 2]
            gap = max(abs(x[0] - y[0]) for d in ours for x, y in zip(ours[d]["filtered_resps"],
                                                                      theirs[d]["filtered_resps"]))
            print(f"lm-eval{' (chat template)' if chat else ''} max |openai - hf| = {gap:.2e} over 9 choices")
            for doc in ours:  # per choice: [loglikelihood, greedy]
                a, b = ours[doc]["filtered_resps"], theirs[doc]["filtered_resps"]
                assert [x[0] for x in a] == pytest.approx([y[0] for y in b], abs=TOLERANCE), (chat, doc, a, b)
                assert [x[1] for x in a] == [y[1] for y in b] and ours[doc]["acc"] == theirs[doc]["acc"]

    def test_reward_model_scores_need_the_pooling_runner(self, lm_server: str) -> None:
        async def go():
            backend = served(lm_server, LM)
            try:
                return await backend.score([ScoreRequest((Message("user", "Hi"), Message("assistant", "Hello")))])
            finally:
                await backend.close()

        with pytest.raises(ConfigError, match=r"is not a pooling server \(classifier endpoint unsupported \(POST "
                                              r".*/classify: HTTP 404.*--runner pooling"):
            asyncio.run(go())


RM_CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Is the answer Yes or No?", "Yes."),
    ("Write a haiku about rain.", "Rain on the rooftop / " * 80),  # longer than the model's context: cut
]


@pytest.fixture(scope="module")
def rm_dir(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama sequence classifier (num_labels=1, context 256) with SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32,  # vLLM's CPU attention needs a head width of 32 or more
        max_position_embeddings=256, num_labels=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, initializer_range=0.3,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-rm") / "model"
    LlamaForSequenceClassification(config).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="class")
def rm_server(rm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny classifier on the pooling runner, for one class's tests."""
    log = tmp_path_factory.mktemp("vllm-rm") / "server.log"
    yield from serve_vllm(rm_dir, RM, log, "--runner", "pooling", "--enable-tokenizer-info-endpoint")


@pytest.fixture(scope="class")
def rm_hf(rm_dir: Path):
    backend = load_backend(f"hf:{rm_dir}", BackendOptions(dtype="float32"))
    yield backend
    asyncio.run(backend.close())


class TestRewardModelServer:
    """The tiny classifier on the pooling runner: scores; no loglikelihoods."""

    def test_scores_equal_hf(self, rm_server: str, rm_hf) -> None:
        requests = [ScoreRequest((Message("user", u), Message("assistant", a))) for u, a in RM_CHATS]
        ours, theirs, probed, lacking = both(rm_server, RM, rm_hf, "score", requests)
        assert all(r.ok for r in ours), [r.error for r in ours]
        gap = max(abs(a.score - b.score) for a, b in zip(ours, theirs))
        print(f"score max |openai - hf| = {gap:.2e} over {len(ours)} conversations")
        assert gap < TOLERANCE, [(a.score, b.score) for a, b in zip(ours, theirs)]
        assert [(a.tokens, a.kept) for a in ours] == [(b.tokens, b.kept) for b in theirs]
        assert ours[2].truncated and ours[2].kept == 256
        assert len({round(a.score, 3) for a in ours}) == 3  # a random head still tells these apart
        assert probed["classifier endpoint"] == 1 and lacking == {}

    def test_the_scalar_rm_evaluator_scores_through_the_server(self, rm_server: str, tmp_path: Path) -> None:
        sets = tmp_path / "sets.jsonl"
        sets.write_text("".join(json.dumps({"id": f"s{i}", "prompt": u, "responses": [a, "No."]}) + "\n"
                                for i, (u, a) in enumerate(RM_CHATS[:2])))
        out = tmp_path / "scores.jsonl"
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "score", "--evaluator", f"scalar-rm:model=openai:{RM}", "--input",
             str(sets), "--out", str(out), "--base-url", rm_server],
            capture_output=True, text=True, timeout=600, check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
        requests = [ScoreRequest((Message("user", u), Message("assistant", a)))
                    for u, first in RM_CHATS[:2] for a in (first, "No.")]

        async def go():
            backend = served(rm_server, RM)
            try:
                return await backend.score(requests)
            finally:
                await backend.close()

        direct = [r.score for r in asyncio.run(go())]
        assert [s for r in records for s in r["scores"]] == pytest.approx(direct, abs=1e-6)

    def test_a_pooling_server_gives_no_loglikelihoods(self, rm_server: str) -> None:
        async def go():
            backend = served(rm_server, RM)
            try:
                return await backend.loglikelihood(LOGLIKELIHOODS[:1]), backend.capabilities()
            finally:
                await backend.close()

        [result], lacking = asyncio.run(go())
        assert result.error.category is FailureCategory.UNSUPPORTED
        assert "lacks the prompt logprobs" in result.error.message and "HTTP 404" in lacking["prompt logprobs"]
