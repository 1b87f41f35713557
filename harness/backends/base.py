"""The backend contract: batch in, batch out, async at the boundary.

Every model the harness talks to (an OpenAI-compatible server, a transformers model, a vLLM engine) is a
`BaseBackend`. Requests and results are frozen records. A backend never raises for a single bad request: it returns a
result whose `error` says what went wrong (`harness.errors.Failure`), so one failure cannot lose a batch. It raises
`HarnessError` only for problems that stop everything (model missing, server unreachable at start-up).
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.errors import ConfigError, Failure, FailureCategory

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn."""

    role: Role
    """Who speaks."""
    content: str
    """What they say."""


ConstraintKind = Literal["json_schema", "regex", "choice"]


@dataclass(frozen=True, slots=True)
class Constraint:
    """Structured output: the generated text must match a JSON schema, a regular expression or one of a few choices.

    Every backend honours it its own way (`hf`: a logits mask built from the tokenizer; `vllm`: its structured
    outputs; `openai`: `response_format` where the server supports it, else the plain request; the caller's parser
    still reads the text). Build one with `json_schema`, `regex` or `choice`; it enters the call-cache key.
    """

    kind: ConstraintKind
    """What `spec` is."""
    spec: str
    """`json_schema`: the schema as canonical compact JSON (keys sorted, except the order of `properties`, which is
    the order a grammar has the model write them: reasoning fields before a score); `regex`: the pattern (the whole output matches it);
    `choice`: the options as a JSON list of strings (the output is exactly one of them)."""
    think: bool = False
    """Allow a reasoning block `<think>...</think>` (and whitespace) before the constrained text, for models that
    think first (Qwen3); the constraint applies after it."""
    name: str = "output"
    """A name for the schema (OpenAI's `response_format.json_schema.name`)."""
    lark: str = ""
    """`json_schema` only, optional: an llguidance Lark grammar defining `body`, a subset of the schema's language
    that local backends (`hf`, `vllm`) decode under instead of the schema, for what a schema cannot say (a token
    budget: `judges.dynamic.rubric_constraint`). Remote servers get the schema."""

    def __post_init__(self) -> None:
        if self.kind not in ("json_schema", "regex", "choice"):
            raise ValueError(f"unknown constraint kind {self.kind!r}; valid: json_schema, regex, choice")

    @classmethod
    def json_schema(
        cls, schema: Mapping[str, Any], *, name: str = "output", think: bool = False, lark: str = ""
    ) -> Constraint:
        return cls("json_schema", json.dumps(_canonical_schema(schema), separators=(",", ":")), think, name, lark)

    @classmethod
    def regex(cls, pattern: str, *, think: bool = False) -> Constraint:
        return cls("regex", pattern, think)

    @classmethod
    def choice(cls, options: Sequence[str], *, think: bool = False) -> Constraint:
        if not options:
            raise ValueError("a choice constraint needs at least one option")
        return cls("choice", json.dumps(list(options)), think)

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema (`json_schema` only)."""
        return json.loads(self.spec)

    @property
    def options(self) -> list[str]:
        """The choices (`choice` only)."""
        return json.loads(self.spec)

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "spec": self.spec, "think": self.think}
        if self.lark:  # only where set: other constraints keep their cache keys
            out["lark"] = self.lark
        return out

    def after_prefix(self, prefix: str) -> Constraint | None:
        """The constraint on a whole assistant turn that must start with `prefix` and continue under this
        constraint (for a server that cannot continue a prefilled turn, so the turn is asked for whole): a regex
        or a choice with the prefix in front; None for a JSON schema (no schema can say "this text, then JSON")."""
        if not prefix:
            return self
        if self.kind == "regex":
            return Constraint.regex(regex_literal(prefix) + "(" + self.spec + ")", think=self.think)
        if self.kind == "choice":
            return Constraint.choice([prefix + option for option in self.options], think=self.think)
        return None


def _canonical_schema(node: Any, *, ordered: bool = False) -> Any:
    """`node` with every object's keys sorted, except a `properties` object's own keys (their order is kept)."""
    if isinstance(node, Mapping):
        keys = list(node) if ordered else sorted(node)
        return {k: _canonical_schema(node[k], ordered=(k == "properties" and not ordered)) for k in keys}
    if isinstance(node, list):
        return [_canonical_schema(v) for v in node]
    return node


def regex_literal(text: str) -> str:
    """`text` as a regular expression matching exactly it, escaping only the metacharacters every dialect shares
    (Python's `re.escape` also escapes characters some engines refuse to see escaped)."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in text)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Semantic sampling parameters: everything here changes the output, so all of it enters the cache key."""

    n: int = 1
    """Number of samples for the request."""
    temperature: float = 0.0
    """0 means greedy decoding (deterministic)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens: int = 512
    """Upper bound on generated tokens per sample."""
    seed: int | None = None
    """Sampling seed of this request; sample i uses a seed derived from it (see `sample_seed`)."""
    stop: tuple[str, ...] = ()
    """Stop strings (not included in the output)."""
    logprobs: int = 0
    """Top alternatives to return per generated token (0: no logprobs). See `Completion.logprobs`."""
    min_tokens: int = 0
    """End-of-sequence is suppressed until this many tokens were generated (stop strings still apply).

    Honoured by `hf` and `vllm`; `openai` sends it to servers found to honour it (vLLM's), not to others (it is
    not part of the OpenAI API)."""
    constraint: Constraint | None = None
    """Structured output the text must match (see `Constraint`); None: free text."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in 0..20, got {self.logprobs}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in 0..max_tokens={self.max_tokens}, got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request seeded with `seed` (None stays None)."""
    if seed is None:
        return None
    return (seed * 1_000_003 + index) % (2**31 - 1)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A chat to complete, `params.n` times."""

    messages: tuple[Message, ...]
    """The conversation so far; the model writes the next assistant turn."""
    params: SamplingParams = field(default_factory=SamplingParams)
    """How to sample."""
    assistant_prefix: str = ""
    """Text the assistant turn starts with (a prefill); the completion continues it and does not repeat it.

    `hf` and `vllm` render it after the generation prompt. `openai` sends it in the form the server was found
    to continue; a server that continues none is asked without it (the constraint, if any, then covers the
    prefix too: `Constraint.after_prefix`) and the completion says so (`Completion.continues_prefix`)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request (all samples together)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token with its log-probability and the top alternatives at its position."""

    token: str
    """The token's text (the pieces of a sample's tokens concatenate to its text, up to stop-string trimming)."""
    logprob: float
    """Log-probability of this token."""
    top: dict[str, float]
    """The `params.logprobs` most likely tokens at this position (text -> log-probability)."""

    def to_json(self) -> list:
        return [self.token, self.logprob, self.top]

    @classmethod
    def from_json(cls, data: list) -> TokenLogprob:
        token, logprob, top = data
        return cls(token, float(logprob), {k: float(v) for k, v in top.items()})


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to one `GenerateRequest`."""

    texts: tuple[str, ...]
    """One text per sample, in sample order; empty when `error` is set."""
    usage: Usage = field(default_factory=Usage)
    """Tokens spent (zero when served from the cache)."""
    error: Failure | None = None
    """Why the request failed, or None."""
    cached: bool = False
    """True when every sample came from the call cache."""
    logprobs: tuple[tuple[TokenLogprob, ...], ...] | None = None
    """Per sample, the generated tokens with their top alternatives; set only when `params.logprobs > 0`."""
    continues_prefix: bool = True
    """Whether the texts continue the request's `assistant_prefix`. False when the backend could not prefill
    (a server that opens a new turn after an assistant message): the request went without the prefix and the
    texts are whole answers, so the prefix must not be joined onto them."""
    constrained: bool = True
    """Whether the texts were generated under the request's `params.constraint` (True without one). False when
    the backend sent the request without it (a server that takes no form of it): the caller's parser reads the
    texts as usual, but they are not the constrained request's answer, so the call cache does not keep them."""

    @property
    def ok(self) -> bool:
        return self.error is None


def assistant_text(prefix: str, completion: Completion, i: int = 0) -> str:
    """The whole assistant turn of sample `i`: `prefix + text` when the completion continues the prefill, else
    the text as written (a backend that could not prefill asked for the whole turn; never glue the prefix on)."""
    text = completion.texts[i]
    return prefix + text if completion.continues_prefix else text


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    """Score the first token the assistant would write next: in one context, or in several sharing a start.

    With `branches`, the request stands for one context per branch: branch `i` is appended to the content of
    the last message of `messages`, so every branch shares the conversation up to that point. Backends compute
    the shared part once where they can (`hf`: one forward pass over the tokens all branches share, then the
    branches together on a copy of its KV cache; `vllm`: automatic prefix caching; `openai`: one HTTP request
    per branch, left to the server's prefix cache).
    """

    messages: tuple[Message, ...]
    """The conversation; the next token is the start of a new assistant turn."""
    assistant_prefix: str = ""
    """Text already written at the start of that assistant turn (prefill), if the backend supports it."""
    branches: tuple[str, ...] = ()
    """Texts completing the last message, one context each (see the class docstring); empty: one context."""

    def __post_init__(self) -> None:
        if self.branches and not self.messages:
            raise ValueError("a LogprobRequest with branches needs a message to append them to")

    def contexts(self) -> list[tuple[Message, ...]]:
        """The conversations this request scores: `messages` itself, or one per branch."""
        if not self.branches:
            return [self.messages]
        *head, last = self.messages
        return [(*head, Message(last.role, last.content + b)) for b in self.branches]


@dataclass(frozen=True, slots=True)
class LogprobResult:
    """Next-token log-probabilities of the candidate strings (per branch, for a request with branches)."""

    logprobs: dict[str, float]
    """Candidate -> log-probability of its first token; `-inf` when the backend did not rank it. Empty for a
    request with branches (see `branches`)."""
    error: Failure | None = None
    """Why the request failed, or None."""
    cached: bool = False
    """True when served from the call cache."""
    branches: tuple[dict[str, float], ...] = ()
    """For a request with branches: one candidate -> log-probability dict per branch, in branch order."""
    usage: Usage = field(default_factory=Usage)
    """Prompt tokens the backend computed (a prefix shared by branches counts once; zero from the cache)."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class LoglikelihoodRequest:
    """The log-probability of `continuation` right after a context: lm-evaluation-harness' `loglikelihood`.

    The context is `text` as it stands (tokenized as lm-eval's `hf` model does: see `HFBackend.loglikelihood`)
    or, with `messages`, the chat rendered for the assistant's next turn (the chat template, with
    `add_generation_prompt`) followed by `text`: the start of that turn.
    """

    continuation: str
    """The text scored, word-boundary space included (`" Paris"`)."""
    text: str = ""
    """The raw context, or with `messages` the text the assistant turn starts with."""
    messages: tuple[Message, ...] = ()
    """A chat the context is rendered from (empty: `text` alone is the context)."""


@dataclass(frozen=True, slots=True)
class LoglikelihoodResult:
    """The answer to one `LoglikelihoodRequest`."""

    logprob: float | None
    """Sum of the continuation tokens' log-probabilities; None when `error` is set."""
    greedy: bool | None = None
    """Whether greedy decoding would write exactly the continuation's tokens."""
    tokens: int = 0
    """Tokens of the continuation."""
    truncated: bool = False
    """Whether the context was cut from the left to fit the model's context."""
    error: Failure | None = None
    cached: bool = False
    usage: Usage = field(default_factory=Usage)
    """Prompt tokens the backend computed (zero from the cache)."""

    @property
    def ok(self) -> bool:
        return self.error is None


ScoreHead = Literal["classifier", "lm-token0"]
SCORE_HEADS: tuple[ScoreHead, ...] = ("classifier", "lm-token0")
"""Where a reward model's score is read (see `ScoreRequest.head`)."""


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """A conversation for a reward model to score: one scalar for its last (assistant) turn.

    The conversation is rendered with the tokenizer's chat template (`add_generation_prompt=False`: it ends with
    the scored turn) and tokenized without adding special tokens (the template writes any BOS itself); a
    tokenizer without a template gets `Role: content` turns separated by blank lines, tokenized with special
    tokens (`User: {prompt}\\n\\nAssistant: {response}` for a prompt and a response).
    """

    messages: tuple[Message, ...]
    """The conversation, ending in the assistant turn being scored."""
    head: ScoreHead = "classifier"
    """Where the score comes from. `classifier`: the logit of a sequence-classification checkpoint with
    `num_labels=1` (Skywork-Reward and most open reward models), read where the model's own head reads it (the
    last token that is not the pad token). `lm-token0`: a causal LM's next-token logit of token id 0 after the
    whole conversation, the convention of `nvidia/Llama-3.1-Nemotron-70B-Reward-HF`."""
    max_length: int = 8192
    """Most tokens the model sees (clamped to its context): a longer input is cut from the left, keeping a leading
    BOS, so the end of the scored turn, where the score is read, always survives."""

    def __post_init__(self) -> None:
        if self.head not in SCORE_HEADS:
            raise ValueError(f"unknown score head {self.head!r}; valid: {', '.join(SCORE_HEADS)}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        if not self.messages or self.messages[-1].role != "assistant":
            raise ValueError("a ScoreRequest's conversation must end with the assistant turn it scores")


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """A reward model's score of one `ScoreRequest`, with the input's token counts."""

    score: float | None
    """The raw logit (computed in float32 from the model's output), uncalibrated: only differences between scores
    of one model mean anything. None when `error` is set; a non-finite logit is a failure, never a score."""
    tokens: int | None = None
    """Tokens of the rendered conversation before any cut (None when it could not be rendered)."""
    kept: int | None = None
    """Tokens the model saw: `tokens`, or fewer when the input was cut (see `ScoreRequest.max_length`)."""
    error: Failure | None = None
    """Why the request failed, or None."""
    cached: bool = False
    """True when served from the call cache."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def truncated(self) -> bool:
        """Whether the input was cut to fit."""
        return self.tokens is not None and self.kept is not None and self.kept < self.tokens


class BaseBackend(abc.ABC):
    """What every model backend implements, with the defaults it shares stated once. A backend (or a test stub)
    subclasses this and implements `generate`, then whatever else its model can do. What it inherits says what it
    cannot: no token logprobs, no loglikelihoods (each request an `unsupported` failure), no reward-model scoring
    (refused before any call), nothing to probe, check or close, and its identity is its kind and model. Models that
    run in this process subclass `harness.backends.local.LocalBackend`, which adds loading and releasing.

    Call sites use exactly these members: `kind`, `model`, `identity()`, `generate(...)`,
    `next_token_logprobs(...)`, `loglikelihood(...)`, `score(...)`, `check_score(...)`, `capabilities()`,
    `preflight()`, `probe()` and `close()`.
    """

    kind: str = "base"
    """Registry name of the implementation (`openai`, `hf`, `vllm`)."""
    model: str = ""
    """The model as the user named it (id or path)."""

    def identity(self) -> dict[str, str]:
        """What identifies the weights behind this backend (model id, revision or weights hash, server).

        Enters the call-cache key; never contains secrets, timeouts or concurrency.
        """
        return {"kind": self.kind, "model": self.model}

    @abc.abstractmethod
    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Complete every request; the result list is aligned with `requests`."""

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        """Log-probabilities of each candidate's first token at the next position, aligned with `requests`."""
        failure = Failure(FailureCategory.UNSUPPORTED, f"{self.kind}:{self.model} returns no token logprobs")
        return [LogprobResult({}, error=failure) for _ in requests]

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        """Log-probability of each continuation after its context, aligned with `requests` (a backend that
        cannot compute it answers every request with an `unsupported` failure)."""
        failure = Failure(FailureCategory.UNSUPPORTED, f"{self.kind}:{self.model} computes no loglikelihoods")
        return [LoglikelihoodResult(None, error=failure) for _ in requests]

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """A reward model's scalar for the last turn of each conversation, aligned with `requests`; refused here
        (see `check_score`).

        Raises:
            ConfigError: always, where the backend scores with no reward model.
        """
        self.check_score(requests[0].head if requests else "classifier")
        return []

    def check_score(self, head: ScoreHead) -> None:
        """Refuse, before anything loads, a model that cannot `score` with `head` (an unfit checkpoint, a backend
        without reward scoring); what cannot be known without loading is checked on the first `score` call.

        Raises:
            ConfigError: saying why (here: this backend scores with no reward model).
        """
        raise ConfigError(f"{self.kind}:{self.model} cannot score with a reward model (head={head})")

    def capabilities(self) -> dict[str, str]:
        """What this backend was found to lack so far, each with how requests cope (`{"n > 1": "unsupported
        (...): one request per sample"}`); empty when it lacks nothing. Servers are probed on first use, so
        this grows during a run; the run's manifest records it."""
        return {}

    def preflight(self) -> None:
        """Check, before the first call, what this machine or environment must provide (vLLM installed, a key
        variable the user named set); building a backend checks none of it, so a plan needs neither. Here:
        nothing.

        Raises:
            HarnessError: saying what is missing.
        """

    async def probe(self) -> None:
        """Fail fast, before a run starts, when the backend cannot work at all. Here: nothing to probe.

        Raises:
            BackendUnavailableError: e.g. the server is unreachable or refuses the API key.
        """

    async def close(self) -> None:
        """Release connections, engines and memory. Here: nothing to release."""


def _setting(default: Any, help: str, *, flag: str | None = None, minimum: float | None = None) -> Any:
    """A backend setting, declared once: its config key is the field's name; `harness.commands.options` makes the
    command-line option from `flag` (default `--field-name`), `help` and `minimum`."""
    return field(default=default, metadata={"help": help, "flag": flag, "min": minimum})


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Backend settings: those that do not change outputs (never part of a cache key) and load-time choices; the
    load-time choices that change outputs (`dtype`, and `top_logprobs` for `vllm`) enter the backend's identity.

    Each is a key of a config's `backend:` (and of a judge's or a model endpoint's options) and an option of every
    verb that builds models (`--base-url`, ...), with the same meaning and default."""

    base_url: str | None = _setting(
        None, "OpenAI-compatible server URL (default: $OPENAI_BASE_URL, else the OpenAI API).")
    api_key_env: str | None = _setting(
        None, "Environment variable that holds the API key (the key itself is never stored). Default: "
        "$OPENAI_API_KEY where it is set, else no key (local servers need none); a variable named here must be set.")
    concurrency: int = _setting(32, "Maximum requests in flight (openai).", minimum=1)
    timeout: float = _setting(120.0, "Per-request timeout in seconds (openai).", minimum=0.1)
    max_attempts: int = _setting(6, "Attempts per request before recording a failure (openai).", minimum=1)
    top_logprobs: int = _setting(
        20, "Alternatives asked for in logprob requests (openai, vllm; vllm's engine allows at least this many, and "
        "at least 20, per generated token).", minimum=1)
    dtype: str = _setting(
        "auto", "Local models' torch dtype: auto, bfloat16, float16, float32. An explicit one changes outputs, so it "
        "enters the model's identity (and the cache key). auto: float32 on CPU and bf16 on CUDA for hf; the "
        "checkpoint's own (bf16 for most, on CPU too) for vllm: pass float32 where vllm must agree with hf on CPU.")
    device: str = _setting(
        "auto", "Torch device for hf: auto picks CUDA when present and spreads a model over the GPUs when several "
        "are visible; cuda:N pins one.")
    batch_size: int = _setting(8, "Sequences per forward pass for hf (generation, logprobs, reward scores).",
                               minimum=1)
    jump_forward: bool = _setting(
        True, "hf: tokens a grammar forces (a rubric's JSON keys and punctuation) go into the KV cache in one forward "
        "pass with the sampled token before them, instead of one pass each; outputs are the same.")
    tensor_parallel_size: int | None = _setting(
        None, "vLLM tensor parallelism: the devices one engine spans (default: every device of the run's devices, "
        "as the plan sets it, or 1).", flag="--tensor-parallel", minimum=1)
    data_parallel_size: int = _setting(
        1, "vLLM data parallelism: only behind vLLM's server (one engine process per rank), so an in-process engine "
        "refuses any value but 1; serve the model (vllm serve --data-parallel-size k, or replicas).",
        flag="--data-parallel", minimum=1)
    gpu_memory_utilization: float = _setting(0.85, "vLLM's share of GPU memory.", minimum=0.01)
    max_model_len: int | None = _setting(
        None, "vLLM context limit (default: the run's longest request, as `run` and `plan` fit it; else the "
        "model's).", minimum=1)
    max_num_seqs: int | None = _setting(
        None, "vLLM: sequences an engine schedules at once (default: the plan's 256 where the run has devices, "
        "else vLLM's own).", minimum=1)
    max_num_batched_tokens: int | None = _setting(
        None, "vLLM: tokens an engine step processes at most (default: the plan's 8192 where the run has devices, "
        "else vLLM's own).", minimum=1)
    kv_cache_memory_bytes: int | None = _setting(
        None, "vLLM: the KV cache's size per device, in bytes, instead of profiling for it (default: the plan's, "
        "where the run has devices and the installed vLLM takes it; else vLLM profiles).", minimum=1)
    enforce_eager: bool = _setting(
        False, "vLLM: run the model eagerly (no torch.compile or CUDA graphs): the engine starts in a third of the "
        "time and decodes more slowly; outputs are the same.")


def chat_to_json(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as plain dicts, the form chat templates and OpenAI's API take."""
    return [{"role": m.role, "content": m.content} for m in messages]


def user_chat(text: str, *, system: str | None = None) -> tuple[Message, ...]:
    """A one-turn chat (with an optional system message)."""
    head = (Message("system", system),) if system else ()
    return head + (Message("user", text),)
