"""A fault-injecting handler for the loopback OpenAI-compatible server (shared by backend and CLI tests)."""

from __future__ import annotations

import asyncio
import collections

from harness.errors import FailureCategory
from harness.loopback import DROP, HttpRequest, HttpResponse, chat_completion, json_response

KEY_ENV = "HARNESS_TEST_OPENAI_KEY"
KEY = "sk-test-DISTINCTIVE-secret-0123456789"


def last_user_text(request: HttpRequest) -> str:
    return request.json()["messages"][-1]["content"]


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
            await asyncio.sleep(5)  # far past the client's 0.5 s timeout; cancelled when the server closes
            return json_response(chat_completion(["too late"]))
        return HttpResponse(status=200, body=b'{"choices": [{"message": ')  # malformed: cut-off JSON


