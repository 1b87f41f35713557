"""The `openai` backend: any OpenAI-compatible chat-completions server (OpenAI, DeepSeek, vLLM, SGLang,
llama.cpp).

Requests go through the official SDK with its own retries switched off (`max_retries=0`); this module retries
instead, so that every request ends as a completion or a categorised `Failure`, and concurrency adapts:

- At most `options.concurrency` requests are in flight. A 429 halves an effective limit (at most once per
  round trip) and each success raises it by 1/limit (AIMD), so a rate-limited server sees fewer requests.
- Retried, with exponential backoff and full jitter or the server's `Retry-After` (capped at 60 s): 429,
  408, 5xx, timeouts, refused/reset/dropped connections, 200 answers whose body is not JSON.
- Not retried: 401/403 (AUTH), 400/404/422 and other 4xx (BAD_REQUEST), a JSON body without a usable
  completion (MALFORMED_RESPONSE), a logprob answer without logprobs (UNSUPPORTED).
- Token logprobs of generated text (`params.logprobs = k > 0`) are asked for with `logprobs: true,
  top_logprobs: k` and read from `choices[i].logprobs.content`: `token` is the entry's text (decoded from its
  `bytes` when every entry has them, so a character split over tokens goes to the token that completes it),
  `top` its `top_logprobs` (the larger value when a text repeats). When the tokens reach past the text (a
  server that reports the token holding a stop string), tokens that start at or after the text's end are
  dropped. A server that answers without them fails the request as UNSUPPORTED.
- `options.timeout` bounds each attempt as a whole (connect, send, wait, read).
- The server's URL may carry a query (`?api_key=...`, `?api-version=...`): its parameters go with every
  request, and the URL is shown and stored only masked (`url`, `harness.redact.mask_url`).
- What servers differ in is probed, not assumed, on the first request that needs it (one-token probes, each
  once per backend, under a lock so concurrent requests wait for the answer), kept in `probed()`, and what a
  server lacks is listed by `capabilities()` (the run prints it once and records it in the manifest). Only a
  clear answer decides: a refusal (a 4xx; a 501) or an answer that shows what the server does. A probe the
  server fails (another 5xx, a timeout, a dropped connection) is retried as any request is and decides nothing:
  the request that needed it fails with that failure (a replica router moves it on, a rerun retries it) and the
  next request probes again.
  - `n > 1`: a server that answers `n: 2` with one choice (or refuses it) gets one request per sample, sample i
    seeded with `sample_seed(seed, i)` as the local backends do.
  - assistant prefill (`assistant_prefix`): sent in the first of `PREFILL_FORMS` the server continues, judged by
    the prompt tokens it reports (a continued turn counts as many as the prefix written at the end of the user
    turn; a new turn adds its end-of-turn and header tokens). A server that continues none is asked without the
    prefix (a constraint then covers the prefix too, `Constraint.after_prefix`) and the completion says
    `continues_prefix=False`, so the caller reads the answer whole instead of gluing the prefix on. A logprob
    request with a prefix fails there as UNSUPPORTED.
  - `top_logprobs`: asked with the larger of 20 and `options.top_logprobs` (5 when that is refused); later
    requests ask for at most what the server accepted, a server that lists fewer than asked is noted, and one
    without token logprobs fails logprob requests as UNSUPPORTED without sending them.
  - `min_tokens` (not in the OpenAI API; vLLM takes it): a short greedy answer, then the same with
    `min_tokens` at its budget, which a server that honours it fills; elsewhere it is not sent.
  - structured output (`params.constraint`): the first form the server accepts (`STRUCTURED_FORMS`:
    `response_format` `json_schema`, then llama.cpp's `json_object` + `schema`; for a regex or a choice vLLM's
    `structured_outputs`, then `guided_*`, then a GBNF `grammar` for llama.cpp), found with one attempt per form
    on the first constrained request of each kind: a form is taken when the server answers 2xx and the answer
    keeps to the constraint (servers that ignore unknown fields are found out by their answers), and refused
    when an HTTP error names its field (`STRUCTURED_FIELD_NAMES`) or the answer breaks the constraint; a server
    that takes none gets plain requests, and the caller's parser reads the text either way. Such an answer says
    `constrained=False`, and the call cache does not keep it under the constrained request's key.
- `http_requests` counts every HTTP request (attempts and probes), the calls as the server sees them.
- Loglikelihoods of given text (`loglikelihood`: lm-eval's multiple-choice and perplexity requests) come from
  `POST /completions` with the prompt as token ids, `max_tokens: 1` and vLLM's `prompt_logprobs: 1` (each prompt
  token's logprob and rank), else the legacy `echo: true, logprobs: 1` (lm-eval's `local-completions`), the first
  form the server answers, probed once. Token boundaries are the server's own: its tokenizer endpoint (vLLM's
  `/tokenize` at the server root; `/detokenize` reads a rendered chat back; `GET /tokenizer_info`, served with
  `--enable-tokenizer-info-endpoint`, names the BOS an empty context starts from) splits each request as the `hf`
  backend does, and the continuation's logprobs are summed, greedy when each ranks first. A server without the
  tokenizer endpoint or prompt logprobs fails these requests as UNSUPPORTED, saying what it lacked.
- Reward-model scores (`score`, head `classifier`) come from a server on vLLM's pooling runner (`--runner pooling`,
  a `*ForSequenceClassification` checkpoint): the conversation tokenized by `/tokenize` as `hf` renders it, cut as
  `hf` cuts it, and sent as token ids to `POST /classify` with `use_activation: false`, whose one value is the
  raw logit. A server without `/classify` (not a pooling server), or whose classifier has other than one label,
  stops the first `score` call with a `ConfigError`; `head=lm-token0` is refused before any call (`check_score`).
  These two roles live in `harness.backends.openai_served` (mixed in); response bodies are bounded by what the
  request asked for (`harness.backends.http_bounds`).

Requests go through the SDK's generic `client.post(path, body=..., cast_to=<httpx Response>)`, its documented
way to make raw calls, and the few fields used are parsed and checked here. The typed `create()` transforms
every parameter and parses the answer into pydantic models, which took about a third of the client's CPU per
request against a local server; CPU per request is what limits throughput there (see `harness bench api`).

The API key comes from the environment variable `options.api_key_env`, which must then be set (`preflight`,
before any call, refuses an unset one), or else from `$OPENAI_API_KEY` where set (a placeholder when not,
since local servers need none). It is scrubbed from every message this module records and never enters `identity()`.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import logging
import math
import os
import random
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from harness.backends.base import (
    BackendOptions,
    BaseBackend,
    Completion,
    Constraint,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    Message,
    TokenLogprob,
    Usage,
    chat_to_json,
    sample_seed,
)
from harness.backends.http_bounds import BODY_LIMIT, ResponseTooLarge, bounded_transport, response_limit
from harness.backends.openai_served import PROBE_QUESTION, ServedRoles, _usage
from harness.errors import BackendUnavailableError, ConfigError, Failure, FailureCategory
from harness.redact import (
    holds_secret,
    mask_url,
    redact_text,
    register_secret,
    register_url_secrets,
    scrub_tree,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
STRUCTURED_FORMS: dict[str, tuple[str, ...]] = {
    "json_schema": ("json_schema", "json_object_schema"),
    "regex": ("structured_outputs", "guided", "gbnf"),
    "choice": ("structured_outputs", "guided", "gbnf"),
}
"""How a constraint can be sent, in the order tried: OpenAI's `response_format` `json_schema`; the
`{"type": "json_object", "schema": ...}` extension (llama.cpp's servers); vLLM's `structured_outputs` field and
its older `guided_regex` / `guided_choice` fields (vLLM, SGLang); a GBNF `grammar` (llama.cpp's servers,
`harness.backends.grammar.gbnf_grammar`)."""


STRUCTURED_FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "json_schema": ("response_format", "json_schema", "json schema"),
    "json_object_schema": ("response_format", "json_object"),
    "structured_outputs": ("structured_outputs", "structured output"),
    "guided": ("guided",),
    "gbnf": ("grammar", "gbnf"),
}
"""Words by which an error names the field of a form: an HTTP error that names it refuses the form; one that
names none is the server failing (or the request being wrong), which says nothing about the form."""


def structured_fields(constraint: Constraint, form: str) -> dict[str, Any]:
    """The request-body fields that send `constraint` in `form` (see `STRUCTURED_FORMS`).

    Raises:
        ConfigError: when the constraint cannot be written in that form (a regex outside GBNF's reach).
    """
    if form == "json_schema":
        schema = {"name": constraint.name, "schema": constraint.schema, "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if form == "json_object_schema":
        return {"response_format": {"type": "json_object", "schema": constraint.schema}}
    value: Any = constraint.options if constraint.kind == "choice" else constraint.spec
    if form == "structured_outputs":
        return {"structured_outputs": {constraint.kind: value}}
    if form == "guided":
        return {f"guided_{constraint.kind}": value}
    if form == "gbnf":
        from harness.backends.grammar import gbnf_grammar

        return {"grammar": gbnf_grammar(constraint)}  # ConfigError for a regex GBNF cannot say
    raise ValueError(f"unknown structured-output form {form!r}")
PREFILL_FORMS = ("continue_final_message", "prefix_flag", "trailing_message")
"""How a prefilled assistant turn can be sent, in the order probed: a trailing assistant message with vLLM's and
SGLang's `continue_final_message: true, add_generation_prompt: false`; with DeepSeek's `prefix: true` on the
message (its beta endpoint); the trailing message alone (servers that continue it by themselves)."""


def prefill_fields(
    messages: list[dict[str, Any]], prefix: str, form: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra body fields that send `prefix` as a prefilled assistant turn in `form`."""
    turn: dict[str, Any] = {"role": "assistant", "content": prefix}
    if form == "continue_final_message":
        return [*messages, turn], {"continue_final_message": True, "add_generation_prompt": False}
    if form == "prefix_flag":
        return [*messages, {**turn, "prefix": True}], {}
    if form == "trailing_message":
        return [*messages, turn], {}
    raise ValueError(f"unknown prefill form {form!r}")


N_SAMPLES = "n > 1"
MIN_TOKENS = "min_tokens"
PREFILL = "assistant prefill"
TOP_LOGPROBS = "top_logprobs"
TOKEN_LOGPROBS = "token logprobs"
SHORT_PROBE = "What is 2+2? Reply with the number only."
"""The `min_tokens` probe's question: one most models answer in a few tokens (SmolLM2-135M: 7-8)."""
PREFILL_PROBE = ("Count to ten in words.", " one two three four five six")
"""The prefill probe's user turn and prefix (common words: one token each after a space in common tokenizers)."""
_KEY_PLACEHOLDER = "EMPTY"
_RETRY_AFTER_CAP_S = 60.0
_PROBE_TIMEOUT_S = 10.0
_SNIPPET_CHARS = 200
_CONNECTIONS_PER_CLIENT = 8
_PACER_WINDOW = 16
_PACER_MAX_INTERVAL_S = 0.01

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Fault:
    """Why one attempt failed, and whether another attempt may help."""

    category: FailureCategory
    message: str
    retryable: bool
    retry_after: float | None = None


class OpenAIBackend(ServedRoles, BaseBackend):
    """An OpenAI-compatible server behind the `Backend` protocol.

    Args:
        model: The model id the server knows (`gpt-4.1`, `Qwen/Qwen3-8B`, ...).
        options: Server URL, key variable, concurrency, timeout, attempts, top_logprobs.
        backoff_base_s: First backoff ceiling; attempt k waits uniform(0, min(cap, base * 2**(k-1))).
        backoff_cap_s: Largest backoff ceiling.
    """

    kind = "openai"

    def __init__(
        self,
        model: str,
        options: BackendOptions | None = None,
        *,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 30.0,
    ) -> None:
        import openai  # ~0.7 s to import: keep it off the CLI's start-up path

        options = options or BackendOptions()
        if options.concurrency < 1 or options.max_attempts < 1 or not options.timeout > 0:
            raise ConfigError(
                f"openai backend needs concurrency >= 1, max_attempts >= 1 and timeout > 0; got concurrency="
                f"{options.concurrency}, max_attempts={options.max_attempts}, timeout={options.timeout}"
            )
        self.model = model
        self.options = options
        given = options.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        register_url_secrets(given)
        self.base_url = normalise_base_url(given)
        """Where requests go: scheme, host, port and path (no credentials, no query)."""
        self._query = dict(parse_qsl(urlsplit(given.strip()).query, keep_blank_values=True))
        """The URL's query parameters (a key some servers take there), sent with every request."""
        self.url = mask_url(self.base_url + (f"?{urlsplit(given.strip()).query}" if self._query else ""))
        """The server's URL as it is shown and stored (identity, messages, replica counts): its query values
        masked (`harness.redact.mask_url`)."""
        self._key_env = options.api_key_env or DEFAULT_KEY_ENV
        self._key = os.environ.get(self._key_env, "")
        register_secret(self._key)
        self._found: dict[str, Any] = {}
        """Feature -> what this server was found to do: a structured-output or prefill form (None: none taken),
        whether `n > 1` works, the most `top_logprobs` it lists (0: no logprobs)."""
        self._lacks: dict[str, str] = {}
        """Feature -> what it does not do and how requests cope (`capabilities`)."""
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._probe_failures: dict[str, tuple[int, Failure]] = {}
        """Feature -> how many of its probes the server failed, and the latest failure (`_probe_once`)."""
        self.http_requests = 0
        """HTTP requests sent (every attempt, probes included): the calls as the server counts them."""
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._limit = _AdaptiveLimit(options.concurrency)
        self._pacer = _Pacer()
        self._openai = openai
        # The HTTP package the installed SDK is built on (httpx for 1.x, httpx2 for 3.x), found through an SDK
        # constant rather than imported by name.
        http = sys.modules[type(openai.DEFAULT_CONNECTION_LIMITS).__module__.partition(".")[0]]
        self._response_type = http.Response
        # Several SDK clients with small keep-alive pools instead of one with a wide pool: the HTTP pool
        # checks every connection it holds on every request, and at 32 connections pools of 8 cut 10-20% of
        # the client's CPU per request (measured). A request runs on the client its concurrency slot belongs
        # to, so no pool ever waits.
        timeout = openai.Timeout(options.timeout)
        shards = math.ceil(options.concurrency / _CONNECTIONS_PER_CLIENT)
        pool = math.ceil(options.concurrency / shards)
        limits = http.Limits(max_connections=pool, max_keepalive_connections=pool)
        self._clients = [
            openai.AsyncOpenAI(
                api_key=self._key or _KEY_PLACEHOLDER,
                base_url=self.base_url,
                default_query=self._query or None,
                max_retries=0,
                timeout=timeout,
                http_client=openai.DefaultAsyncHttpxClient(
                    transport=bounded_transport(http, limits), timeout=timeout
                ),
            )
            for _ in range(shards)
        ]

    def preflight(self) -> None:
        """Check before the first call that a key variable the user named is set (a plan needs no key).

        Raises:
            ConfigError: naming the unset variable.
        """
        if self.options.api_key_env and not self._key:
            raise ConfigError(
                f"openai:{self.model}: the API key variable ${self.options.api_key_env} is not set (named by "
                "api_key_env or --api-key-env); export it, or leave the option out for a server that needs no key"
            )

    def identity(self) -> dict[str, str]:
        """Backend kind, model id and normalised server URL (no key, no credentials, query values masked)."""
        return {"kind": self.kind, "model": self.model, "base_url": self.url}

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Complete every request (one chat completion with `n` choices each); aligned with `requests`."""
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        """Log-probabilities of each candidate as the next token, from the server's `top_logprobs`.

        A candidate matches a listed token when the token, stripped of leading whitespace, equals it (so `Yes`
        matches `Yes` and ` Yes`; the largest matching logprob wins); an unlisted candidate gets `-inf`.
        A non-empty `assistant_prefix` is sent as a trailing assistant message: only servers that continue
        such a message (rather than starting a new turn) honour it as a prefill. Each branch of a request is
        one HTTP request (the server's prefix cache, where it has one, shares their common start).
        """
        return list(await asyncio.gather(*(self._logprobs_one(r, candidates) for r in requests)))

    async def probe(self) -> None:
        """One quick `GET /models` (one attempt, at most 10 s).

        Raises:
            BackendUnavailableError: when the server cannot be reached or refuses the API key. Other answers
                (200, 404 from servers without `/models`, ...) pass.
        """
        openai = self._openai
        timeout = min(self.options.timeout, _PROBE_TIMEOUT_S)
        where = f"OpenAI-compatible server at {self.url}"
        try:
            await _deadline(self._clients[0].models.with_raw_response.list(timeout=timeout), timeout)
        except openai.APIStatusError as err:
            if err.status_code in (401, 403):
                unset = "" if self._key else f" (${self._key_env} is not set)"
                raise BackendUnavailableError(
                    f"the {where} refused the API key from ${self._key_env}{unset} "
                    f"(HTTP {err.status_code})"
                ) from None
        except (openai.APITimeoutError, TimeoutError, asyncio.TimeoutError):
            raise BackendUnavailableError(f"cannot reach {where}: no answer within {timeout:g} s") from None
        except openai.APIConnectionError as err:
            reason = self._scrub(str(err.__cause__ or err) or type(err.__cause__ or err).__name__)
            raise BackendUnavailableError(f"cannot reach {where}: {reason}") from None

    async def close(self) -> None:
        """Close the HTTP connections."""
        for client in self._clients:
            await client.close()

    # -- one request -----------------------------------------------------------------------------------------

    async def _generate_one(self, request: GenerateRequest) -> Completion:
        """One chat completion with `n` choices, or one per sample where the server does not do `n > 1`."""
        try:
            if request.params.n > 1:
                supported = await self._supports_n()
                if isinstance(supported, Failure):
                    return Completion(texts=(), error=supported)
                if not supported:
                    return await self._one_per_sample(request)
            return await self._complete(request)
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            return Completion(texts=(), error=self._failure(FailureCategory.BACKEND, repr(exc), 1))

    async def _one_per_sample(self, request: GenerateRequest) -> Completion:
        """`n` requests of one sample each, sample i seeded with `sample_seed(seed, i)`; any failure fails all."""
        p = request.params
        parts = await asyncio.gather(*(
            self._complete(dataclasses.replace(
                request, params=dataclasses.replace(p, n=1, seed=sample_seed(p.seed, i))))
            for i in range(p.n)
        ))
        for part in parts:
            if not part.ok:
                return part
        usage = Usage(sum(c.usage.prompt_tokens for c in parts), sum(c.usage.completion_tokens for c in parts))
        logprobs = tuple(c.logprobs[0] for c in parts) if p.logprobs else None  # type: ignore[index]
        return Completion(tuple(c.texts[0] for c in parts), usage, logprobs=logprobs,
                          continues_prefix=parts[0].continues_prefix,
                          constrained=all(c.constrained for c in parts))

    async def _complete(self, request: GenerateRequest) -> Completion:
        p = request.params
        messages = chat_to_json(request.messages)
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        constraint = p.constraint
        continues = True
        if request.assistant_prefix:
            form = await self._prefill_form()
            if isinstance(form, Failure):
                return Completion(texts=(), error=form)
            if form is None:  # asked for the whole turn: the prefix must be written, not glued on
                continues = False
                constraint = constraint.after_prefix(request.assistant_prefix) if constraint else None
            else:
                messages, fields = prefill_fields(messages, request.assistant_prefix, form)
                body.update(fields)
        body["messages"] = messages
        if p.n > 1:  # some servers reject `n` altogether; 1 is everyone's default
            body["n"] = p.n
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        if p.min_tokens:
            supported = await self._supports_min_tokens()
            if isinstance(supported, Failure):
                return Completion(texts=(), error=supported)
            if supported:
                body["min_tokens"] = p.min_tokens
        if p.logprobs:
            top = await self._top_logprobs(p.logprobs)
            if isinstance(top, Failure):
                return Completion(texts=(), error=top)
            body["logprobs"] = True
            body["top_logprobs"] = top
        constrained = True
        if constraint is not None:
            payload, attempts, constrained = await self._post_structured(body, constraint)
        else:
            payload, attempts = await self._post_chat(body)
        if isinstance(payload, Failure):
            return Completion(texts=(), error=payload)
        texts = _choice_texts(payload, p.n)
        if isinstance(texts, str):
            return Completion(texts=(), error=self._failure(FailureCategory.MALFORMED_RESPONSE, texts, attempts))
        logprobs = None
        if p.logprobs:
            logprobs = _choice_logprobs(payload, texts, p.logprobs)
            if isinstance(logprobs, Failure):
                return Completion(texts=(), error=self._failure(logprobs.category, logprobs.message, attempts))
        return Completion(texts=texts, usage=_usage(payload), logprobs=logprobs, continues_prefix=continues,
                          constrained=constrained)

    async def _logprobs_one(self, request: LogprobRequest, candidates: Sequence[str]) -> LogprobResult:
        """One HTTP request per context (branches in parallel); any failure fails the whole request."""
        try:
            top = await self._top_logprobs(self.options.top_logprobs)
            if isinstance(top, Failure):
                return LogprobResult(logprobs={}, error=top)
            form = None
            if request.assistant_prefix:
                form = await self._prefill_form()
                if isinstance(form, Failure):
                    return LogprobResult(logprobs={}, error=form)
                if form is None:
                    why = self._lacks.get(PREFILL, "")
                    return LogprobResult(logprobs={}, error=Failure(
                        FailureCategory.UNSUPPORTED,
                        f"{self._server_label()} does not continue an assistant turn ({why}), so the next token "
                        f"after the prefix {request.assistant_prefix!r} cannot be scored there",
                    ))
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            return LogprobResult(logprobs={}, error=self._failure(FailureCategory.BACKEND, repr(exc), 1))
        found = await asyncio.gather(*(
            self._context_logprobs(c, request.assistant_prefix, form, top, candidates) for c in request.contexts()
        ))
        scored: list[tuple[dict[str, float], int]] = []
        for item in found:
            if isinstance(item, Failure):
                return LogprobResult(logprobs={}, error=item)
            scored.append(item)
        usage = Usage(sum(n for _, n in scored), 0)
        if request.branches:
            return LogprobResult({}, branches=tuple(lp for lp, _ in scored), usage=usage)
        return LogprobResult(logprobs=scored[0][0], usage=usage)

    async def _context_logprobs(
        self, context: Sequence[Message], prefix: str, form: str | None, top: int, candidates: Sequence[str]
    ) -> tuple[dict[str, float], int] | Failure:
        messages = chat_to_json(context)
        body: dict[str, Any] = {"model": self.model, "max_tokens": 1, "temperature": 0.0, "logprobs": True,
                                "top_logprobs": top}
        if prefix and form is not None:
            messages, fields = prefill_fields(messages, prefix, form)
            body.update(fields)
        body["messages"] = messages
        try:
            payload, attempts = await self._post_chat(body)
            if isinstance(payload, Failure):
                return payload
            alternatives = _first_token_alternatives(payload)
            if isinstance(alternatives, Failure):
                return self._failure(alternatives.category, alternatives.message, attempts)
            return match_candidates(alternatives, candidates), _usage(payload).prompt_tokens
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            return self._failure(FailureCategory.BACKEND, repr(exc), 1)

    # -- capabilities, found on first use ---------------------------------------------------------------------

    def capabilities(self) -> dict[str, str]:
        """What this server was found not to do so far, each with how requests cope (probed on first use)."""
        return dict(self._lacks)

    def probed(self) -> dict[str, Any]:
        """Everything found so far: feature -> what the server does (a form, a number, True/False; None: not)."""
        return dict(self._found)

    def _lock(self, feature: str) -> asyncio.Lock:
        """The lock under which the first request that needs `feature` finds it out (per event loop)."""
        return self._locks.setdefault((id(asyncio.get_running_loop()), feature), asyncio.Lock())

    async def _probe_once(self, feature: str, probe: Callable[[], Awaitable[Any]]) -> Any:
        """What the server does about `feature` (`_found`), found by `probe()` on the first request that needs
        it, under a lock: the requests that wait meanwhile read its finding. A probe the server failed (it
        returns that Failure) records nothing, and the requests that waited for it get the same failure
        instead of each probing again in turn (a server that hangs would cost each one a timeout, one after
        another); the next request probes again."""
        if feature in self._found:
            return self._found[feature]
        seen = self._probe_failures.get(feature, (0, None))[0]
        async with self._lock(feature):
            if feature in self._found:
                return self._found[feature]
            failed = self._failed_meanwhile(feature, seen)
            if failed is not None:
                return failed
            found = await probe()
            if isinstance(found, Failure):
                self._probe_failed(feature, found)
            else:
                self._found[feature] = found
            return found

    def _failed_meanwhile(self, feature: str, seen: int) -> Failure | None:
        """The failure of a probe of `feature` that ended after `seen` of them had failed, if one did."""
        count, failure = self._probe_failures.get(feature, (0, None))
        return failure if count > seen else None

    def _probe_failed(self, feature: str, failure: Failure) -> None:
        self._probe_failures[feature] = (self._probe_failures.get(feature, (0, None))[0] + 1, failure)

    def _lacking(self, feature: str, reason: str) -> None:
        self._lacks[feature] = reason
        log.debug("%s: %s %s", self._server_label(), feature, reason)

    async def _probe_post(
        self, body: dict[str, Any] | None, *, path: str = "/chat/completions", limit: int | None = None,
        names: tuple[str, ...] = (),
    ) -> tuple[dict[str, Any] | Failure, bool]:
        """A probing request: (the answer or why not, whether the server refused what is probed).

        Only a clear answer decides: a 4xx (400, 404, 422, ...), a 501, or a 5xx whose message names the probed
        field (one of `names`: servers that fail validation with a 500) is a refusal, at once. Any other 5xx, a
        timeout, a dropped connection or a malformed body is the server failing, not refusing: the request is
        retried as any request is, and after the retries a refusal is still one while anything else comes back
        unrefused, for the caller to decide nothing on. `path`, `limit`: as for `_post`."""
        outcome = await self._attempt(body, path=path, limit=limit)
        if not isinstance(outcome, _Fault):
            return outcome, False
        if _refusal(outcome, names):
            return self._failure(outcome.category, outcome.message, 1), True
        payload, _ = await self._post(path, body, limit=limit, first=outcome)
        return payload, isinstance(payload, Failure) and _refusal(payload, names)

    async def _supports_n(self) -> bool | Failure:
        """Whether the server returns `n` choices for `n: 2` (probed once: one token each, two choices asked),
        or the failure of a server that is failing rather than answering (`_probe_once`)."""
        return await self._probe_once(N_SAMPLES, self._probe_n)

    async def _probe_n(self) -> bool | Failure:
        body = {"model": self.model, "messages": [{"role": "user", "content": PROBE_QUESTION}],
                "max_tokens": 1, "temperature": 1.0, "n": 2}
        payload, refused = await self._probe_post(body)
        if isinstance(payload, Failure) and not refused:
            return payload
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if isinstance(choices, list) and len(choices) >= 2:
            return True
        how = (f"refused n=2: {payload.message}" if isinstance(payload, Failure)
               else f"answered n=2 with {len(choices) if isinstance(choices, list) else 0} choice(s)")
        self._lacking(N_SAMPLES, f"unsupported ({how}): one request per sample, each with its derived seed")
        return False

    async def _supports_min_tokens(self) -> bool | Failure:
        """Whether the server holds back the end of an answer for `min_tokens` (vLLM's extension field), probed
        once: a short greedy answer, then the same with `min_tokens` equal to its budget, which must fill it.
        A server failing meanwhile decides nothing: its failure comes back (`_probe_once`)."""
        return await self._probe_once(MIN_TOKENS, self._probe_min_tokens)

    async def _probe_min_tokens(self) -> bool | Failure:
        budget = 24
        base = {"model": self.model, "messages": [{"role": "user", "content": SHORT_PROBE}],
                "max_tokens": budget, "temperature": 0.0}
        free, _ = await self._post_chat(base)
        if isinstance(free, Failure):
            return free
        natural = _usage(free).completion_tokens
        if not 0 < natural < budget:
            self._lacking(MIN_TOKENS, f"unknown (the free answer took {natural} of {budget} tokens): not sent, so "
                                      "an answer may end early")
            return False
        held, refused = await self._probe_post({**base, "min_tokens": budget}, names=("min_tokens",))
        if isinstance(held, Failure) and not refused:
            return held
        if isinstance(held, dict) and _usage(held).completion_tokens == budget:
            return True
        how = (f"refused: {held.message}" if isinstance(held, Failure)
               else f"ignored: the answer ended after {_usage(held).completion_tokens} tokens")
        self._lacking(MIN_TOKENS, f"unsupported ({how}): not sent, so an answer may end early (a short answer "
                                  "sheet is re-asked)")
        return False

    async def _top_logprobs(self, asked: int) -> int | Failure:
        """How many alternatives to ask for (`asked`, or fewer where the server refuses as many), or the
        failure of a server without token logprobs (probed once with the larger of 20 and
        `options.top_logprobs`, then 5 if that is refused), or of a server that is failing meanwhile
        (`_probe_once`)."""
        asked_first = max(20, self.options.top_logprobs)
        cap = await self._probe_once(TOP_LOGPROBS, lambda: self._probe_top_logprobs(asked_first))
        if isinstance(cap, Failure):
            return cap
        if cap == 0:
            return Failure(FailureCategory.UNSUPPORTED,
                           f"{self._server_label()} returns no token logprobs ({self._lacks.get(TOKEN_LOGPROBS)})")
        return min(asked, cap)

    async def _probe_top_logprobs(self, k: int) -> int | Failure:
        refusals = []
        for ask in dict.fromkeys((k, 5)):
            body = {"model": self.model, "messages": [{"role": "user", "content": PROBE_QUESTION}],
                    "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": ask}
            payload, refused = await self._probe_post(body, names=("logprobs",))
            if refused:
                refusals.append(f"top_logprobs={ask}: {payload.message}")  # type: ignore[union-attr]
                continue
            if isinstance(payload, Failure):
                return payload  # failing, not refusing: nothing is decided
            alternatives = _first_token_alternatives(payload)
            if isinstance(alternatives, Failure) and alternatives.category is not FailureCategory.UNSUPPORTED:
                return ask  # a malformed answer says nothing about support: the requests will say what happens
            if isinstance(alternatives, Failure):
                self._lacking(TOKEN_LOGPROBS, f"unsupported ({alternatives.message}): logprob requests fail as "
                                              "unsupported without being sent")
                return 0
            listed = len(alternatives) - 1  # the chosen token is appended to its alternatives
            if refusals or listed < min(ask, self.options.top_logprobs):
                got = "; ".join(refusals + [f"asked {ask}, listed {listed}"])
                self._lacking(TOP_LOGPROBS, f"fewer alternatives than asked ({got}): candidates ranked lower "
                                            "count as unlisted")
            return ask
        self._lacking(TOKEN_LOGPROBS, f"unsupported ({'; '.join(refusals)}): logprob requests fail as "
                                      "unsupported without being sent")
        return 0

    async def _prefill_form(self) -> str | None | Failure:
        """The form in which this server continues a prefilled assistant turn (`PREFILL_FORMS`), or None; or the
        failure of a server that is failing meanwhile (nothing decided, `_probe_once`).

        Probed once, with one-token requests: a reference with the probe's prefix written at the end of the user
        turn, then the prefix as a prefilled assistant turn in each form until one is continued. A server that
        continues the turn counts the same prompt tokens as the reference (give or take one where the prefix
        is tokenised at a boundary); one that closes the turn and opens a new one counts its end-of-turn and
        turn-header tokens on top.
        """
        return await self._probe_once(PREFILL, self._probe_prefill)

    async def _probe_prefill(self) -> str | None | Failure:
        question, prefix = PREFILL_PROBE
        base = {"model": self.model, "max_tokens": 1, "temperature": 0.0}
        messages = [{"role": "user", "content": question}]
        reference, _ = await self._post_chat({**base, "messages": [{"role": "user", "content": question + prefix}]})
        if isinstance(reference, Failure):
            return reference
        expected = _usage(reference).prompt_tokens
        if not expected:
            self._lacking(PREFILL, "unknown (the answer has no usage.prompt_tokens): requests go without the "
                                   "prefill and the answer is read whole")
            return None
        seen = []
        for form in PREFILL_FORMS:
            sent, fields = prefill_fields(messages, prefix, form)
            payload, refused = await self._probe_post({**base, **fields, "messages": sent},
                                                      names=("continue_final_message", "prefix", "assistant"))
            if isinstance(payload, Failure) and not refused:
                return payload
            if isinstance(payload, Failure):
                seen.append(f"{form}: refused, {payload.message}")
                continue
            extra = _usage(payload).prompt_tokens - expected
            if abs(extra) <= 1:
                return form
            seen.append(f"{form}: a new turn ({extra:+d} prompt tokens)")
        self._lacking(PREFILL, f"unsupported ({'; '.join(seen)}): requests go without the prefill and the "
                               "answer is read whole")
        return None

    async def _post_structured(
        self, body: dict[str, Any], constraint: Constraint
    ) -> tuple[dict[str, Any] | Failure, int, bool]:
        """POST a constrained request in the first form this server accepts (see `STRUCTURED_FORMS`): the JSON
        answer (or a Failure), the attempts it took, and whether it went under the constraint.

        Until a form is known for the constraint's kind, the request itself probes them, in order
        (`_probe_structured`). When the server takes none, the kind is marked unsupported (`capabilities`) and
        the request goes out plain (the caller's parser reads the text), said by the third value being False:
        such an answer is not the constrained request's (the call cache keeps it under no key).
        """
        feature = f"structured output ({constraint.kind})"
        if feature not in self._found:
            seen = self._probe_failures.get(feature, (0, None))[0]
            async with self._lock(feature):
                if feature not in self._found:
                    failed = self._failed_meanwhile(feature, seen)  # as `_probe_once`: no probes in turn
                    if failed is not None:
                        return failed, 0, True
                    answered = await self._probe_structured(body, constraint, feature)
                    if answered is not None:
                        if isinstance(answered[0], Failure):
                            self._probe_failed(feature, answered[0])
                        return (*answered, True)
        form = self._found[feature]
        try:
            fields = {} if form is None else structured_fields(constraint, form)
        except ConfigError as exc:  # this constraint cannot go in the server's form: plain, the parser reads it
            log.debug("%s: %s", self._server_label(), exc)
            fields = {}
        payload, attempts = await self._post_chat({**body, **fields})
        return payload, attempts, bool(fields)

    async def _probe_structured(
        self, body: dict[str, Any], constraint: Constraint, feature: str
    ) -> tuple[dict[str, Any] | Failure, int] | None:
        """Send `body` under `constraint` in each form in turn until the server takes one: its answer (or its
        failure) and the attempts it took; None when every form was refused (then recorded as unsupported).

        Only a clear refusal moves on to the next form: an HTTP error whose message names the form's field
        (`STRUCTURED_FIELD_NAMES`; a 4xx, or llama-cpp-python's 500 for a `response_format` type it lacks), or a
        2xx answer that breaks the constraint (a server that ignores fields it does not know). A 2xx answer
        that keeps to it makes the form this backend's; one cut at max_tokens is returned without concluding
        (the next constrained request probes again). Anything else (a 5xx or 4xx that names no field, a
        timeout, a dropped connection, a malformed body) is retried as any request is and decides nothing:
        the request comes back with its answer or its failure.
        """
        refusals = []
        for form in STRUCTURED_FORMS[constraint.kind]:
            try:
                sent = {**body, **structured_fields(constraint, form)}
            except ConfigError as exc:
                refusals.append(f"{form}: {exc}")
                continue
            outcome: dict[str, Any] | _Fault | Failure = await self._attempt(sent)
            attempts = 1
            if isinstance(outcome, _Fault) and not _refuses_form(outcome, form):
                outcome, attempts = await self._post("/chat/completions", sent, first=outcome)
            if isinstance(outcome, (_Fault, Failure)):
                if _refuses_form(outcome, form):
                    refusals.append(f"{form}: {self._scrub(outcome.message)}")
                    continue
                return outcome, attempts  # a Failure: a fault that refuses nothing went through `_post`
            kept, why = _kept_constraint(outcome, constraint)
            if kept:
                self._found[feature] = form
            if kept is not False:  # kept, or cannot tell yet (the next request probes again)
                return outcome, attempts
            refusals.append(f"{form}: accepted but not honoured ({why})")
        self._found[feature] = None
        self._lacking(feature, f"unsupported ({'; '.join(refusals)}): plain requests, the parser reads them")
        return None

    def _server_label(self) -> str:
        return f"the server at {self.url} (model {self.model!r})"

    async def _post_chat(self, body: dict[str, Any]) -> tuple[dict[str, Any] | Failure, int]:
        """POST a chat completion with retries: the JSON body (or a Failure) and the attempts it took."""
        return await self._post("/chat/completions", body)

    async def _post(
        self, path: str, body: dict[str, Any] | None, *, limit: int | None = None, first: _Fault | None = None
    ) -> tuple[dict[str, Any] | Failure, int]:
        """POST `body` to `path` (GET when `body` is None) with retries: the JSON answer (or a Failure) and the
        attempts it took. `path` is relative to the base URL, or absolute (`_root_url`: endpoints outside `/v1`);
        `limit`: the most bytes the answer may take (default: `response_limit(body)`); `first`: the fault of an
        attempt already made (a probe's), which counts as the first of `options.max_attempts`."""
        fault = first
        attempt = 1 if first is not None else 0
        while attempt < self.options.max_attempts and (fault is None or fault.retryable):
            attempt += 1
            if fault is not None:
                await asyncio.sleep(self._backoff(attempt - 1, fault.retry_after))
            outcome = await self._attempt(body, path=path, limit=limit)
            if not isinstance(outcome, _Fault):
                return outcome, attempt
            fault = outcome
        assert fault is not None
        return self._failure(fault.category, fault.message, attempt), attempt

    async def _attempt(
        self, body: dict[str, Any] | None, *, path: str = "/chat/completions", limit: int | None = None
    ) -> dict[str, Any] | _Fault:
        openai = self._openai
        slot = await self._limit.acquire()
        client = self._clients[slot % len(self._clients)]
        started = time.monotonic()
        self.http_requests += 1
        limit = BODY_LIMIT.set(response_limit(body or {}) if limit is None else limit)
        try:
            await self._pacer.wait()
            call = (client.get(path, cast_to=self._response_type) if body is None
                    else client.post(path, body=body, cast_to=self._response_type))
            response = await _deadline(call, self.options.timeout)
            content = response.content
        except ResponseTooLarge as err:
            return _Fault(FailureCategory.MALFORMED_RESPONSE, str(err), True)
        except openai.APIStatusError as err:
            fault = _status_fault(err.status_code, err.response)
            if err.status_code == 429:
                self._limit.on_rate_limit(started)
            return fault
        except (openai.APITimeoutError, TimeoutError, asyncio.TimeoutError):
            return _Fault(FailureCategory.TIMEOUT, f"no answer within {self.options.timeout:g} s", True)
        except openai.APIConnectionError as err:
            cause = err.__cause__ or err
            if isinstance(cause, ResponseTooLarge):  # SDKs that wrap every transport error
                return _Fault(FailureCategory.MALFORMED_RESPONSE, str(cause), True)
            return _Fault(
                FailureCategory.CONNECTION, f"connection failed: {str(cause) or type(cause).__name__}", True
            )
        finally:
            BODY_LIMIT.reset(limit)
            self._limit.release(slot)
            self._pacer.finished()
        self._limit.on_success()
        try:
            payload = json.loads(content)
            if holds_secret(content):  # a server that echoes the key: mask it before anyone reads the answer
                payload = scrub_tree(payload)
        except ValueError:
            snippet = content[:_SNIPPET_CHARS].decode("utf-8", "replace")
            return _Fault(FailureCategory.MALFORMED_RESPONSE, f"response body is not JSON: {snippet!r}", True)
        if not isinstance(payload, dict):
            return _Fault(FailureCategory.MALFORMED_RESPONSE, "response body is not a JSON object", False)
        return payload

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry` (1-based): the server's wish, else full jitter."""
        if retry_after is not None:
            return retry_after
        return random.uniform(0.0, min(self._backoff_cap_s, self._backoff_base_s * 2 ** (retry - 1)))

    def _failure(self, category: FailureCategory, message: str, attempts: int) -> Failure:
        return Failure(category, self._scrub(message), attempts)

    def _scrub(self, text: str) -> str:
        """`text` on one line without the API key (servers sometimes echo it in error bodies) and with every URL
        in it masked (`harness.redact.redact_text`)."""
        text = " ".join(text.split())
        return redact_text(text.replace(self._key, "***") if self._key else text)


class _AdaptiveLimit:
    """Numbered concurrency slots whose number shrinks on rate limits and grows back on successes (AIMD).

    The limit is a float in [1, maximum]; `int(limit)` holders may have a slot at once, each with its own
    number in `range(maximum)`. Waiters are served in arrival order.
    """

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.limit = float(maximum)
        # A stack, so the most recently used slots (and their warm connections) are reused first.
        self._free = list(range(maximum - 1, -1, -1))
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._last_cut = -math.inf

    @property
    def in_flight(self) -> int:
        return self.maximum - len(self._free)

    async def acquire(self) -> int:
        """Wait for a free slot and return its number."""
        if self.in_flight < int(self.limit) and not self._waiters:
            return self._free.pop()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed a slot just as we were cancelled: give it back
            else:
                self._wake()  # never strand the waiters queued behind this one
            raise

    def release(self, slot: int) -> None:
        self._free.append(slot)
        self._wake()

    def on_success(self) -> None:
        if self.limit < self.maximum:
            self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)
            self._wake()

    def on_rate_limit(self, started: float) -> None:
        # Requests sent before the last cut were sent under the old limit; their 429s must not cut again.
        if started >= self._last_cut:
            self.limit = max(1.0, self.limit / 2)
            self._last_cut = time.monotonic()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < int(self.limit):
            waiter = self._waiters.popleft()
            if not waiter.done():  # cancelled waiters stay in the queue until reached
                waiter.set_result(self._free.pop())


class _Pacer:
    """Spaces request starts by the event loop's CPU time per request.

    Requests sent together come back together, and the event loop then serves the burst round-robin (the HTTP
    stack awaits many times per request), so every request of the burst waits for the CPU time of the whole
    burst, round trip after round trip. Starting requests no closer together than the loop's CPU time per
    request keeps the answers spread out. That caps the request rate at what the loop's core can process
    anyway, so it costs no throughput; on the loopback benchmark it lifted the median achieved/ideal
    throughput from 0.74 to 0.81. CPU time is measured only while requests are in flight, so work between
    batches does not count.
    """

    def __init__(self) -> None:
        self.interval = 0.0
        """Seconds between request starts; 0 until measured."""
        self._next = 0.0
        self._active = 0
        self._finished = 0
        self._mark: tuple[int, float] | None = None  # (thread id, its CPU time) at the last estimate

    async def wait(self) -> None:
        """Sleep until this request's turn to start; pair every call with `finished()`."""
        if self._active == 0:  # coming out of idle: start a fresh measurement window
            self._finished, self._mark = 0, None
        self._active += 1
        if self.interval <= 0:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)

    def finished(self) -> None:
        """Count a finished attempt; every `_PACER_WINDOW` of them, re-estimate the interval."""
        self._active -= 1
        self._finished += 1
        if self._finished % _PACER_WINDOW:
            return
        mark = (threading.get_ident(), time.thread_time())
        if self._mark is not None and self._mark[0] == mark[0]:
            sample = min((mark[1] - self._mark[1]) / _PACER_WINDOW, _PACER_MAX_INTERVAL_S)
            self.interval = sample if self.interval == 0 else 0.75 * self.interval + 0.25 * sample
        self._mark = mark


async def _deadline(awaitable: Awaitable[T], seconds: float) -> T:
    """`awaitable`'s result, or `TimeoutError` after `seconds` (httpx's timeouts are per phase, not total)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def _refusal(fault: _Fault | Failure, names: tuple[str, ...] = ()) -> bool:
    """Whether a probe's fault refuses what it probed: a 4xx other than 401/403/408/429 (BAD_REQUEST), 501 Not
    Implemented, or a 5xx that names one of `names`. Other 5xx, timeouts and dropped connections are the server
    failing."""
    if fault.category is FailureCategory.BAD_REQUEST:
        return True
    return fault.category is FailureCategory.SERVER_ERROR and (
        fault.message.startswith("HTTP 501") or _names(fault, names))


def _refuses_form(fault: _Fault | Failure, form: str) -> bool:
    """Whether an HTTP error refuses the structured-output `form`: a 4xx or 5xx whose message names its field
    (`STRUCTURED_FIELD_NAMES`). A 4xx that names none may be about the request itself (the probe is a real
    request), so it decides nothing."""
    errors = (FailureCategory.BAD_REQUEST, FailureCategory.SERVER_ERROR)
    return fault.category in errors and _names(fault, STRUCTURED_FIELD_NAMES[form])


def _names(fault: _Fault | Failure, names: tuple[str, ...]) -> bool:
    """Whether the fault's message names one of `names` (case aside)."""
    message = fault.message.lower()
    return any(name in message for name in names)


def _status_fault(status: int, response: Any) -> _Fault:
    """Categorise an HTTP error status (`response` is the SDK's httpx response)."""
    try:
        detail = response.text[:_SNIPPET_CHARS]
    except Exception:  # an unread streamed body: the status says enough
        detail = ""
    message = f"HTTP {status}: {detail}".strip()
    if status in (401, 403):
        return _Fault(FailureCategory.AUTH, message, False)
    if status == 429:
        return _Fault(FailureCategory.RATE_LIMIT, message, True, retry_after_seconds(response.headers))
    if status == 408:
        return _Fault(FailureCategory.TIMEOUT, message, True, retry_after_seconds(response.headers))
    if status >= 500:
        return _Fault(FailureCategory.SERVER_ERROR, message, True, retry_after_seconds(response.headers))
    return _Fault(FailureCategory.BAD_REQUEST, message, False)


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a response asks for (`retry-after-ms`, or `Retry-After` in seconds or as an HTTP date).

    Capped at 60 s; None when the response names none.
    """
    value = headers.get("retry-after-ms")
    try:
        if value is not None:
            return min(max(float(value) / 1000, 0.0), _RETRY_AFTER_CAP_S)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _RETRY_AFTER_CAP_S)


def normalise_base_url(url: str) -> str:
    """`url` with lower-case scheme and host, no user:password part, no query (the backend sends its parameters
    with each request) and no trailing slash."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    netloc = f"{host}:{parts.port}" if parts.port else host
    if ":" in host:  # IPv6 literal
        netloc = f"[{host}]:{parts.port}" if parts.port else f"[{host}]"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), "", ""))


_THINK_BLOCK = re.compile(r"\s*<think>.*?</think>\s*", re.DOTALL)


def _kept_constraint(payload: dict[str, Any], constraint: Constraint) -> tuple[bool | None, str]:
    """Whether the first choice of `payload` keeps to `constraint` (True), breaks it, so the server ignored it
    (False, with why), or cannot tell (None: an answer cut at max_tokens, a regex Python cannot compile)."""
    texts = _choice_texts(payload, len(payload.get("choices") or ()) or 1)
    if isinstance(texts, str) or payload["choices"][0].get("finish_reason") == "length":
        return None, ""
    text = texts[0]
    if constraint.think:
        text = _THINK_BLOCK.sub("", text, count=1) if text.lstrip().startswith("<think>") else text.lstrip()
    if constraint.kind == "choice":
        return (True, "") if text in constraint.options else (False, f"{text[:60]!r} is none of the choices")
    if constraint.kind == "regex":
        try:
            matched = re.fullmatch(constraint.spec, text)
        except re.error:
            return None, ""
        return (True, "") if matched else (False, f"{text[:60]!r} does not match the pattern")
    try:
        json.loads(text)
    except ValueError:
        return False, f"{text[:60]!r} is not JSON"
    return True, ""


def _choice_texts(payload: dict[str, Any], n: int) -> tuple[str, ...] | str:
    """The text of every choice in index order, or a message saying why the body is not a completion."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        if isinstance(payload.get("error"), dict):
            return f"server answered 200 with an error: {payload['error'].get('message', payload['error'])}"
        return "response has no choices"
    if len(choices) != n:
        return f"asked for {n} choices, got {len(choices)} (the server may not support n > 1)"
    try:
        ordered = sorted(choices, key=lambda c: int(c.get("index", 0)))
        texts = tuple(c["message"]["content"] for c in ordered)
    except (TypeError, KeyError, ValueError, AttributeError):
        return "a choice lacks message.content or a valid index"
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            return f"choice {i} has no text content (content is {text!r}: a refusal or tool call?)"
    return texts


def _choice_logprobs(
    payload: dict[str, Any], texts: tuple[str, ...], k: int
) -> tuple[tuple[TokenLogprob, ...], ...] | Failure:
    """The token logprobs of every choice in index order (`texts` from `_choice_texts`), or why not."""
    ordered = sorted(payload["choices"], key=lambda c: int(c.get("index", 0)))
    result = []
    for i, (choice, text) in enumerate(zip(ordered, texts)):
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(content, list):
            return Failure(
                FailureCategory.UNSUPPORTED,
                f"the server did not return token logprobs for choice {i} (asked with logprobs=true, "
                f"top_logprobs={k}; it may not support them for this model)",
            )
        tokens = _token_logprobs(content, text, k)
        if isinstance(tokens, str):
            return Failure(FailureCategory.MALFORMED_RESPONSE, f"choice {i}: {tokens}")
        result.append(tokens)
    return tuple(result)


def _token_logprobs(content: list[Any], text: str, k: int) -> tuple[TokenLogprob, ...] | str:
    """TokenLogprobs of one choice's `logprobs.content` (see the module docstring), or what is wrong."""
    pieces: list[str] = []
    values: list[tuple[float, dict[str, float]]] = []
    for n, entry in enumerate(content):
        if not isinstance(entry, dict) or not _token_entry(entry):
            return f"logprobs.content[{n}] lacks a token or a numeric logprob"
        top: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or ():
            if isinstance(alt, dict) and _token_entry(alt):
                top[alt["token"]] = max(float(alt["logprob"]), top.get(alt["token"], -math.inf))
        pieces.append(entry["token"])
        values.append((float(entry["logprob"]), dict(sorted(top.items(), key=lambda t: -t[1])[:k])))
    raw = [entry.get("bytes") for entry in content]
    if raw and all(isinstance(b, list) and all(type(x) is int and 0 <= x < 256 for x in b) for b in raw):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pieces = [decoder.decode(bytes(b)) for b in raw]
        pieces[-1] += decoder.decode(b"", final=True)
    keep = len(pieces)
    if "".join(pieces).startswith(text):  # otherwise the offsets mean nothing: keep every token
        keep = offset = 0
        while keep < len(pieces) and offset < len(text):
            offset += len(pieces[keep])
            keep += 1
    return tuple(TokenLogprob(piece, *value) for piece, value in zip(pieces[:keep], values))


def _token_entry(entry: dict[str, Any]) -> bool:
    """Whether `entry` has a string `token` and a numeric `logprob`."""
    logprob = entry.get("logprob")
    numeric = isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
    return numeric and isinstance(entry.get("token"), str)


def _first_token_alternatives(payload: dict[str, Any]) -> list[tuple[str, float]] | Failure:
    """(token, logprob) pairs ranked at the first generated position: `top_logprobs` and the chosen token."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Failure(FailureCategory.MALFORMED_RESPONSE, "response has no choices")
    logprobs = choices[0].get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return Failure(
            FailureCategory.UNSUPPORTED,
            "the server did not return logprobs (it may not support logprobs/top_logprobs for this model)",
        )
    first = content[0]
    entries = [*(first.get("top_logprobs") or []), first]
    pairs = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        token, logprob = entry.get("token"), entry.get("logprob")
        if isinstance(token, str) and isinstance(logprob, (int, float)) and not isinstance(logprob, bool):
            pairs.append((token, float(logprob)))
    if not pairs:
        return Failure(FailureCategory.MALFORMED_RESPONSE, "logprobs have no (token, logprob) entries")
    return pairs


def match_candidates(
    alternatives: Sequence[tuple[str, float]], candidates: Sequence[str]
) -> dict[str, float]:
    """Each candidate's log-probability among `alternatives`, comparing without leading whitespace.

    Several tokens can match one candidate (`Yes`, ` Yes`): the largest logprob wins. Unlisted -> `-inf`.
    """
    best: dict[str, float] = {}
    for token, logprob in alternatives:
        key = token.lstrip()
        if logprob > best.get(key, -math.inf):
            best[key] = logprob
    return {c: best.get(c.lstrip(), -math.inf) for c in candidates}

