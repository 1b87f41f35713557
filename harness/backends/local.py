"""What the in-process backends (`hf`, `vllm`) share, so `hf:X` and `vllm:X` mean the same thing.

- Locating a model: `locate_model` classifies a name as a GGUF file (converted once), a local checkpoint folder or
  a hub id (`repo@revision`, resolved to a commit) and identifies its weights, loading nothing.
- Rendering a prompt: `encode_chat` (the tokenizer's chat template, or `render_plain` for tokenizers without one),
  `encode_contexts` for the contexts of a logprob request, and `loglikelihood_ids` for a loglikelihood request
  (split as lm-evaluation-harness splits it).
- Reading an answer: `answer_span` turns a row of generated ids into the answer's text the same way for both, and
  `token_pieces` / `tokens_within` / `top_texts` shape per-token logprobs.
- Candidates of a logprob request: `candidate_token_ids`.
- Reward models (`BaseBackend.score`): `check_score_head` refuses a checkpoint that does not fit a head, from its
  config.json; `score_ids` renders and cuts a conversation (`encode_scored`, `truncate_left`); `score_result`
  turns a logit into a result.
- Devices and dtypes: `pick_device`, `pick_dtype`, `device_map`, `hf_placement` (`max_memory` from the plan's
  share, `even_max_memory`), `check_placed`.
- Stopping work nobody waits for: `InFlight` and `Cancelled`.
- The lifecycle both share (`LocalBackend`): loaded on the first uncached request (`probe`), freed by `release`
  until the next, stopped and freed for good by `close`.

torch, transformers and huggingface_hub are imported inside functions.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import functools
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.backends.base import (
    BaseBackend,
    LoglikelihoodRequest,
    LogprobRequest,
    Message,
    ScoreRequest,
    ScoreResult,
    chat_to_json,
)
from harness.errors import (
    BackendUnavailableError,
    ConfigError,
    Failure,
    FailureCategory,
    Interrupted,
    ModelNotFoundError,
)

PLAIN_STOPS = ("\nUser:",)


DTYPES = ("bfloat16", "float16", "float32")


def check_dtype(dtype: str) -> None:
    """Raises ConfigError unless `dtype` is `auto` or one of `DTYPES`."""
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(DTYPES)}")


def backend_failure(message: str) -> Failure:
    """A per-request failure of a local backend, on one line."""
    return Failure(FailureCategory.BACKEND, " ".join(message.split()))


class Cancelled(Interrupted):
    """Work of a local backend stopped before it finished (see `InFlight`): nothing it computed is returned, so
    nothing of it is cached or recorded."""


_COMPUTE: dict[int, ThreadPoolExecutor] = {}
_COMPUTE_GUARD = threading.Lock()


def compute_thread() -> ThreadPoolExecutor:
    """The one thread on which this process's `hf` models load, compute and free.

    torch's CPU kernels run on an OpenMP team per calling thread, and GNU OpenMP (torch's wheels) stops spinning
    between parallel regions as soon as its teams together hold more threads than the machine has cores: each of
    the thousands of small products of a decode then waits for its threads to wake. With the work spread over
    `asyncio.to_thread`'s pool, every forward pass ran about 2x slower than from one thread, even with one thread
    working at a time (measured on 2 cores: a 2-row decode pass of SmolLM2-135M 61 ms against 33 ms). Models in one
    process therefore take turns on this thread, as they would take turns for the cores anyway. One per process
    (a forked child gets its own).
    """
    pid = os.getpid()
    with _COMPUTE_GUARD:
        if pid not in _COMPUTE:
            _COMPUTE.clear()
            _COMPUTE[pid] = ThreadPoolExecutor(1, thread_name_prefix="harness-compute")
        return _COMPUTE[pid]


async def in_thread(executor: ThreadPoolExecutor | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on `executor` (None: `asyncio.to_thread`'s pool), in a copy of the caller's context."""
    if executor is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


class InFlight:
    """The work a local backend runs in worker threads, and the calls waiting for it.

    A local model computes in a thread the event loop cannot interrupt, so cancelling the task that awaits it
    would leave it running to its end (a run stopped with Ctrl-C waited minutes for a generation it then threw
    away). Each piece of work (`run`) gets its own `threading.Event`, its *stop*: the work checks it between
    steps (`hf`: a stopping criterion at every decode step and a check between batches; `vllm`: between engine
    steps) and raises `Cancelled` once it is set. A stop is set when the task awaiting the work is cancelled,
    when the last call waiting on the backend (`call`) is cancelled (calls merged into one batch wait on it
    together; Ctrl-C cancels them all), and by `cancel` (the backend closing, or any thread).
    """

    def __init__(self, executor: ThreadPoolExecutor | None = None) -> None:
        self.executor = executor
        """Where the work runs (None: `asyncio.to_thread`'s pool; `hf`: `compute_thread()`)."""
        self._waiting = 0
        self._stops: set[threading.Event] = set()
        self._guard = threading.Lock()
        self.stopped = 0
        """How many pieces of work were told to stop while in flight."""

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Wrap one call of the backend's async methods: if it is cancelled while no other call waits, the work
        in flight stops."""
        self._waiting += 1
        try:
            yield
        except asyncio.CancelledError:
            if self._waiting == 1:
                self.cancel()
            raise
        finally:
            self._waiting -= 1

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args, stop=event)` in a worker thread (`executor`); cancelling this await sets `event` too."""
        stop = threading.Event()
        with self._guard:
            self._stops.add(stop)
        try:
            return await in_thread(self.executor, fn, *args, stop=stop)
        except asyncio.CancelledError:
            with self._guard:
                self._stop(stop)
            raise
        finally:
            with self._guard:
                self._stops.discard(stop)

    def cancel(self) -> None:
        """Stop every piece of work in flight; safe from any thread. Each raises `Cancelled` after its current
        step."""
        with self._guard:
            for stop in self._stops:
                self._stop(stop)

    def _stop(self, stop: threading.Event) -> None:
        if not stop.is_set():
            self.stopped += 1
            stop.set()


class LocalBackend(BaseBackend):
    """A model that runs in this process (`hf`, `vllm`): its weights take this machine's memory, so the run's
    scheduler loads, releases and counts it. A subclass sets up `_closed`, `_inflight`, `loads` and `releases`
    (`_local_state`) and implements `load`, `resident` and `_free`; the lifecycle is here.

    - `probe`: load the model (the call cache probes a backend before its first uncached request);
    - `release`: free its memory now; the next request the call cache cannot answer loads it again (a run's
      scheduler releases a model no unit of the next phase needs);
    - `cancel`: stop the work in flight, from any thread; the calls waiting for it raise `Cancelled`;
    - `close`: `cancel`, then free the model for good; later requests fail.
    """

    def _local_state(self, executor: ThreadPoolExecutor | None = None) -> None:
        self._closed = False
        self._inflight = InFlight(executor)
        self.loads = 0
        """How many times the model was loaded (0 until the first request the cache could not answer)."""
        self.releases = 0
        """How many times a loaded model was freed (`release`, `close`)."""

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model now (a no-op once loaded).

        Raises:
            BackendUnavailableError: the backend is closed, or what it needs is missing.
        """

    @property
    @abc.abstractmethod
    def resident(self) -> bool:
        """Whether the model is in memory now."""

    @abc.abstractmethod
    def _free(self, *, closing: bool) -> None:
        """Free the model's memory (counted in `releases`); `closing`: for good."""

    @property
    def executor(self) -> ThreadPoolExecutor | None:
        """The thread the model works on (`hf`: `compute_thread()`), None: `asyncio.to_thread`'s pool."""
        return self._inflight.executor

    def load_blocking(self) -> None:
        """`load` on the model's own thread, waiting for it here (a caller in another thread: a run's engine start)."""
        if self.executor is None:
            self.load()
        else:
            self.executor.submit(self.load).result()

    async def probe(self) -> None:
        if not self.resident or self._closed:
            await in_thread(self.executor, self.load)

    async def release(self) -> None:
        await in_thread(self.executor, self._free, closing=False)

    def cancel(self) -> None:
        self._inflight.cancel()

    async def close(self) -> None:
        self.cancel()
        await in_thread(self.executor, self._free, closing=True)


def check_stop(stop: threading.Event, what: str) -> None:
    """Raise `Cancelled` (saying `what` was stopped) if `stop` is set."""
    if stop.is_set():
        raise Cancelled(f"{what} was cancelled; nothing of it is kept")


def prompt_ids(
    tokenizer: Any, messages: Sequence[Message], prefix: str, context_length: int | None
) -> tuple[list[int] | None, Failure | None]:
    """`encode_chat`'s ids, or the failure of a chat that cannot be rendered or leaves no room in the context."""
    try:
        ids = encode_chat(tokenizer, messages, prefix)
    except Exception as exc:  # e.g. a template that rejects a system turn
        return None, backend_failure(f"cannot render the chat: {type(exc).__name__}: {exc}")
    if context_length and len(ids) >= context_length:
        return None, backend_failure(f"prompt has {len(ids)} tokens; the model's context is {context_length}")
    return ids, None


def render_plain(messages: Sequence[Message]) -> str:
    """The plain-text rendering used when a tokenizer has no chat template.

    Example: `User: Is water wet?\\n\\nAssistant:`.
    """
    turns = [f"{m.role.capitalize()}: {m.content}" for m in messages]
    return "\n\n".join(turns + ["Assistant:"])


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_chat(tokenizer: Any, messages: Sequence[Message], assistant_prefix: str = "") -> list[int]:
    """Token ids of a prompt: the chat rendered for the assistant's next turn, plus `assistant_prefix`.

    With a chat template: `apply_chat_template(..., add_generation_prompt=True)` then the prefix, tokenized
    without special tokens (the template writes any BOS itself). Without one: `render_plain`, a space and the
    prefix, tokenized with special tokens (so a base model gets its BOS).
    """
    return tokenizer.encode(chat_text(tokenizer, messages, assistant_prefix),
                            add_special_tokens=not has_chat_template(tokenizer))


def chat_text(tokenizer: Any, messages: Sequence[Message], assistant_prefix: str = "") -> str:
    """The text `encode_chat` tokenizes: the chat template's rendering for the next assistant turn plus the
    prefix, or `render_plain`, a space and the prefix."""
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            chat_to_json(messages), tokenize=False, add_generation_prompt=True
        )
        return text + assistant_prefix
    return render_plain(messages) + (" " + assistant_prefix if assistant_prefix else "")


def loglikelihood_ids(tokenizer: Any, request: LoglikelihoodRequest) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of `request`, split as lm-evaluation-harness' `hf` model splits them
    (`TemplateLM.loglikelihood`, `_encode_pair`, `HFLM.tok_encode` with `add_bos_token` unset).

    The context is `request.text`, or the chat rendered as `chat_text` renders it with `text` as the prefix.
    An empty context becomes the BOS id (EOS without one), unless the continuation starts with it. Otherwise
    trailing whitespace moves from the context to the continuation, `context + continuation` and the context are
    tokenized with the tokenizer's default special tokens (none when the text already starts with the BOS
    string), and the continuation is the whole's ids after the context's.
    """
    context, continuation = request.text, request.continuation
    if request.messages:
        context = chat_text(tokenizer, request.messages, request.text)
    prefix_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if context == "":
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        if not cont:
            return [prefix_id], []
        return ([prefix_id], cont) if prefix_id != cont[0] else (cont[:1], cont[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    bos = tokenizer.decode([prefix_id]) if prefix_id is not None else None

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, **({"add_special_tokens": False} if bos and text.startswith(bos) else {}))

    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx):]


def candidate_token_ids(tokenizer: Any, candidate: str) -> list[int]:
    """The ids a candidate may start with: the first token of `candidate` and of `" " + candidate`.

    A whitespace-only first token (a tokenizer that splits the space off) is skipped; an empty candidate has
    none.
    """
    found: set[int] = set()
    if candidate:
        for text in (candidate, " " + candidate):
            toks = tokenizer.encode(text, add_special_tokens=False)
            if toks and (tokenizer.decode(toks[:1]).strip() or not candidate.strip()):
                found.add(toks[0])
    return sorted(found)


def token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text each token adds to `tokenizer.decode(ids, skip_special_tokens=True)`; they concatenate to it.

    Decoded incrementally over a sliding window, as streaming detokenizers do, so a token's leading space
    survives even where a lone decode would drop it. A token that ends inside a multi-byte character adds ""
    and the token completing the character carries it. Should a window disagree with the full decode (a
    decoder that rewrites earlier text), each piece is taken from decodes of the whole prefix instead.
    """

    def decode(part: Sequence[int]) -> str:
        return tokenizer.decode(list(part), skip_special_tokens=True)

    full = decode(ids)
    pieces: list[str] = []
    start = read = 0  # window start; tokens before `read` have been emitted
    for i in range(len(ids)):
        before, after = decode(ids[start:read]), decode(ids[start : i + 1])
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before) :])
            start, read = read, i + 1
        else:
            pieces.append("")
    if not _finish_pieces(pieces, full):
        pieces, done = [], ""
        for i in range(len(ids)):
            now = decode(ids[: i + 1])
            held = now.endswith("\ufffd") or not now.startswith(done)
            pieces.append("" if held else now[len(done) :])
            done = done if held else now
        _finish_pieces(pieces, full)
    return pieces


def _finish_pieces(pieces: list[str], full: str) -> bool:
    """Give the text still missing at the end (held back partial characters) to the last piece."""
    joined = "".join(pieces)
    if not pieces or not full.startswith(joined):
        return joined == full
    pieces[-1] += full[len(joined) :]
    return True


def tokens_within(pieces: Sequence[str], end: int, start: int = 0) -> range:
    """The indices of the tokens that overlap `text[start:end]`, where `text` is `"".join(pieces)`.

    Tokens wholly at or after `end` and, when `start > 0`, wholly before `start` are dropped; a token that
    straddles either cut is kept.
    """
    first: int | None = None
    last = offset = 0
    for i, piece in enumerate(pieces):
        if offset >= end:
            break
        offset += len(piece)
        if first is None and (start == 0 or offset > start):
            first = i
        last = i + 1
    return range(last if first is None else first, last)


def top_texts(tokenizer: Any, ranked: Iterable[tuple[int, float]], cache: dict[int, str]) -> dict[str, float]:
    """Text -> logprob of `(token id, logprob)` pairs sorted by falling logprob.

    A token's text is `tokenizer.decode([id])` (special tokens by name), memoised in `cache`; of two ids that
    decode alike, the first (larger) logprob is kept.
    """
    top: dict[str, float] = {}
    for token_id, logprob in ranked:
        text = cache.get(token_id)
        if text is None:
            text = cache[token_id] = tokenizer.decode([token_id])
        top.setdefault(text, logprob)
    return top


def pick_device(device: str) -> str:
    """`auto` -> `cuda` when available, else `cpu`; anything else as given."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def pick_dtype(dtype: str, device: str):
    """The torch dtype for `dtype` on `device`.

    `auto` is bfloat16 on CUDA (float16 where bf16 is unsupported) and float32 on CPU. On a CPU with
    AVX512-BF16, bfloat16 generated 1.5-2x faster in our measurements, but its greedy output then depends on
    which other prompts share the batch (rounding differs with padding); float32 keeps a request's output
    independent of its batch, which the call cache and resumed runs rely on. Ask for `bfloat16` explicitly for
    throughput.

    Raises:
        ConfigError: for a dtype name other than auto, bfloat16, float16, float32.
    """
    import torch

    check_dtype(dtype)
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def device_map(option: str, device: str) -> str | None:
    """The `device_map` a model loads with (`option`: the `device` option; `device`: `pick_device`'s answer).

    None off CUDA (the model is then moved to `device`); for `device=auto` on a machine with several visible GPUs,
    `balanced` (an even split over the GPUs, as the plan assumes: `harness.plan.engine_devices` counts such a
    model on every device, with its weights / devices on each; see `hf_placement`; `sequential`, used before,
    filled GPU 0 first); else the device itself
    (`cuda`, `cuda:N`: one GPU; pin a small model with `cuda:0` to keep it off the other GPUs).
    """
    import torch

    if not device.startswith("cuda"):
        return None
    if option == "auto" and torch.cuda.device_count() > 1:
        return "balanced"
    return device


def even_max_memory(devices: int, share_gib: float) -> dict[int, int]:
    """transformers' `max_memory` for a model the plan spreads over `devices` GPUs with `share_gib` on each
    (`harness.plan.LocalModel.per_device_gib`: its weights / devices plus the plan's allowance)."""
    return {i: int(share_gib * 2**30) for i in range(devices)}


def hf_placement(option: str, device: str, *, max_memory: dict[int, int] | None = None) -> dict[str, Any]:
    """The placement keywords of `from_pretrained`: {} off CUDA (the caller moves the model to `device`),
    `device_map` (`device_map`), and with `balanced` the plan's `max_memory` where it gave one
    (`even_max_memory`), for the devices visible here.

    How transformers 5.25 places with these (`transformers/integrations/accelerate.py`): `sequential` (the old
    choice) only reads each GPU's free memory (`_get_device_map`, lines 353-362) and fills GPU 0 first, so the
    first model loaded took GPU 0 and a neighbour sized for an even split found it full. `balanced` takes
    `get_balanced_memory` (lines 242-337): every GPU but the last is capped at the model's size / GPUs plus
    1.25 x its largest unsplittable layer or leaf tensor (lines 300-331), each cap no more than the `max_memory`
    given (line 331), and the layers fill the GPUs in order up to their caps: no GPU holds more than the plan's
    share, and the first GPUs hold about size / GPUs plus that buffer each (a model whose layers are coarse
    against that leaves the last GPU lighter). A given `max_memory` is taken as it is (accelerate reads free
    memory only when none is given, `accelerate/utils/modeling.py:811-831`; transformers adds only its
    allocator's unused cache, line 229), so each device's share is capped here at what is free on it. A
    `max_memory` without `cpu` or `disk` keys offers no host memory (`accelerate/utils/modeling.py:841`):
    weights beyond it go to `disk` (transformers' `_init_infer_auto_device_map`, line 601), which
    `check_placed` refuses.
    """
    placement = device_map(option, device)
    if placement is None:
        return {}
    if placement != "balanced" or not max_memory:
        return {"device_map": placement}
    import torch

    visible = torch.cuda.device_count()
    capped = {d: min(v, torch.cuda.mem_get_info(d)[0]) for d, v in max_memory.items() if d < visible}
    return {"device_map": placement, "max_memory": capped}


def check_placed(model: Any, name: str) -> None:
    """Refuse a model transformers placed partly off the GPUs (`hf_device_map` naming `cpu` or `disk`): it would
    run, many times slower, on whatever memory was left.

    Raises:
        BackendUnavailableError: naming how many modules went where.
    """
    placed = getattr(model, "hf_device_map", None) or {}
    off = [str(v) for v in placed.values() if str(v) in ("cpu", "disk")]
    if off:
        counts = ", ".join(f"{off.count(v)} to {v}" for v in sorted(set(off)))
        raise BackendUnavailableError(
            f"{name} does not fit its GPUs: of its {len(placed)} placed modules, {counts}; give it more devices, "
            "serve it, or leave it more memory (devices: kv_cache, usable)"
        )


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where to load from and what identifies the weights."""

    path: str
    """A local checkpoint folder or a hub repo id."""
    revision: str | None
    """The hub commit to load (resolved from the requested revision; None for local folders)."""
    identity: dict[str, str]
    """The model's identity (`BaseBackend.identity`): kind, model, and the weights' fingerprint or hub commit."""
    hub: bool


def locate_model(name: str, *, kind: str) -> ModelSource:
    """Classify `name` as a GGUF file, a local folder or a hub id (`repo@revision`) and identify its weights.

    Nothing is loaded: a local checkpoint is fingerprinted (`weights_fingerprint`; a GGUF file is converted once),
    a hub id is resolved to a commit (`hub_commit`), so the identity is known, and stable, before any weights load.

    Args:
        name: What followed `KIND:` in the spec.
        kind: The backend kind, written into the identity.

    Raises:
        ModelNotFoundError: for a local path that does not exist or is not a checkpoint folder or `.gguf` file,
            or a hub id that is neither cached nor (online) on the hub.
    """
    from harness.backends.models import convert_gguf, weights_fingerprint

    expanded = Path(name).expanduser()
    looks_local = (
        expanded.exists()
        or name.lower().endswith(".gguf")
        or name.startswith(("/", ".", "~"))
        or (os.sep != "/" and os.sep in name)
    )
    if looks_local:
        if not expanded.exists():
            raise ModelNotFoundError(f"hf model path not found: {expanded}")
        weights = weights_fingerprint(expanded)
        if expanded.is_file():
            if expanded.suffix.lower() != ".gguf":
                raise ModelNotFoundError(
                    f"hf model {expanded} is a file but not a .gguf; give a checkpoint folder"
                )
            path = convert_gguf(expanded)
        else:
            if not (expanded / "config.json").is_file():
                raise ModelNotFoundError(f"hf model folder {expanded} has no config.json")
            path = expanded
        return ModelSource(str(path), None, {"kind": kind, "model": name, "weights": weights}, hub=False)
    repo, _, revision = name.partition("@")
    commit = hub_commit(repo, revision or None)
    return ModelSource(repo, commit, {"kind": kind, "model": repo, "revision": commit}, hub=True)


def hub_commit(repo: str, revision: str | None) -> str:
    """The commit a hub id names: the locally cached snapshot's, else (online) the hub's answer.

    Raises:
        ModelNotFoundError: when the model is not cached and the hub is offline, or the hub does not know it.
    """
    import huggingface_hub

    shown = f"{repo}@{revision}" if revision else repo
    try:
        found = huggingface_hub.try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception:  # an invalid repo id, say: the hub look-up below names the problem
        found = None
    if isinstance(found, str):
        parts = Path(found).parts
        if "snapshots" in parts:
            return parts[parts.index("snapshots") + 1]
    if revision and len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    if huggingface_hub.is_offline_mode():
        raise ModelNotFoundError(
            f"model {shown!r} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE=1)"
        )
    try:
        info = huggingface_hub.HfApi().model_info(repo, revision=revision)
    except Exception as exc:  # unknown repo, gated, no network
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"cannot find model {shown!r} on the Hugging Face hub: {first}") from None
    return str(info.sha)


def encode_contexts(
    request: LogprobRequest, prompt: Callable[..., tuple[list[int] | None, Failure | None]]
) -> tuple[list[list[int]], Failure | None]:
    """Token ids of every context of `request` (see `LogprobRequest.contexts`), or the first failure of
    `prompt(messages, assistant_prefix)` (the backend's renderer with its context check)."""
    encoded = []
    for context in request.contexts():
        ids, failure = prompt(context, request.assistant_prefix)
        if failure is not None:
            return [], failure
        encoded.append(ids)
    return encoded, None  # type: ignore[return-value]


def answer_span(
    tokenizer: Any, gen: Sequence[int], eos_ids: Iterable[int], stops: Sequence[str], *, plain: bool
) -> tuple[list[int], int, str, int]:
    """The answer a row of generated ids `gen` stands for: `(ids, n_tokens, text, start)`.

    `ids` are the ids before the first end-of-sequence id, `n_tokens` how many were generated (the end-of-sequence
    id counts), `text` their decode (`skip_special_tokens`) cut at the earliest stop string, and `start` where the
    answer begins in that decode. Without a chat template (`plain`) the separators around `Assistant:` belong to the
    rendering, so the text is stripped and `start` skips its leading whitespace. The `hf` and `vllm` backends both
    read their rows through this, so the same ids give the same text (vLLM's own detokenizer keeps a Metaspace
    tokenizer's leading space, a lone decode drops it).
    """
    ids, n_tokens = list(gen), len(gen)
    eos = set(eos_ids)
    for k, t in enumerate(ids):
        if t in eos:
            ids, n_tokens = ids[:k], k + 1
            break
    text = cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), stops)
    start = 0
    if plain:
        start = len(text) - len(text.lstrip())
        text = text.strip()
    return ids, n_tokens, text, start


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        if s:
            k = text.find(s)
            if k != -1:
                cut = min(cut, k)
    return text[:cut]


# ------------------------------------------------------------------------------------------------------------
# Reward models

CLASSIFIER_SUFFIX = "ForSequenceClassification"
CAUSAL_SUFFIX = "ForCausalLM"


def is_sequence_classifier(config: dict) -> bool:
    """Whether a checkpoint's config (its config.json as a dict) names a sequence-classification architecture."""
    return any(str(a).endswith(CLASSIFIER_SUFFIX) for a in config.get("architectures") or [])


def check_score_head(config: dict, head: str, *, model: str) -> None:
    """Refuse a checkpoint that does not fit `head` (see `ScoreRequest.head`), from its config alone.

    A classifier head needs a `*ForSequenceClassification` checkpoint with one label: transformers would
    otherwise attach a randomly initialised head and return noise. `lm-token0` needs a `*ForCausalLM` one (a
    config naming no architecture passes).

    Args:
        config: The checkpoint's config.json as a dict.
        head: `classifier` or `lm-token0`.
        model: How messages name the model (`hf model '/ckpt'`).

    Raises:
        ConfigError: naming the checkpoint's architectures and what the head needs.
    """
    archs = [str(a) for a in config.get("architectures") or []]
    if head == "classifier":
        if not is_sequence_classifier(config):
            what = f"a {'/'.join(archs)} checkpoint" if archs else "a checkpoint whose config names no architecture"
            raise ConfigError(
                f"{model} is {what}, not a *{CLASSIFIER_SUFFIX} one as head=classifier needs "
                "(a causal-LM reward model such as Nemotron-70B-Reward-HF needs head=lm-token0)"
            )
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 1
        if labels != 1:
            raise ConfigError(f"{model} has num_labels={labels}; a scalar reward model needs 1")
    elif archs and not any(a.endswith(CAUSAL_SUFFIX) for a in archs):
        raise ConfigError(
            f"{model} is a {'/'.join(archs)} checkpoint, not a *{CAUSAL_SUFFIX} one as head={head} needs"
        )


def check_source_head(source: ModelSource, head: str, *, model: str) -> None:
    """`check_score_head` on a located model's config.json, loading nothing; a hub checkpoint whose config is not
    in the local cache passes (the backend checks it when the model loads)."""
    config = read_model_config(source.path, source.revision)
    if config is not None:
        check_score_head(config, head, model=model)


def not_generative(model: str, config: dict) -> ConfigError:
    """The error of asking a sequence classifier (a reward model) to generate or give next-token logprobs."""
    archs = "/".join(str(a) for a in config.get("architectures") or [])
    return ConfigError(
        f"{model} is a {archs} checkpoint: a reward model scores conversations (`scalar-rm`) but cannot generate "
        "text or next-token logprobs"
    )


def read_model_config(path: str, revision: str | None) -> dict | None:
    """A checkpoint's config.json (a local folder's, or a hub id's from the local cache), or None when it cannot be
    read without downloading."""
    local = Path(path) / "config.json"
    if local.is_file():
        target = local
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, "config.json", revision=revision)
        except Exception:  # an invalid repo id, say: loading names the problem
            return None
        if not isinstance(found, str):
            return None
        target = Path(found)
    try:
        return json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def render_turns(messages: Sequence[Message]) -> str:
    """A whole conversation as plain text for tokenizers without a chat template: `Role: content` turns separated
    by blank lines (`User: {prompt}\\n\\nAssistant: {response}`)."""
    return "\n\n".join(f"{m.role.capitalize()}: {m.content}" for m in messages)


def encode_scored(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of a conversation ending in the turn to score (see `ScoreRequest`).

    With a chat template: `apply_chat_template(..., add_generation_prompt=False)`, tokenized without special
    tokens. Without one: `render_turns`, tokenized with special tokens.
    """
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            chat_to_json(messages), tokenize=False, add_generation_prompt=False
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(render_turns(messages), add_special_tokens=True))


def truncate_left(ids: list[int], max_length: int, bos_id: int | None) -> list[int]:
    """The last `max_length` tokens of `ids`, keeping a leading BOS in front when `ids` starts with one."""
    if len(ids) <= max_length:
        return ids
    if bos_id is not None and ids and ids[0] == bos_id and max_length > 1:
        return [ids[0], *ids[len(ids) - max_length + 1 :]]
    return ids[len(ids) - max_length :]


def score_ids(
    tokenizer: Any, request: ScoreRequest, context_length: int | None
) -> tuple[list[int], int] | Failure:
    """The ids a reward model sees for `request` (cut to `max_length`, clamped to `context_length`) and the
    rendered conversation's length before the cut; or the failure of a conversation that cannot be rendered."""
    try:
        ids = encode_scored(tokenizer, request.messages)
    except Exception as exc:  # e.g. a template that rejects the conversation
        return backend_failure(f"cannot render the conversation: {type(exc).__name__}: {exc}")
    limit = min(request.max_length, context_length) if context_length else request.max_length
    return truncate_left(ids, limit, tokenizer.bos_token_id), len(ids)


def score_result(value: float, tokens: int, kept: int) -> ScoreResult:
    """The result of a logit: the score, or a failure for a non-finite one."""
    if not math.isfinite(value):
        return ScoreResult(None, tokens, kept, error=backend_failure(f"the reward model returned {value}"))
    return ScoreResult(value, tokens, kept)
