"""The `openai` backend's loglikelihoods and reward-model scores against loopback servers shaped like vLLM's.

The server here answers vLLM's endpoints in vLLM's exact response shapes (recorded from vLLM 0.32's OpenAI server):
`POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`, `POST /v1/completions` with `prompt_logprobs` or
`echo` + `logprobs`, and `POST /classify`. Its tokenizer is a toy (one token per character, `<s>` and `</s>` as
special tokens) that is also a tokenizer `harness.backends.local` can use, so the ids the backend sends are checked
against the split the `hf` backend would make (`loglikelihood_ids`, `score_ids`) with the same tokenizer. Its
"model" gives each prompt token a logprob and rank computed from the token and the one before it, so every
expected sum and greedy flag is computed here by hand. Switches turn features off to check the probes and the
failures of servers that lack them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from harness.backends.base import (
    BackendOptions,
    LoglikelihoodRequest,
    Message,
    ScoreRequest,
    user_chat,
)
from harness.backends.local import loglikelihood_ids, score_ids
from harness.backends.openai_backend import OpenAIBackend
from harness.backends.openai_served import CHAT_TEMPLATE, CLASSIFIER, PREFIX_TOKEN, PROMPT_LOGPROBS, TOKENIZER
from harness.cache import CachedBackend, CallCache
from harness.errors import ConfigError, FailureCategory
from harness.loopback import HttpRequest, HttpResponse, json_response, models_list, serve_in_thread

BOS, EOS = "<s>", "</s>"
SPECIALS = {BOS: 1, EOS: 2}
GENERATED = ord("a") + 10
"""The id of the token every completion generates (`a`)."""
ARGMAX = 13
"""The id the toy model ranks first wherever the prompt's token is not its argmax (a control character: no prompt
here holds it)."""


class ToyTokenizer:
    """One token per character (id = code point + 10), `<s>` (1) and `</s>` (2) as special tokens.

    It has what `harness.backends.local` reads of a transformers tokenizer, so the tests compute the `hf`
    backend's split with it, and the server tokenizes with it.
    """

    bos_token_id, eos_token_id = 1, 2

    def __init__(self, *, adds_bos: bool = True, chat_template: bool = True) -> None:
        self.adds_bos = adds_bos
        self.chat_template = "toy" if chat_template else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [1] if add_special_tokens and self.adds_bos else []
        i = 0
        while i < len(text):
            special = next((s for s in SPECIALS if text.startswith(s, i)), None)
            ids.append(SPECIALS[special] if special else ord(text[i]) + 10)
            i += len(special) if special else 1
        return ids

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        return "".join(names.get(i) or chr(i - 10) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        assert not tokenize
        text = BOS + "".join(f"{m['role']}: {m['content']}{EOS}" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")


def step(prev: int, token: int) -> tuple[float, int]:
    """The toy model's (logprob, rank) of `token` after `prev`: rank 1 (greedy) when their sum is a multiple of 5."""
    s = (prev + token) % 5
    return -0.25 - s, 1 + s


def expected(ids: list[int], n: int) -> tuple[float, bool]:
    """(summed logprob, greedy) of the last `n` of `ids`, by the toy model."""
    steps = [step(ids[t - 1], ids[t]) for t in range(len(ids) - n, len(ids))]
    return sum(lp for lp, _ in steps), all(rank == 1 for _, rank in steps)


def classifier_logit(ids: list[int]) -> float:
    """The toy reward model's raw logit of a sequence."""
    return sum((i % 13) * (k + 1) for k, i in enumerate(ids)) / 100 - 3.0


class VllmLike:
    """A handler answering vLLM's endpoints in vLLM's shapes; switches turn features off.

    Args:
        tokenize: Serve `/tokenize` and `/detokenize` (else 404, as a server without them).
        info: Serve `GET /tokenizer_info` (vLLM serves it with `--enable-tokenizer-info-endpoint`).
        prompt_logprobs: Honour `prompt_logprobs` (else ignore the field, as a server that does not know it).
        echo: Honour `echo` with `logprobs` (else refuse it with 400).
        completions: Serve `/v1/completions` (a pooling server does not: 404).
        labels: Serve `/classify` with a classifier of this many labels (0: not a pooling server, 404).
        max_model_len: The context the server reports.
        fail: Path -> how many of its first requests get a 503.
        padding: Bytes of junk added to every completion answer (a runaway server).
    """

    def __init__(self, tokenizer: ToyTokenizer | None = None, *, tokenize: bool = True, info: bool = True,
                 prompt_logprobs: bool = True, echo: bool = True, completions: bool = True, labels: int = 0,
                 max_model_len: int = 4096, fail: dict[str, int] | None = None, padding: int = 0) -> None:
        self.tok = tokenizer or ToyTokenizer()
        self.tokenize, self.info, self.prompt_logprobs, self.echo = tokenize, info, prompt_logprobs, echo
        self.completions, self.labels, self.max_model_len = completions, labels, max_model_len
        self.fail = dict(fail or {})
        self.padding = padding
        self.requests: list[tuple[str, Any]] = []
        """(path, parsed body or None) of every request, in arrival order."""

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p == path]

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        body = request.json() if request.body else None
        self.requests.append((request.path, body))
        if self.fail.get(request.path, 0) > 0:
            self.fail[request.path] -= 1
            return json_response({"error": {"message": "busy"}}, status=503)
        route = {
            ("GET", "/v1/models"): lambda b: json_response(models_list("toy")),
            ("POST", "/tokenize"): self._tokenize if self.tokenize else None,
            ("POST", "/detokenize"): self._detokenize if self.tokenize else None,
            ("GET", "/tokenizer_info"): self._info if self.info else None,
            ("POST", "/v1/completions"): self._complete if self.completions else None,
            ("POST", "/classify"): self._classify if self.labels else None,
        }.get((request.method, request.path))
        if route is None:
            return json_response({"detail": "Not Found"}, status=404)
        return route(body)

    def _error(self, message: str) -> HttpResponse:
        return json_response({"error": {"message": message, "type": "BadRequestError", "param": None,
                                        "code": 400}}, status=400)

    def _tokenize(self, body: dict[str, Any]) -> HttpResponse:
        if "messages" in body:
            if self.tok.chat_template is None:
                return self._error("As of transformers v4.44, default chat template is no longer allowed")
            text = self.tok.apply_chat_template(body["messages"],
                                                add_generation_prompt=body.get("add_generation_prompt", True))
            ids = self.tok.encode(text, add_special_tokens=body.get("add_special_tokens", False))
        else:
            ids = self.tok.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
        return json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                              "token_strs": None})

    def _detokenize(self, body: dict[str, Any]) -> HttpResponse:
        return json_response({"prompt": self.tok.decode(body["tokens"])})

    def _info(self, body: None) -> HttpResponse:
        return json_response({"tokenizer_class": "ToyTokenizer", "bos_token": BOS, "eos_token": EOS,
                              "pad_token": EOS, "model_max_length": self.max_model_len})

    def _complete(self, body: dict[str, Any]) -> HttpResponse:
        ids = body["prompt"]
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), body
        assert body["max_tokens"] == 1 and body["temperature"] == 0.0
        if len(ids) + 1 > self.max_model_len:
            return self._error(f"This model's maximum context length is {self.max_model_len} tokens")
        echo = bool(body.get("echo"))
        if echo and not self.echo:
            return self._error("echo is not supported")
        steps = [None] + [step(ids[t - 1], ids[t]) for t in range(1, len(ids))]
        choice: dict[str, Any] = {"index": 0, "text": "a", "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                  "prompt_token_ids": None, "routed_experts": None}
        asked = body.get("prompt_logprobs") if self.prompt_logprobs else None
        if echo and self.prompt_logprobs:
            asked = body.get("logprobs")  # vLLM answers an echo with prompt_logprobs too
        if asked is not None:
            choice["prompt_logprobs"] = [None] + [self._position(ids[t], *steps[t]) for t in range(1, len(ids))]
        if echo:
            tokens = [*ids, GENERATED]
            texts = [self.tok.decode([i]) for i in tokens]
            offsets = [sum(len(t) for t in texts[:k]) for k in range(len(texts))]
            values = [None] + [lp for lp, _ in steps[1:]] + [-1.0]
            tops = [None] + [self._top(ids[t], *steps[t]) for t in range(1, len(ids))] + [{"a": -1.0}]
            choice["text"] = "".join(texts)
            choice["logprobs"] = {"text_offset": offsets, "token_logprobs": values, "tokens": texts,
                                  "top_logprobs": tops}
        answer = {"id": "cmpl-toy", "object": "text_completion", "created": 0, "model": body["model"],
                  "choices": [choice], "service_tier": None, "system_fingerprint": "vllm-0.32.0",
                  "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1, "completion_tokens": 1,
                            "prompt_tokens_details": None, "completion_tokens_details": None},
                  "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        if self.padding:
            answer["padding"] = "x" * self.padding
        return json_response(answer)

    def _position(self, token: int, logprob: float, rank: int) -> dict[str, Any]:
        """One `prompt_logprobs` entry: the prompt token and, when it is not the argmax, the argmax."""
        entry = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": self.tok.decode([token])}}
        if rank > 1:
            entry[str(ARGMAX)] = {"logprob": -0.25, "rank": 1, "decoded_token": self.tok.decode([ARGMAX])}
        return entry

    def _top(self, token: int, logprob: float, rank: int) -> dict[str, float]:
        top = {self.tok.decode([token]): logprob}
        if rank > 1:
            top[self.tok.decode([ARGMAX])] = -0.25
        return top

    def _classify(self, body: dict[str, Any]) -> HttpResponse:
        inputs = body["input"]
        if isinstance(inputs, str):
            inputs = [self.tok.encode(inputs)]
        assert body.get("use_activation") is False, body
        data = [{"index": k, "label": "LABEL_0", "probs": [classifier_logit(ids)] * self.labels,
                 "num_classes": self.labels} for k, ids in enumerate(inputs)]
        usage = sum(len(ids) for ids in inputs)
        return json_response({"id": "classify-toy", "object": "list", "created": 0, "model": body["model"],
                              "data": data, "usage": {"prompt_tokens": usage, "total_tokens": usage,
                                                      "completion_tokens": 0, "prompt_tokens_details": None}})


def backend(url: str, **options: Any) -> OpenAIBackend:
    settings = {"base_url": url, "timeout": 5.0, "max_attempts": 3, "concurrency": 4} | options
    return OpenAIBackend("toy", BackendOptions(**settings), backoff_base_s=0.001, backoff_cap_s=0.002)


def run(b: Any, method: str, requests: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        try:
            return await getattr(b, method)(requests)
        finally:
            await b.close()

    return asyncio.run(go())


REQUESTS = [
    LoglikelihoodRequest(" Paris", "The capital of France is"),
    LoglikelihoodRequest(" B", "Answer: "),  # trailing space moves to the continuation
    LoglikelihoodRequest("Hello world", ""),  # empty context: BOS first
    LoglikelihoodRequest("", "Nothing to score"),  # empty continuation
    LoglikelihoodRequest(" yes", BOS + "Starts with BOS"),  # no second BOS
    LoglikelihoodRequest(" B", "The answer is", user_chat("Pick A or B.")),  # the chat template's rendering
    LoglikelihoodRequest("Paris", "", (Message("system", "Be brief."), Message("user", "Capital of France?"))),
]


def check_against_hf_split(results: list[Any], requests: list[LoglikelihoodRequest], tok: ToyTokenizer) -> None:
    for request, result in zip(requests, results, strict=True):
        ctx, cont = loglikelihood_ids(tok, request)
        assert result.ok, (request, result.error)
        if not cont:
            assert (result.logprob, result.greedy, result.tokens) == (0.0, True, 0)
            continue
        logprob, greedy = expected(ctx + cont, len(cont))
        assert result.logprob == pytest.approx(logprob, abs=1e-9), request
        assert (result.greedy, result.tokens, result.truncated) == (greedy, len(cont), False), request


@pytest.mark.parametrize("form", ["prompt_logprobs", "echo"])
def test_loglikelihoods_follow_the_hf_split_in_either_form(form: str) -> None:
    """The token ids sent are the `hf` backend's split by the server's tokenizer (BOS before an empty context,
    trailing space moved, chats rendered by the template); the sums and greedy flags read back are the model's;
    a server that ignores `prompt_logprobs` is read in the echo form."""
    server = VllmLike(prompt_logprobs=form == "prompt_logprobs")
    with serve_in_thread(server) as url:
        b = backend(url)
        results = run(b, "loglikelihood", REQUESTS)
    check_against_hf_split(results, REQUESTS, server.tok)
    assert {r.greedy for r in results} == {True, False}  # the data exercises both
    assert b.probed()[PROMPT_LOGPROBS] == form and b.capabilities() == {}
    facts = b.probed()[TOKENIZER]
    assert (facts.max_model_len, facts.chat_template, facts.prefix_id, facts.prefix_text) == (4096, True, 1, BOS)
    sent = server.bodies("/v1/completions")
    probes = 2 if form == "echo" else 1  # the prompt_logprobs probe answered without them, then the echo probe
    fields = {"prompt_logprobs": 1} if form == "prompt_logprobs" else {"echo": True, "logprobs": 1}
    pairs = [loglikelihood_ids(server.tok, r) for r in REQUESTS]
    want = [{"model": "toy", "prompt": ctx + cont, "max_tokens": 1, "temperature": 0.0, **fields}
            for ctx, cont in pairs if cont]
    assert sorted(map(json.dumps, sent[probes:])) == sorted(map(json.dumps, want))  # one request each
    assert server.paths().count("/tokenizer_info") == 1
    assert server.bodies("/tokenize")[0] == {"model": "toy", "prompt": "", "add_special_tokens": True}


def test_probes_run_once_and_shared_lookups_once_per_call() -> None:
    """A second call probes nothing again; the choices of one question share its context's tokenization and its
    chat's rendering (one `/tokenize` of the chat, one `/detokenize`)."""
    server = VllmLike()
    chat = user_chat("Pick one.")
    choices = [LoglikelihoodRequest(c, "Answer:", chat) for c in (" A", " B", " C", " D")]

    async def go() -> tuple[list[Any], list[Any], int]:
        b = backend(url)
        try:
            first = await b.loglikelihood(choices)
            before = len(server.requests)
            second = await b.loglikelihood(choices[:1])
            return first, second, len(server.requests) - before
        finally:
            await b.close()

    with serve_in_thread(server) as url:
        first, second, later = asyncio.run(go())
    check_against_hf_split(first, choices, server.tok)
    assert second[0].logprob == first[0].logprob
    chats = [b for b in server.bodies("/tokenize") if "messages" in b and b["messages"][0]["content"] == "Pick one."]
    assert len(chats) == 2 and server.paths().count("/detokenize") == 2  # once per call
    contexts = [b for b in server.bodies("/tokenize") if b.get("prompt", "").endswith("Answer:")]
    assert len(contexts) == 2  # the shared context, tokenized once per call
    assert later == 6  # the chat, its text, the text's check, context + continuation, context, the completion


def test_retries_and_the_call_cache(tmp_path: Path) -> None:
    """503s on the tokenizer and completions endpoints are retried like chat requests; a second run through the
    call cache sends nothing, not even a probe."""
    server = VllmLike(fail={"/v1/completions": 2, "/tokenize": 1})
    cache = CallCache(tmp_path / "calls.sqlite")
    requests = REQUESTS[:3]
    with serve_in_thread(server) as url:
        first = run(CachedBackend(backend(url), cache), "loglikelihood", requests)
        sent = len(server.requests)
        again = backend(url)
        second = run(CachedBackend(again, cache), "loglikelihood", requests)
    check_against_hf_split(first, requests, server.tok)
    assert [r.logprob for r in second] == [r.logprob for r in first] and all(r.cached for r in second)
    assert len(server.requests) == sent and again.http_requests == 0
    assert server.fail == {"/v1/completions": 0, "/tokenize": 0}


def test_a_cut_context_and_a_continuation_too_long_for_the_server() -> None:
    """The ids are cut from the left to `max_model_len` less the generated token, as the `vllm` backend cuts
    them; a continuation that leaves no room fails with the numbers."""
    server = VllmLike(max_model_len=24)
    requests = [LoglikelihoodRequest(" end", "x" * 40), LoglikelihoodRequest("y" * 30, "ctx")]
    with serve_in_thread(server) as url:
        cut, long = run(backend(url), "loglikelihood", requests)
    ctx, cont = loglikelihood_ids(server.tok, requests[0])
    ids = (ctx + cont)[-23:]
    assert server.bodies("/v1/completions")[-1]["prompt"] == ids
    assert (cut.logprob, cut.greedy) == pytest.approx(expected(ids, len(cont))) and cut.truncated
    assert long.error.category is FailureCategory.BAD_REQUEST
    assert "continuation has 30 tokens; the server's context is 24" in long.error.message


def test_an_empty_context_needs_the_bos_the_server_names() -> None:
    """Without `/tokenizer_info`, a tokenizer that adds a BOS shows it (the empty text's ids); one that adds none
    leaves it unknown: empty-context requests then fail as unsupported, saying how to start the server."""
    requests = [LoglikelihoodRequest("Hello", ""), LoglikelihoodRequest(" Paris", "The capital is")]
    shown = VllmLike(ToyTokenizer(adds_bos=True), info=False)
    hidden = VllmLike(ToyTokenizer(adds_bos=False), info=False)
    with serve_in_thread(shown) as url:
        results = run(backend(url), "loglikelihood", requests)
    check_against_hf_split(results, requests, shown.tok)
    with serve_in_thread(hidden) as url:
        b = backend(url)
        empty, other = run(b, "loglikelihood", requests)
    check_against_hf_split([other], requests[1:], hidden.tok)
    assert empty.error.category is FailureCategory.UNSUPPORTED
    assert "does not say its BOS or EOS token" in empty.error.message
    assert "--enable-tokenizer-info-endpoint" in b.capabilities()[PREFIX_TOKEN]
    assert len(hidden.bodies("/v1/completions")) == 2  # the probe and the other request; nothing for the empty one


@pytest.mark.parametrize(
    ("switches", "lacking", "says"),
    [
        ({"tokenize": False}, TOKENIZER, "POST http://127.0.0.1"),
        ({"prompt_logprobs": False, "echo": False}, PROMPT_LOGPROBS, "echo: refused, HTTP 400"),
        ({"completions": False}, PROMPT_LOGPROBS, "prompt_logprobs: refused, HTTP 404"),
    ],
)
def test_a_server_without_prompt_logprobs_fails_unsupported_without_sending(
    switches: dict[str, bool], lacking: str, says: str
) -> None:
    """What the server lacked is probed once, named in the failure of every request and in `capabilities()`, and
    no loglikelihood request is sent after the probes."""
    server = VllmLike(**switches)
    with serve_in_thread(server) as url:
        b = backend(url)
        results = run(b, "loglikelihood", REQUESTS[:2])
        probes = len(server.requests)
        again = asyncio.run(b.loglikelihood(REQUESTS[:1]))
    assert len(server.requests) == probes  # probed once: the second call sends nothing
    for result in [*results, *again]:
        assert result.error.category is FailureCategory.UNSUPPORTED and result.logprob is None
        assert f"lacks the {lacking}" in result.error.message and says in result.error.message
        assert "use hf: or vllm:" in result.error.message
    assert says in b.capabilities()[lacking]
    assert len(server.bodies("/v1/completions")) <= 2  # the probes' forms, no request of the caller's


def test_an_oversize_answer_is_cut_off() -> None:
    """A completion answer far beyond what its prompt can need is not read past the bound (`_prompt_limit`)."""
    server = VllmLike()

    async def go() -> Any:
        b = backend(url)
        try:
            await b.loglikelihood(REQUESTS[:1])  # probes with a well-behaved server
            server.padding = 4 * 1024 * 1024
            return (await b.loglikelihood(REQUESTS[:1]))[0]
        finally:
            await b.close()

    with serve_in_thread(server) as url:
        result = asyncio.run(go())
    assert result.error.category is FailureCategory.MALFORMED_RESPONSE
    assert "response body" in result.error.message and result.error.attempts == 3


CHATS = [("Is the answer Yes or No?", "Yes."), ("Hello, world!", "Hi " * 30), ("2+2?", "4")]


def score_requests(**kwargs: Any) -> list[ScoreRequest]:
    return [ScoreRequest((Message("user", u), Message("assistant", a)), **kwargs) for u, a in CHATS]


@pytest.mark.parametrize("template", [True, False])
def test_scores_are_the_classifiers_raw_logits_of_the_hf_rendering(template: bool) -> None:
    """The conversation goes to `/classify` as the ids the `hf` backend would feed its classifier (the template
    without a generation prompt, or plain turns with special tokens; cut from the left to the server's context,
    the BOS kept), with `use_activation: false`; the score is the value back, with the token counts."""
    server = VllmLike(ToyTokenizer(chat_template=template), labels=1, completions=False, max_model_len=64)
    requests = score_requests(max_length=100)
    with serve_in_thread(server) as url:
        b = backend(url)
        results = run(b, "score", requests)
    sent = [body for body in server.bodies("/classify") if not isinstance(body["input"], str)]  # not the probe
    assert len(sent) == len(requests)
    for request, result in zip(requests, results, strict=True):
        ids, tokens = score_ids(server.tok, request, 64)
        assert {"model": "toy", "input": [ids], "use_activation": False} in sent
        assert result.ok and result.score == pytest.approx(classifier_logit(ids), abs=1e-12)
        assert (result.tokens, result.kept) == (tokens, len(ids))
    assert results[1].truncated and results[1].kept == 64 and score_ids(server.tok, requests[1], 64)[0][0] == 1
    assert b.probed()[CLASSIFIER] == 1
    assert (CHAT_TEMPLATE in b.capabilities()) is not template


@pytest.mark.parametrize(("labels", "says"), [(0, "is not a pooling server"), (2, "classifier with 2 labels")])
def test_score_refusals_say_why_and_check_score_sends_nothing(labels: int, says: str) -> None:
    """`lm-token0` is refused before any request; a server that is not a pooling server, or whose classifier
    has several labels, stops the first `score` call with a ConfigError that says what to start."""
    server = VllmLike(labels=labels)
    with serve_in_thread(server) as url:
        b = backend(url)
        b.check_score("classifier")  # a pre-flight check: nothing sent
        with pytest.raises(ConfigError, match="head=lm-token0: a server returns no raw LM logits"):
            b.check_score("lm-token0")
        with pytest.raises(ConfigError, match="head=lm-token0"):
            run(b, "score", score_requests(head="lm-token0"))
        assert server.requests == []
        b = backend(url)
        with pytest.raises(ConfigError, match=says) as refused:
            run(b, "score", score_requests())
    assert server.paths() == ["/classify"]  # the probe only
    if labels == 0:
        assert "--runner pooling" in str(refused.value) and "HTTP 404" in b.capabilities()[CLASSIFIER]


def test_scores_are_retried_and_cached(tmp_path: Path) -> None:
    server = VllmLike(labels=1, fail={"/classify": 2})
    cache = CallCache(tmp_path / "calls.sqlite")
    with serve_in_thread(server) as url:
        first = run(CachedBackend(backend(url), cache), "score", score_requests())
        sent = len(server.requests)
        again = backend(url)
        second = run(CachedBackend(again, cache), "score", score_requests())
    assert all(r.ok for r in first) and [r.score for r in second] == [r.score for r in first]
    assert all(r.cached for r in second) and len(server.requests) == sent and again.http_requests == 0
    assert [(r.tokens, r.kept) for r in second] == [(r.tokens, r.kept) for r in first]


def test_the_vllm_shapes_here_are_the_recorded_ones() -> None:
    """The handler's answers carry the fields vLLM 0.32's answers carry (recorded from its server)."""
    server = VllmLike(labels=1)

    async def handle(method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        raw = json.dumps(body).encode() if body is not None else b""
        return json.loads((await server(HttpRequest(method, path, {}, raw))).body)

    tokenized = asyncio.run(handle("POST", "/tokenize", {"model": "toy", "prompt": "Hi"}))
    assert set(tokenized) == {"count", "max_model_len", "tokens", "token_strs"}
    body = {"model": "toy", "prompt": [1, 80, 90], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
    [choice] = asyncio.run(handle("POST", "/v1/completions", body))["choices"]
    assert choice["prompt_logprobs"][0] is None and set(choice["prompt_logprobs"][1]["80"]) == {
        "logprob", "rank", "decoded_token"}
    echoed = asyncio.run(handle("POST", "/v1/completions", {**body, "echo": True, "logprobs": 1}))["choices"][0]
    assert set(echoed["logprobs"]) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(echoed["logprobs"]["tokens"]) == 4 and echoed["logprobs"]["token_logprobs"][0] is None
    classified = asyncio.run(handle("POST", "/classify", {"model": "toy", "input": [[1, 2]],
                                                           "use_activation": False}))
    assert set(classified["data"][0]) == {"index", "label", "probs", "num_classes"}
