"""The `openai` backend: any OpenAI-compatible chat-completions server (OpenAI, DeepSeek, vLLM, SGLang,
llama.cpp).

`OpenAIBackend` builds the requests and probes what a server does (its docstring). The retrying, rate-limited
transport lives in `harness.backends.openai_transport`, the request forms and the reading of answers in
`harness.backends.openai_format`, the loglikelihood and reward-model roles in `harness.backends.openai_served`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harness.backends.base import (
    BackendOptions,
    BaseBackend,
    Completion,
    Constraint,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    Message,
    Usage,
    chat_to_json,
    sample_seed,
)
from harness.backends.openai_format import (
    PREFILL_FORMS,
    STRUCTURED_FIELD_NAMES,
    STRUCTURED_FORMS,
    choice_logprobs,
    choice_texts,
    first_token_alternatives,
    kept_constraint,
    match_candidates,
    prefill_fields,
    structured_fields,
)
from harness.backends.openai_served import PROBE_QUESTION, ServedRoles, _usage
from harness.backends.openai_transport import Fault, Transport
from harness.errors import ConfigError, Failure, FailureCategory

log = logging.getLogger(__name__)

N_SAMPLES = "n > 1"
MIN_TOKENS = "min_tokens"
PREFILL = "assistant prefill"
TOP_LOGPROBS = "top_logprobs"
TOKEN_LOGPROBS = "token logprobs"
SHORT_PROBE = "What is 2+2? Reply with the number only."
"""The `min_tokens` probe's question: one most models answer in a few tokens (SmolLM2-135M: 7-8)."""
PREFILL_PROBE = ("Count to ten in words.", " one two three four five six")
"""The prefill probe's user turn and prefix (common words: one token each after a space in common tokenizers)."""


class OpenAIBackend(ServedRoles, Transport, BaseBackend):
    """An OpenAI-compatible server as a backend (`BaseBackend`).

    Every request ends as a completion or a categorised `Failure`: the transport retries what another attempt may
    mend (`Transport`), and an answer without a usable completion is MALFORMED_RESPONSE, a logprob answer without
    logprobs UNSUPPORTED (`harness.backends.openai_format`). Loglikelihoods and reward-model scores come from
    vLLM's own endpoints (`ServedRoles`). `preflight` refuses an unset key variable that `options` names.

    What servers differ in is probed, not assumed, on the first request that needs it (one-token probes, each
    once per backend, under a lock so concurrent requests wait for the answer), kept in `probed()`, and what a
    server lacks is listed by `capabilities()` (the run prints it once and records it in the manifest). Only a
    clear answer decides: a refusal (a 4xx; a 501) or an answer that shows what the server does. A probe the
    server fails (another 5xx, a timeout, a dropped connection) is retried as any request is and decides nothing:
    the request that needed it fails with that failure (a replica router moves it on, a rerun retries it) and the
    next request probes again. The features (README.md has them as a table): `n > 1` (else one request per
    sample, sample i seeded with `sample_seed(seed, i)`); assistant prefill in the first of `PREFILL_FORMS` the
    server continues (else the turn is asked whole, `continues_prefix=False`, with a constraint covering the
    prefix too, and a logprob request with a prefix fails as UNSUPPORTED); `top_logprobs` (the larger of 20 and
    `options.top_logprobs`, else 5; with none, logprob requests fail as UNSUPPORTED unsent); vLLM's `min_tokens`
    (else not sent); structured output in the first of `STRUCTURED_FORMS` the server takes and keeps to (else
    plain requests, said by `constrained=False`, which the call cache keeps under no key).

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
        options = options or BackendOptions()
        if options.concurrency < 1 or options.max_attempts < 1 or not options.timeout > 0:
            raise ConfigError(
                f"openai backend needs concurrency >= 1, max_attempts >= 1 and timeout > 0; got concurrency="
                f"{options.concurrency}, max_attempts={options.max_attempts}, timeout={options.timeout}"
            )
        self.model = model
        self.options = options
        self._found: dict[str, Any] = {}
        """Feature -> what this server was found to do: a structured-output or prefill form (None: none taken),
        whether `n > 1` works, the most `top_logprobs` it lists (0: no logprobs)."""
        self._lacks: dict[str, str] = {}
        """Feature -> what it does not do and how requests cope (`capabilities`)."""
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._probe_failures: dict[str, tuple[int, Failure]] = {}
        """Feature -> how many of its probes the server failed, and the latest failure (`_probe_once`)."""
        self._open_transport(backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s)

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
        texts = choice_texts(payload, p.n)
        if isinstance(texts, str):
            return Completion(texts=(), error=self._failure(FailureCategory.MALFORMED_RESPONSE, texts, attempts))
        logprobs = None
        if p.logprobs:
            logprobs = choice_logprobs(payload, texts, p.logprobs)
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
            alternatives = first_token_alternatives(payload)
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
        if not isinstance(outcome, Fault):
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
            alternatives = first_token_alternatives(payload)
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
            outcome: dict[str, Any] | Fault | Failure = await self._attempt(sent)
            attempts = 1
            if isinstance(outcome, Fault) and not _refuses_form(outcome, form):
                outcome, attempts = await self._post("/chat/completions", sent, first=outcome)
            if isinstance(outcome, (Fault, Failure)):
                if _refuses_form(outcome, form):
                    refusals.append(f"{form}: {self._scrub(outcome.message)}")
                    continue
                return outcome, attempts  # a Failure: a fault that refuses nothing went through `_post`
            kept, why = kept_constraint(outcome, constraint)
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


def _refusal(fault: Fault | Failure, names: tuple[str, ...] = ()) -> bool:
    """Whether a probe's fault refuses what it probed: a 4xx other than 401/403/408/429 (BAD_REQUEST), 501 Not
    Implemented, or a 5xx that names one of `names`. Other 5xx, timeouts and dropped connections are the server
    failing."""
    if fault.category is FailureCategory.BAD_REQUEST:
        return True
    return fault.category is FailureCategory.SERVER_ERROR and (
        fault.message.startswith("HTTP 501") or _names(fault, names))


def _refuses_form(fault: Fault | Failure, form: str) -> bool:
    """Whether an HTTP error refuses the structured-output `form`: a 4xx or 5xx whose message names its field
    (`STRUCTURED_FIELD_NAMES`). A 4xx that names none may be about the request itself (the probe is a real
    request), so it decides nothing."""
    errors = (FailureCategory.BAD_REQUEST, FailureCategory.SERVER_ERROR)
    return fault.category in errors and _names(fault, STRUCTURED_FIELD_NAMES[form])


def _names(fault: Fault | Failure, names: tuple[str, ...]) -> bool:
    """Whether the fault's message names one of `names` (case aside)."""
    message = fault.message.lower()
    return any(name in message for name in names)
