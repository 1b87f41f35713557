"""The roles an OpenAI-compatible chat API cannot serve, taken from vLLM's own endpoints: loglikelihoods of given
text (`/tokenize`, `/detokenize`, `/v1/completions` with prompt logprobs) and reward-model scores (`/classify` on a
server started with the pooling runner). `ServedRoles` is mixed into `OpenAIBackend`, whose request machinery it
uses: retries, concurrency and response bounds (`harness.backends.openai_transport`) and probes (`OpenAIBackend`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.backends.base import (
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Message,
    ScoreHead,
    ScoreRequest,
    ScoreResult,
    Usage,
    chat_to_json,
)
from harness.backends.http_bounds import (
    BODY_BASE_BYTES,
    BODY_BYTES_PER_ALTERNATIVE,
    BODY_BYTES_PER_TOKEN,
    BODY_CAP_BYTES,
)
from harness.errors import ConfigError, Failure, FailureCategory

TOKENIZER = "tokenizer endpoint"
PREFIX_TOKEN = "BOS/EOS token"
CHAT_TEMPLATE = "chat template"
PROMPT_LOGPROBS = "prompt logprobs"
CLASSIFIER = "classifier endpoint"
LOGLIKELIHOOD_FORMS: dict[str, dict[str, Any]] = {
    "prompt_logprobs": {"prompt_logprobs": 1},
    "echo": {"echo": True, "logprobs": 1},
}
"""How prompt-token logprobs are asked of `/completions`, in the order probed: vLLM's `prompt_logprobs` (per
prompt position, the prompt token's logprob and rank keyed by token id), then the legacy OpenAI `echo` with
`logprobs` (the prompt's tokens echoed with their logprobs and top alternatives, lm-eval's `local-completions`)."""
LOGLIKELIHOOD_PROBE = "The capital of France is Paris."
"""The text of the prompt-logprobs probe."""
PROBE_QUESTION = "Say yes."
"""The user turn of the `n`, `top_logprobs` and classifier probes."""


class ServedRoles:
    """Loglikelihood and reward-model scoring through a vLLM server (mixed into `OpenAIBackend`)."""

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        """Log-probability of each continuation after its context, as the `hf` and `vllm` backends compute it,
        from the prompt logprobs of one completion request each (see the module docstring).

        The server's tokenizer splits a request as `harness.backends.local.loglikelihood_ids` does (a chat is
        rendered by its template with the generation prompt and read back as text; an empty context starts from
        the BOS id, or EOS without one); the ids are cut from the left to the server's `max_model_len` less the
        one generated token (as the `vllm` backend cuts them), and `greedy` holds when every continuation token
        ranks first. Lookups that requests share (a multiple-choice question's context) are made once per call.
        A server that lacks what this needs (probed once: `capabilities`) gets nothing sent, and every request
        an `unsupported` failure saying what it lacked.
        """
        if not requests:
            return []
        try:
            ready: Any = await self._tokenizer_facts()
            if isinstance(ready, _TokenizerFacts):
                ready = await self._loglikelihood_form(ready)
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            ready = self._failure(FailureCategory.BACKEND, repr(exc), 1)
        if ready is None:
            feature = TOKENIZER if self._found.get(TOKENIZER) is None else PROMPT_LOGPROBS
            ready = Failure(FailureCategory.UNSUPPORTED, self._scrub(
                f"openai:{self.model} cannot compute loglikelihoods: {self._server_label()} lacks the {feature} "
                f"({self._lacks.get(feature, 'unsupported')}); serve the model with vLLM's OpenAI server, or use "
                "hf: or vllm:"))
        if isinstance(ready, Failure):
            return [LoglikelihoodResult(None, error=ready) for _ in requests]
        facts, shared = self._found[TOKENIZER], _Shared()
        return list(await asyncio.gather(*(self._loglikelihood_one(r, facts, ready, shared) for r in requests)))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Raw logits of a sequence classifier served by vLLM's pooling runner, aligned with `requests`, as the
        `hf` and `vllm` backends compute them (see the module docstring).

        The conversation is rendered and tokenized by the server as `harness.backends.local.score_ids` renders
        it (the chat template without a generation prompt, or plain `Role: content` turns with special tokens
        for a tokenizer without one) and cut from the left to `max_length`, clamped to the server's
        `max_model_len`, keeping a leading BOS; the ids go to `POST /classify` with `use_activation: false`, one
        HTTP request per conversation (the server batches concurrent ones).

        Raises:
            ConfigError: `head=lm-token0` (`check_score`); a server without vLLM's classifier endpoint (not
                started with `--runner pooling`), or whose classifier has other than one label (probed once).
        """
        for head in sorted({r.head for r in requests}):
            self.check_score(head)
        if not requests:
            return []
        try:
            ready: Any = await self._classifier_labels()
            if not isinstance(ready, Failure):
                self._require_scalar_classifier(ready)
                ready = await self._tokenizer_facts()
        except ConfigError:
            raise
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            ready = self._failure(FailureCategory.BACKEND, repr(exc), 1)
        if ready is None:
            ready = Failure(FailureCategory.UNSUPPORTED, self._scrub(
                f"openai:{self.model} cannot render a conversation for its reward model: {self._server_label()} "
                f"lacks the {TOKENIZER} ({self._lacks.get(TOKENIZER, 'unsupported')})"))
        if isinstance(ready, Failure):
            return [ScoreResult(None, error=ready) for _ in requests]
        return list(await asyncio.gather(*(self._score_one(r, ready) for r in requests)))

    def check_score(self, head: ScoreHead) -> None:
        """Refuse `head=lm-token0`, which no server can give; `classifier` passes here, since whether the server
        runs vLLM's pooling runner takes a request to find out (the first `score` call probes it).

        Raises:
            ConfigError: for `head=lm-token0`.
        """
        if head == "lm-token0":
            raise ConfigError(
                f"openai:{self.model} cannot score with head=lm-token0: a server returns no raw LM logits (a "
                "pooling server returns a classifier's output, completions return log-probabilities); score a "
                "causal-LM reward model such as Nemotron-70B-Reward-HF with hf:, or serve a "
                "*ForSequenceClassification reward model with vLLM's `--runner pooling` and use head=classifier"
            )

    def _root_url(self, path: str) -> str:
        """The absolute URL of an endpoint outside the OpenAI API's `/v1` (vLLM's `/tokenize`, `/classify`)."""
        return self.base_url.removesuffix("/v1") + path

    async def _tokenize(
        self,
        text: str = "",
        *,
        messages: Sequence[Message] = (),
        special: bool = True,
        generation_prompt: bool = True,
    ) -> list[int] | Failure:
        """Token ids of `text` by the server's tokenizer (`special`: with its default special tokens), or of a
        chat rendered by its template (`generation_prompt`: for the assistant's next turn), through `POST
        /tokenize`; or why not."""
        body: dict[str, Any] = {"model": self.model}
        if messages:
            body.update(messages=chat_to_json(messages), add_generation_prompt=generation_prompt,
                        add_special_tokens=False)
            size = sum(len(m.content.encode()) for m in messages)
        else:
            body.update(prompt=text, add_special_tokens=special)
            size = len(text.encode())
        # An id and its separator take at most 12 bytes, and no tokenizer makes more tokens than bytes.
        payload, attempts = await self._post(self._root_url("/tokenize"), body, limit=BODY_BASE_BYTES + 12 * size)
        if isinstance(payload, Failure):
            return payload
        ids = _token_ids(payload)
        if ids is None:
            return self._failure(FailureCategory.MALFORMED_RESPONSE, "the /tokenize answer has no token ids",
                                 attempts)
        return ids

    async def _detokenize(self, ids: Sequence[int]) -> str | Failure:
        """The text of `ids` by the server's tokenizer (`POST /detokenize`, special tokens kept), or why not."""
        body = {"model": self.model, "tokens": list(ids)}
        limit = BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * len(ids)
        payload, attempts = await self._post(self._root_url("/detokenize"), body, limit=limit)
        if isinstance(payload, Failure):
            return payload
        text = payload.get("prompt")
        if not isinstance(text, str):
            return self._failure(FailureCategory.MALFORMED_RESPONSE, "the /detokenize answer has no prompt text",
                                 attempts)
        return text

    async def _rendered_chat(self, messages: Sequence[Message]) -> str | Failure:
        """The server's chat template's rendering of `messages` for the assistant's next turn, as text (its ids
        read back with `/detokenize`, checked to tokenize to the same ids again); or why not."""
        ids = await self._tokenize(messages=messages)
        if isinstance(ids, Failure):
            return ids
        text = await self._detokenize(ids)
        if isinstance(text, Failure):
            return text
        again = await self._tokenize(text, special=False)
        if isinstance(again, Failure):
            return again
        if again != ids:
            return Failure(FailureCategory.UNSUPPORTED, self._scrub(
                f"{self._server_label()}'s chat rendering does not survive decoding (its text tokenizes to other "
                "ids), so the context's text is unknown"))
        return text

    async def _tokenizer_facts(self) -> _TokenizerFacts | Failure | None:
        """What the server's tokenizer adds and declares (probed once), None for a server without vLLM's
        tokenizer endpoint, or the failure of a server that is failing rather than refusing (probed again on
        the next call; `_probe_once`)."""
        return await self._probe_once(TOKENIZER, self._probe_tokenizer)

    async def _probe_tokenizer(self) -> _TokenizerFacts | Failure | None:
        """`POST /tokenize` of the empty text with special tokens (what the tokenizer adds, and the server's
        `max_model_len`); `GET /tokenizer_info` for the BOS and EOS tokens it declares (else the first id it adds,
        as the BOS); a one-turn chat, to learn whether it has a chat template."""
        url = self._root_url("/tokenize")
        body = {"model": self.model, "prompt": "", "add_special_tokens": True}
        payload, refused = await self._probe_post(body, path=url, limit=BODY_BASE_BYTES)
        if isinstance(payload, Failure) and not refused:
            return payload
        added = _token_ids(payload) if isinstance(payload, dict) else None
        if added is None or not isinstance(payload, dict):
            why = payload.message if isinstance(payload, Failure) else "the answer has no token ids"
            self._lacking(TOKENIZER, f"unsupported (POST {url}: {why}): loglikelihood and reward-model score "
                                     "requests fail as unsupported without being sent")
            return None
        length = payload.get("max_model_len")
        max_model_len = length if type(length) is int and length > 0 else None
        info, refused = await self._probe_post(None, path=self._root_url("/tokenizer_info"), limit=_INFO_LIMIT)
        if isinstance(info, Failure) and not refused:
            return info
        declared: dict[str, tuple[int, str]] = {}
        for role in ("bos_token", "eos_token") if isinstance(info, dict) else ():
            token = info.get(role)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and token:
                ids = await self._tokenize(token, special=False)
                if isinstance(ids, Failure):
                    return ids
                if len(ids) == 1:
                    declared[role] = (ids[0], token)
        bos = declared.get("bos_token")
        prefix = bos or declared.get("eos_token")
        if prefix is None and added:  # a tokenizer that adds special tokens adds its BOS first
            text = await self._detokenize(added[:1])
            if isinstance(text, Failure):
                return text
            bos = prefix = (added[0], text)
        if prefix is None:
            why = info.message if isinstance(info, Failure) else "GET /tokenizer_info names neither"
            self._lacking(PREFIX_TOKEN, f"unknown ({why}; the tokenizer adds no special tokens): loglikelihoods "
                                        "after an empty context fail as unsupported, and a reward model's input "
                                        "cut to fit keeps no leading BOS (start vLLM with "
                                        "--enable-tokenizer-info-endpoint)")
        chat, refused = await self._probe_post(
            {"model": self.model, "messages": [{"role": "user", "content": PROBE_QUESTION}]}, path=url,
            limit=BODY_BASE_BYTES)
        if isinstance(chat, Failure) and not refused:
            return chat
        template = isinstance(chat, dict) and _token_ids(chat) is not None
        if not template:
            why = chat.message if isinstance(chat, Failure) else "the answer has no token ids"
            self._lacking(CHAT_TEMPLATE, f"none ({why}): chats are rendered as plain `Role: content` turns, as hf "
                                         "renders them for a tokenizer without one")
        return _TokenizerFacts(max_model_len, template, bos[0] if bos else None,
                               prefix[0] if prefix else None, prefix[1] if prefix else None)

    async def _loglikelihood_form(self, facts: _TokenizerFacts) -> str | Failure | None:
        """The form in which this server returns prompt logprobs (`LOGLIKELIHOOD_FORMS`), None when it returns
        them in none, or the failure of a server that is failing rather than refusing (probed again next call).

        Probed once: the probe text's ids as a completion's prompt, in each form until an answer carries a
        logprob for every prompt token after the first (a server that ignores a field it does not know answers
        without them)."""
        return await self._probe_once(PROMPT_LOGPROBS, lambda: self._probe_loglikelihood(facts))

    async def _probe_loglikelihood(self, facts: _TokenizerFacts) -> str | Failure | None:
        ids = await self._tokenize(LOGLIKELIHOOD_PROBE)
        if isinstance(ids, Failure):
            return ids
        if facts.max_model_len is not None:
            ids = ids[-max(2, facts.max_model_len - 1):]  # within the context, room left for the generated token
        seen = []
        for form, fields in LOGLIKELIHOOD_FORMS.items():
            body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, **fields}
            payload, refused = await self._probe_post(body, path="/completions", limit=_prompt_limit(len(ids)))
            if isinstance(payload, Failure):
                if not refused:
                    return payload
                seen.append(f"{form}: refused, {payload.message}")
                continue
            read = _read_prompt_logprobs(payload, ids, len(ids) - 1, form)
            if not isinstance(read, str):
                return form
            seen.append(f"{form}: answered without them ({read})")
        self._lacking(PROMPT_LOGPROBS, f"unsupported ({'; '.join(seen)}): loglikelihood requests fail as "
                                       "unsupported without being sent")
        return None

    async def _pair_ids(
        self, request: LoglikelihoodRequest, facts: _TokenizerFacts, shared: _Shared
    ) -> tuple[list[int], list[int]] | Failure:
        """(context ids, continuation ids) of `request` by the server's tokenizer, split as
        `harness.backends.local.loglikelihood_ids` splits them with a local tokenizer."""
        from harness.backends.local import render_plain

        def tokenize(text: str, special: bool) -> Awaitable[list[int] | Failure]:
            return shared.get(("tokenize", text, special), lambda: self._tokenize(text, special=special))

        context, continuation = request.text, request.continuation
        if request.messages and facts.chat_template:
            rendered = await shared.get(("chat", request.messages), lambda: self._rendered_chat(request.messages))
            if isinstance(rendered, Failure):
                return rendered
            context = rendered + request.text
        elif request.messages:
            context = render_plain(request.messages) + (" " + request.text if request.text else "")
        if context == "":
            cont = await tokenize(continuation, False)
            if isinstance(cont, Failure) or not cont:
                return cont if isinstance(cont, Failure) else ([], [])
            if facts.prefix_id is None:
                return Failure(FailureCategory.UNSUPPORTED, self._scrub(
                    f"{self._server_label()} does not say its BOS or EOS token ({self._lacks.get(PREFIX_TOKEN)}), "
                    "so a continuation after an empty context cannot be scored"))
            first = facts.prefix_id
            return ([first], cont) if first != cont[0] else (cont[:1], cont[1:])
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        # A text that starts with the BOS string gets no second one (HF's `tok_encode`, as in loglikelihood_ids).
        special = not (facts.prefix_text and context.startswith(facts.prefix_text))
        whole, ctx = await asyncio.gather(tokenize(context + continuation, special), tokenize(context, special))
        for ids in (whole, ctx):
            if isinstance(ids, Failure):
                return ids
        return ctx, whole[len(ctx):]  # type: ignore[index, return-value]

    async def _loglikelihood_one(
        self, request: LoglikelihoodRequest, facts: _TokenizerFacts, form: str, shared: _Shared
    ) -> LoglikelihoodResult:
        try:
            pair = await self._pair_ids(request, facts, shared)
            if isinstance(pair, Failure):
                return LoglikelihoodResult(None, error=pair)
            ctx, cont = pair
            if not cont:
                return LoglikelihoodResult(0.0, True, 0)
            whole, limit = ctx + cont, facts.max_model_len
            if limit is not None and len(cont) >= limit - 1:
                return LoglikelihoodResult(None, error=Failure(
                    FailureCategory.BAD_REQUEST, f"continuation has {len(cont)} tokens; the server's context is "
                    f"{limit}, and one token must precede it and one be generated"))
            ids = whole[-(limit - 1):] if limit is not None else whole
            body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                    **LOGLIKELIHOOD_FORMS[form]}
            payload, attempts = await self._post("/completions", body, limit=_prompt_limit(len(ids)))
            if isinstance(payload, Failure):
                return LoglikelihoodResult(None, error=payload)
            read = _read_prompt_logprobs(payload, ids, len(cont), form)
            if isinstance(read, str):
                return LoglikelihoodResult(None, error=self._failure(FailureCategory.MALFORMED_RESPONSE, read,
                                                                     attempts))
            return LoglikelihoodResult(read[0], read[1], len(cont), len(ids) < len(whole),
                                       usage=Usage(_usage(payload).prompt_tokens or len(ids), 0))
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            return LoglikelihoodResult(None, error=self._failure(FailureCategory.BACKEND, repr(exc), 1))

    async def _classifier_labels(self) -> int | Failure:
        """How many labels the server's classifier has (0: it has no classifier endpoint), probed once with
        `POST /classify` of a short text; or the failure of a server that is failing rather than refusing
        (`_probe_once`)."""
        return await self._probe_once(CLASSIFIER, self._probe_classifier)

    async def _probe_classifier(self) -> int | Failure:
        url = self._root_url("/classify")
        body = {"model": self.model, "input": PROBE_QUESTION, "use_activation": False}
        payload, refused = await self._probe_post(body, path=url, limit=BODY_BASE_BYTES)
        if isinstance(payload, Failure) and not refused:
            return payload
        labels = _classifier_probs(payload) if isinstance(payload, dict) else None
        if isinstance(labels, list):
            return len(labels)
        why = payload.message if isinstance(payload, Failure) else labels
        self._lacking(CLASSIFIER, f"unsupported (POST {url}: {why}): reward-model scores are refused")
        return 0

    def _require_scalar_classifier(self, labels: int) -> None:
        """Raises ConfigError unless the server's classifier has one label (`_classifier_labels`)."""
        if labels == 0:
            raise ConfigError(
                f"openai:{self.model} cannot score with a reward model: {self.url} is not a "
                f"pooling server ({CLASSIFIER} {self._lacks.get(CLASSIFIER, 'unsupported')}); start vLLM's "
                "server on the *ForSequenceClassification checkpoint with the pooling runner (`python -m "
                "vllm.entrypoints.openai.api_server --model DIR --runner pooling`), or load it with hf: or vllm:"
            )
        if labels != 1:
            raise ConfigError(f"openai:{self.model} serves a classifier with {labels} labels; a scalar reward "
                              "model needs 1")

    async def _score_one(self, request: ScoreRequest, facts: _TokenizerFacts) -> ScoreResult:
        from harness.backends.local import render_turns, score_result, truncate_left

        try:
            if facts.chat_template:
                ids = await self._tokenize(messages=request.messages, generation_prompt=False)
            else:
                ids = await self._tokenize(render_turns(request.messages))
            if isinstance(ids, Failure):
                return ScoreResult(None, error=ids)
            limit = min(request.max_length, facts.max_model_len or request.max_length)
            kept = truncate_left(ids, limit, facts.bos_id)
            body = {"model": self.model, "input": [kept], "use_activation": False}
            payload, attempts = await self._post(self._root_url("/classify"), body, limit=BODY_BASE_BYTES)
            if isinstance(payload, Failure):
                return ScoreResult(None, len(ids), len(kept), error=payload)
            probs = _classifier_probs(payload)
            if not isinstance(probs, list) or len(probs) != 1:
                why = probs if isinstance(probs, str) else f"{len(probs or ())} values for one label"
                return ScoreResult(None, len(ids), len(kept),
                                   error=self._failure(FailureCategory.MALFORMED_RESPONSE, why, attempts))
            return score_result(probs[0], len(ids), len(kept))
        except Exception as exc:  # a bug or an SDK surprise must not lose the batch
            return ScoreResult(None, error=self._failure(FailureCategory.BACKEND, repr(exc), 1))


_INFO_LIMIT = 4 * 1024 * 1024
"""The most bytes a `GET /tokenizer_info` answer may take (a tokenizer's config, added tokens and template)."""


@dataclass(frozen=True, slots=True)
class _TokenizerFacts:
    """What a server's tokenizer adds and declares (`OpenAIBackend._probe_tokenizer`)."""

    max_model_len: int | None
    """The server's context, in tokens (None: it did not say)."""
    chat_template: bool
    """Whether it renders chats with a template (else plain `Role: content` turns, as `hf` does)."""
    bos_id: int | None
    """The BOS id a left cut keeps (`truncate_left`)."""
    prefix_id: int | None
    """What an empty context starts from: the BOS id, or EOS without one (None: unknown)."""
    prefix_text: str | None
    """That token's text: a text starting with it gets no special tokens added."""


class _Shared:
    """The answers to the lookups of one call, each made once however many requests ask (a multiple-choice
    question's context is tokenized once for all its choices)."""

    def __init__(self) -> None:
        self._tasks: dict[Any, asyncio.Future[Any]] = {}

    async def get(self, key: Any, make: Any) -> Any:
        """`await make()`'s result, the first time `key` is asked; the same result afterwards."""
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = asyncio.ensure_future(make())
        return await asyncio.shield(task)


def _prompt_limit(tokens: int) -> int:
    """The most bytes a prompt-logprobs answer for a prompt of `tokens` tokens may take: per position, its text
    (echoed) and token, and two alternatives in two forms (vLLM's echo answers carry `prompt_logprobs` too)."""
    per_position = 2 * BODY_BYTES_PER_TOKEN + 4 * BODY_BYTES_PER_ALTERNATIVE
    return min(BODY_CAP_BYTES, BODY_BASE_BYTES + (tokens + 1) * per_position)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_ids(payload: dict[str, Any]) -> list[int] | None:
    """The `tokens` of a `/tokenize` answer, or None when it has no list of token ids."""
    ids = payload.get("tokens")
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        return None
    return ids


def _read_prompt_logprobs(
    payload: dict[str, Any], ids: Sequence[int], n: int, form: str
) -> tuple[float, bool] | str:
    """(summed logprob, greedy) of the last `n` tokens of the prompt `ids` in a completion answer in `form`
    (`LOGLIKELIHOOD_FORMS`), or what the answer lacks. Greedy: each token ranks first (vLLM's `rank`; in the
    echo form, lm-eval's rule: no listed alternative has a larger logprob)."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "response has no choices"
    choice, total, greedy = choices[0], 0.0, True
    positions = range(len(ids) - n, len(ids))
    if form == "prompt_logprobs":
        steps = choice.get("prompt_logprobs")
        if not isinstance(steps, list) or len(steps) < len(ids):
            return f"no prompt_logprobs for each of the {len(ids)} prompt tokens"
        for t in positions:
            step = steps[t] if isinstance(steps[t], dict) else {}
            entry = step.get(str(ids[t]))
            if not isinstance(entry, dict) or not _number(entry.get("logprob")):
                return f"prompt_logprobs[{t}] lacks the prompt's token {ids[t]}"
            value, rank = float(entry["logprob"]), entry.get("rank")
            if type(rank) is int:
                greedy = greedy and rank == 1
            else:
                listed = [e.get("logprob") for e in step.values() if isinstance(e, dict)]
                greedy = greedy and value >= max(float(v) for v in listed if _number(v))
            total += value
        return total, greedy
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or not isinstance(tops, list) or min(len(values), len(tops)) < len(ids):
        return f"no echoed token_logprobs and top_logprobs for each of the {len(ids)} prompt tokens"
    for t in positions:
        value, top = values[t], tops[t]
        if not _number(value):
            return f"token_logprobs[{t}] is not a number"
        listed = [float(v) for v in top.values() if _number(v)] if isinstance(top, dict) else []
        greedy = greedy and float(value) >= max(listed, default=float(value))
        total += float(value)
    return total, greedy


def _classifier_probs(payload: dict[str, Any]) -> list[float] | str:
    """The values of the one input of a `/classify` answer (`data[0].probs`; raw logits with
    `use_activation: false`), or what the answer lacks."""
    data = payload.get("data")
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        return "the answer has no data for the one input sent"
    probs = data[0].get("probs")
    if not isinstance(probs, list) or not probs or not all(_number(v) for v in probs):
        return "the answer's data[0] has no probs"
    return [float(v) for v in probs]


def _usage(payload: dict[str, Any]) -> Usage:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    try:
        return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    except (TypeError, ValueError):
        return Usage()
