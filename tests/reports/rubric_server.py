"""A loopback OpenAI-compatible server that plays every model of a rubric table, told apart by the request's model
name: rubric generators write the rubric scripted for them, a verifier answers each criterion by `verdict`, a
policy answers a fixed text, an AlpacaEval judge prefers the first output. It counts the requests per model."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from harness.loopback import chat_completion, json_response

POLICY_ANSWER = "Here is a short answer with 3 steps."


def verdict(criterion: str, response: str) -> bool:
    """The scripted verifier's answer: `longer than N characters`, `shorter than N characters`, `contains a
    digit`, `mentions WORD`; any other criterion is met."""
    found = re.search(r"(longer|shorter) than (\d+) characters", criterion)
    if found:
        n = int(found.group(2))
        return len(response) > n if found.group(1) == "longer" else len(response) < n
    if "contains a digit" in criterion:
        return bool(re.search(r"\d", response))
    word = re.search(r"mentions (\w+)", criterion)
    if word:
        return word.group(1).lower() in response.lower()
    return True


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class RubricServer:
    """`rubrics`: generator model name -> [(criterion, weight)]."""

    def __init__(self, rubrics: dict[str, list[tuple[str, int]]]) -> None:
        self.rubrics = rubrics
        self.requests: Counter[str] = Counter()
        """Model name -> requests answered."""
        self.rubric_requests: dict[str, list[dict]] = {}
        """Generator model name -> each rubric request's body, in arrival order."""
        self._lock = threading.Lock()

    def count(self, model: str) -> int:
        with self._lock:
            return self.requests[model]

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        model = body.get("model")
        with self._lock:
            self.requests[model] += 1
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if "You are writing a grading rubric" in first:
            with self._lock:
                self.rubric_requests.setdefault(model, []).append(body)
            items = [{"criterion": c, "weight": w} for c, w in self.rubrics[model]]
            return json_response(chat_completion([json.dumps(items)]))
        if "Does the response meet this criterion?" in first:
            response = _between(first, "[Response]\n", "\n[End of Response]")
            said = verdict(_between(first, "Criterion: ", "\n"), response)
            return json_response(chat_completion(["Yes" if said else "No"]))
        if "[Output M]" in first:  # AlpacaEval's judge: the first output is better, P(m) = 0.8
            top = [{"token": "m", "logprob": math.log(0.8)}, {"token": "M", "logprob": math.log(0.2)}]
            return json_response(chat_completion(["m"], logprobs=[{"content": [
                {"token": "m", "logprob": math.log(0.8), "top_logprobs": top}]}]))
        if body.get("logprobs"):  # a probe of the server's logprobs
            top = [{"token": t, "logprob": math.log(0.5)} for t in ("yes", "no")]
            return json_response(chat_completion(["yes"], logprobs=[{"content": [
                {"token": "yes", "logprob": math.log(0.5), "top_logprobs": top}]}]))
        return json_response(chat_completion([POLICY_ANSWER]))


def harness(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` (a hang guard as its bound, never what passes)."""
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())
