"""A fault-injecting handler for the loopback OpenAI-compatible server (shared by backend and CLI tests)."""

from __future__ import annotations

import asyncio
import collections
import json
import threading

from harness.backends.openai_backend import PREFILL_PROBE, PROBE_QUESTION, SHORT_PROBE
from harness.errors import FailureCategory
from harness.loopback import DROP, Action, Handler, HttpRequest, HttpResponse, chat_completion, json_response

KEY_ENV = "HARNESS_TEST_OPENAI_KEY"
KEY = "sk-test-DISTINCTIVE-secret-0123456789"


def last_user_text(request: HttpRequest) -> str:
    return request.json()["messages"][-1]["content"]


PROBE_TEXTS = {PROBE_QUESTION, SHORT_PROBE, PREFILL_PROBE[0], "".join(PREFILL_PROBE)}


def is_probe(body: dict) -> bool:
    """Whether a request body is one of the openai backend's capability probes (not a request of the test)."""
    return body["messages"][0]["content"] in PROBE_TEXTS


def asked(bodies: list[dict]) -> list[dict]:
    """The request bodies a test sent, capability probes left out."""
    return [b for b in bodies if not is_probe(b)]


# -- faults --------------------------------------------------------------------------------------------------

FAULT_KINDS = ("rate_limit", "server_error", "drop", "hang", "malformed")
ALWAYS = {
    "always-500": FailureCategory.SERVER_ERROR,
    "always-drop": FailureCategory.CONNECTION,
    "always-hang": FailureCategory.TIMEOUT,
    "always-malformed": FailureCategory.MALFORMED_RESPONSE,
    "always-400": FailureCategory.BAD_REQUEST,
}


class FaultyServer:
    """A handler that fails attempts by a fixed schedule and counts what it did.

    `req-i` fails its first attempt with fault `i % 10` (0-4, see FAULT_KINDS; 5-9 pass), and `req-i` with
    `i % 20 == 1` fails its second attempt with a 500 as well. `always-*` requests fail every attempt. Error
    bodies echo the Authorization header, as careless servers do, so the client must scrub the key.
    """

    def __init__(self) -> None:
        self.attempts: collections.Counter[str] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()
        self.answered: collections.Counter[str] = collections.Counter()

    def fault_for(self, rid: str, attempt: int) -> str | None:
        if rid.startswith("always-"):
            return {
                "500": "server_error",
                "drop": "drop",
                "hang": "hang",
                "malformed": "malformed",
                "400": "bad",
            }[rid.removeprefix("always-")]
        i = int(rid.removeprefix("req-"))
        if attempt == 1 and i % 10 < len(FAULT_KINDS):
            return FAULT_KINDS[i % 10]
        if attempt == 2 and i % 20 == 1:
            return "server_error"
        return None

    async def __call__(self, request: HttpRequest):
        rid = last_user_text(request)
        self.attempts[rid] += 1
        fault = self.fault_for(rid, self.attempts[rid])
        if fault is None:
            self.answered[rid] += 1
            return json_response(chat_completion([f"answer:{rid}"]))
        self.faults[fault] += 1
        echo = {"error": {"message": f"failed; you sent {request.headers.get('authorization')}"}}
        if fault == "rate_limit":
            return json_response(echo, status=429, headers=(("Retry-After", "0"),))
        if fault == "server_error":
            return json_response(echo, status=500)
        if fault == "bad":
            return json_response(echo, status=400)
        if fault == "drop":
            return DROP
        if fault == "hang":
            await asyncio.Event().wait()  # never answers (the client times out); cancelled on close
        return HttpResponse(status=200, body=b'{"choices": [{"message": ')  # malformed: cut-off JSON


# -- a gate the test opens -----------------------------------------------------------------------------------


def is_asked(request: HttpRequest) -> bool:
    """Whether a request is a chat completion a test asked for (not a model list, not a capability probe)."""
    if request.method != "POST" or not request.path.endswith("/chat/completions"):
        return False
    try:
        return not is_probe(request.json())
    except (ValueError, KeyError, IndexError, TypeError):
        return True


class Gate:
    """Wraps a handler: the first `let_through` asked requests reach it, the rest wait till the test opens it.

    A test that must act while a client is mid-run (start a second writer, kill it, interrupt it) lets a few
    answers through, waits for them to be saved, and acts: the client cannot finish before the gate opens,
    however slow the machine. Model lists and capability probes always pass. `open()` lets every waiting
    request through; `open(drop_held=True)` closes their connections instead (their client is gone, and an
    answer to it would only show up in the wrapped handler's counts).
    """

    def __init__(self, handler: Handler, *, let_through: int = 0) -> None:
        self.handler = handler
        self.let_through = let_through
        self.passed = 0
        """Asked requests handed to the wrapped handler so far."""
        self._lock = threading.Lock()
        self._is_open = False
        self._drop_held = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened: asyncio.Event | None = None  # lives on the server's loop

    def open(self, *, drop_held: bool = False) -> None:
        """Let every request through from now on (from any thread); waiting ones pass, or are dropped."""
        with self._lock:
            if self._is_open:
                return
            self._is_open, self._drop_held = True, drop_held
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._opened.set)

    async def __call__(self, request: HttpRequest) -> HttpResponse | Action:
        if not is_asked(request):
            return await self.handler(request)
        with self._lock:
            held = not self._is_open and self.passed >= self.let_through
            if held and self._opened is None:
                self._loop, self._opened = asyncio.get_running_loop(), asyncio.Event()
            if not held:
                self.passed += 1
        if held:
            await self._opened.wait()
            if self._drop_held:
                return DROP
            with self._lock:
                self.passed += 1
        return await self.handler(request)


# -- a server with the gaps of a real one ----------------------------------------------------------------------


def chatml_prompt_tokens(messages: list[dict]) -> int:
    """Prompt tokens as a ChatML template renders `messages` with the generation prompt: per message
    `<|im_start|>`, the role, a newline, the content's words and `<|im_end|>`, a newline; then
    `<|im_start|>assistant` and a newline."""
    return sum(5 + len(m["content"].split()) for m in messages) + 3


class LlamaCppLikeServer:
    """A loopback chat server with the gaps a real one showed (llama-cpp-python 0.3.36 serving a GGUF model).

    - `response_format` `json_schema` is refused with HTTP 500; `{"type": "json_object", "schema": ...}` is
      honoured; unknown fields (`structured_outputs`, `guided_*`, `continue_final_message`) are ignored.
    - `n` is ignored: one choice, always.
    - A trailing assistant message is taken as a finished turn: the prompt is counted with a new generation prompt
      after it (`chatml_prompt_tokens`), and the answer starts a new turn.
    - `seed`, `top_logprobs`, `min_tokens` (the answer is counted as at least that long) and a GBNF `grammar`
      are honoured (under a grammar the "model" writes the first string it allows, `gbnf_first_string`).

    Its "model" answers by the request: a rubric under a schema; an answer sheet (a user turn listing
    `Criteria:`) with one `N: yes|no` line per criterion (yes for odd N), which after an ignored prefill `1:`
    carries on at `2:` as the real model did; a one-word verdict for a single criterion; otherwise
    `sample seed=<seed>`. With `logprobs`, the first token's alternatives rank `Yes`, then `No`, then fillers.
    """

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def __call__(self, request: HttpRequest):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": [{"id": "smollm2", "object": "model"}]})
        body = request.json()
        self.bodies.append(body)
        fmt = body.get("response_format") or {}
        if fmt.get("type") not in (None, "text", "json_object"):
            message = "1 validation error: response_format.type: Input should be 'text' or 'json_object'"
            return json_response({"error": {"message": message}}, status=500)
        messages = body["messages"]
        if "grammar" in body:
            text = gbnf_first_string(body["grammar"])
        else:
            text = self._answer(messages, schema="schema" in fmt, seed=body.get("seed"))
        top = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
        answer = chat_completion([text])
        if top:
            ranked = [("Yes", -0.2), ("No", -1.8)] + [(f"tok{i}", -5.0 - i) for i in range(top)]
            first = {"token": ranked[0][0], "logprob": ranked[0][1],
                     "top_logprobs": [{"token": t, "logprob": v} for t, v in ranked[:top]]}
            answer["choices"][0]["logprobs"] = {"content": [first]}
        answer["usage"]["prompt_tokens"] = chatml_prompt_tokens(messages)
        answer["usage"]["completion_tokens"] = max(len(text.split()), int(body.get("min_tokens") or 0))
        return json_response(answer)

    @staticmethod
    def _answer(messages: list[dict], *, schema: bool, seed) -> str:
        if schema:
            return '[{"criterion": "Is it correct?", "weight": 3}]'
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        prefilled = messages[-1]["role"] == "assistant"
        if "Criteria:\n" in user:
            criteria = user.split("Criteria:\n", 1)[1].split("\n\n", 1)[0].splitlines()
            first = 2 if prefilled and messages[-1]["content"].strip() == "1:" else 1
            return "\n".join(f"{i}: {'yes' if i % 2 else 'no'}" for i in range(first, len(criteria) + 1))
        if "\nCriterion: " in user:
            return "Yes"
        return f"sample seed={seed}"


def gbnf_first_string(grammar: str) -> str:
    """The first string a one-rule GBNF grammar of literals, groups, `|` and `?` allows: the first branch of
    every alternation, every optional part included (what `gbnf_grammar` writes for choices and answer sheets)."""
    import re

    body = grammar.split("::=", 1)[1]
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[()|?]', body)
    pos = 0

    def alternation() -> str:
        nonlocal pos
        first = sequence()
        while pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            sequence()
        return first

    def sequence() -> str:
        nonlocal pos
        out = ""
        while pos < len(tokens) and tokens[pos] not in "|)":
            token = tokens[pos]
            pos += 1
            if token == "(":
                out += alternation()
                pos += 1  # ")"
            elif token != "?":
                out += json.loads(token)
        return out

    return alternation()
