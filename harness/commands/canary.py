"""`harness compare`'s drift canary: are the models the two runs share still the models BASE_RUN asked?

The gate compares model identities: a revision or weights hash for a local model, only the name for a model behind
an API. A provider that updates a model under the same name, or a server restarted with other weights under the
same served name, would make the runs incomparable without the identity showing it. So the canary re-asks a fixed,
seeded sample of the requests BASE_RUN sent to the models both runs share with the same identity (the verifier, a
policy table's judge: what the gate holds fixed), bypassing the call cache, and measures agreement with the answers
BASE_RUN's `calls.sqlite` stored:

- a generation agrees when its text is the stored one (case and whitespace aside) or, for a judge that explains
  before its `[[...]]` label, when the last label is the same; only greedy requests (temperature 0) are re-asked,
  since a sample cannot be matched one for one;
- a next-token read (`logprob` verification, AlpacaEval's judge) agrees when every context ranks the same candidate
  first; the mean absolute difference of the candidates' log-probabilities is reported beside it.

Below `canary_min_agreement` (compare's config; default 0.9: the embedded model on `hf` re-answers every one of
its greedy requests alike, and a served model at temperature 0 should agree on nearly all short verdicts), the runs
are not comparable: the gate exits 2 naming the model, its agreement and a few requests that differ. Models
identified by weights are left out unless `--canary-local` (their identity already pins them). The canary's calls
are counted and shown. `--canary 0` skips it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.calllog import CALLS_FILE
from harness.errors import HarnessError

DEFAULT_REQUESTS = 32
"""Requests re-asked per comparison (`--canary N`)."""
SHOWN = 3
"""Differing requests named per model."""
_LABEL = re.compile(r"\[\[([^\[\]]{1,40})\]\]")
OPS = ("generate", "next_token_logprobs")


@dataclass(slots=True)
class ModelCanary:
    """One shared model's re-asked requests."""

    spec: str
    identity: dict[str, Any]
    asked: int = 0
    agreed: int = 0
    failed: int = 0
    """Re-asks the model did not answer (not counted as disagreements; a failure of the backend)."""
    logprob_diff: float | None = None
    """Mean absolute difference of the candidates' log-probabilities (next-token reads only)."""
    differing: list[str] = field(default_factory=list)
    """Up to `SHOWN` requests that differ: their start, the stored answer and today's."""

    @property
    def agreement(self) -> float | None:
        answered = self.asked - self.failed
        return self.agreed / answered if answered else None


@dataclass(slots=True)
class CanaryResult:
    """What the canary did: per shared model, or why it did nothing."""

    requests: int
    """Requests asked for (`--canary N`)."""
    threshold: float
    models: list[ModelCanary] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Why a model or the whole canary was left out."""
    unreached: list[str] = field(default_factory=list)
    """Shared models that could not be built or reached, each with the error: nothing was checked for them."""

    @property
    def calls(self) -> int:
        return sum(m.asked for m in self.models)

    def problems(self) -> list[str]:
        """The differences that make the runs incomparable: a model below the threshold."""
        found = []
        for m in self.models:
            if m.agreement is not None and m.agreement < self.threshold:
                shown = "; ".join(m.differing)
                found.append(f"drift canary: {m.spec} answered {m.agreed} of {m.asked - m.failed} re-asked requests "
                             f"of BASE_RUN as it stored them ({m.agreement:.0%} < {self.threshold:.0%}): the model "
                             f"behind the name may have changed since BASE_RUN ran; differing: {shown}")
        return found

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "threshold": self.threshold, "calls": self.calls,
                "skipped": self.skipped, "unreached": self.unreached,
                "models": [{**asdict(m), "agreement": m.agreement} for m in self.models]}


def _shared(base: Mapping[str, Any], cand: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Spec -> identity of the models both runs call with the same identity (what the gate holds fixed)."""
    b = (base.get("settings") or {}).get("models") or {}
    c = (cand.get("settings") or {}).get("models") or {}
    return {spec: dict(identity) for spec, identity in b.items() if c.get(spec) == identity}


def pinned(identity: Mapping[str, Any]) -> bool:
    """Whether an identity pins the weights (a local model's hash or a hub revision)."""
    return bool(identity.get("weights") or identity.get("revision"))


def _stored_requests(path: Path, shared: Mapping[str, Mapping[str, Any]]) -> dict[str, list[tuple[str, str, dict,
                                                                                                   Any]]]:
    """Spec -> (key, op, payload, stored value) of each `shared` model's deterministic requests in a run's
    calls.sqlite, read in one pass."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT r.key, r.identity, r.op, r.payload, c.value FROM requests r "
                            "JOIN calls c ON c.key = r.key WHERE r.sample = 0 ORDER BY r.key").fetchall()
    finally:
        conn.close()
    by_identity = {json.dumps(dict(identity), sort_keys=True): spec for spec, identity in shared.items()}
    found: dict[str, list[tuple[str, str, dict, Any]]] = {}
    for key, who, op, payload, value in rows:
        spec = by_identity.get(json.dumps(json.loads(who), sort_keys=True)) if op in OPS else None
        if spec is None:
            continue
        body = json.loads(payload)
        if op == "generate" and (body.get("temperature") or 0) != 0:
            continue
        found.setdefault(spec, []).append((key, op, body, json.loads(value)))
    return found


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def _text(stored: Any) -> str:
    return stored if isinstance(stored, str) else str((stored or {}).get("text", ""))


def _same_text(stored: str, now: str) -> bool:
    if _norm(stored) == _norm(now):
        return True
    a, b = _LABEL.findall(stored), _LABEL.findall(now)
    return bool(a) and bool(b) and _norm(a[-1]) == _norm(b[-1])


def _start(payload: Mapping[str, Any], limit: int = 50) -> str:
    messages = payload.get("messages") or []
    text = " ".join(str(messages[-1]["content"] if messages else "").split())
    return json.dumps(text if len(text) <= limit else text[:limit] + "...", ensure_ascii=False)


def _generate_request(payload: Mapping[str, Any]) -> Any:
    from harness.backends.base import Constraint, GenerateRequest, Message, SamplingParams

    constraint = payload.get("constraint")
    params = SamplingParams(temperature=0.0, top_p=payload.get("top_p", 1.0), max_tokens=payload["max_tokens"],
                            stop=tuple(payload.get("stop") or ()), logprobs=payload.get("logprobs") or 0,
                            min_tokens=payload.get("min_tokens", 0),
                            constraint=Constraint(**constraint) if constraint else None)
    return GenerateRequest(tuple(Message(m["role"], m["content"]) for m in payload["messages"]), params,
                           payload.get("prefix", ""))


def _logprob_request(payload: Mapping[str, Any]) -> Any:
    from harness.backends.base import LogprobRequest, Message

    return LogprobRequest(tuple(Message(m["role"], m["content"]) for m in payload["messages"]),
                          payload.get("prefix", ""), tuple(payload.get("branches") or ()))


def _read_agrees(stored: Any, now: Sequence[Mapping[str, float]]) -> tuple[bool, list[float]]:
    """Whether every context ranks the same candidate first, and the absolute differences of the candidates'
    log-probabilities where both are finite."""
    before = stored if isinstance(stored, list) else [stored]
    agree, diffs = len(before) == len(now), []
    for old, new in zip(before, now):
        old = {k: -math.inf if v is None else float(v) for k, v in old.items()}
        if max(old, key=old.get) != max(new, key=new.get):  # type: ignore[arg-type]
            agree = False
        diffs += [abs(old[k] - new[k]) for k in old if k in new and math.isfinite(old[k]) and math.isfinite(new[k])]
    return agree, diffs


async def _reask(backend: Any, found: Sequence[tuple[str, str, dict, Any]], canary: ModelCanary) -> None:
    """Send `found`'s requests to `backend` (no cache) and tally the answers into `canary`."""
    diffs: list[float] = []
    gens = [f for f in found if f[1] == "generate"]
    if gens:
        answers = await backend.generate([_generate_request(p) for _, _, p, _ in gens])
        for (_, _, payload, stored), answer in zip(gens, answers):
            canary.asked += 1
            if not answer.ok:
                canary.failed += 1
            elif _same_text(_text(stored), answer.texts[0]):
                canary.agreed += 1
            elif len(canary.differing) < SHOWN:
                canary.differing.append(f"{_start(payload)}: stored {_text(stored)[:40]!r}, now "
                                        f"{answer.texts[0][:40]!r}")
    by_candidates: dict[tuple[str, ...], list] = {}
    for entry in found:
        if entry[1] == "next_token_logprobs":
            by_candidates.setdefault(tuple(entry[2]["candidates"]), []).append(entry)
    for candidates, entries in by_candidates.items():
        answers = await backend.next_token_logprobs([_logprob_request(p) for _, _, p, _ in entries], candidates)
        for (_, _, payload, stored), answer in zip(entries, answers):
            canary.asked += 1
            if not answer.ok:
                canary.failed += 1
                continue
            agree, d = _read_agrees(stored, list(answer.branches) if answer.branches else [answer.logprobs])
            diffs += d
            if agree:
                canary.agreed += 1
            elif len(canary.differing) < SHOWN:
                canary.differing.append(f"{_start(payload)}: stored {stored}, now "
                                        f"{answer.branches or answer.logprobs}")
    canary.logprob_diff = sum(diffs) / len(diffs) if diffs else None


def run_canary(base_dir: Path, base: Mapping[str, Any], cand: Mapping[str, Any], *, requests: int,
               threshold: float, local: bool = False, seed: int = 0) -> CanaryResult:
    """Re-ask up to `requests` of BASE_RUN's stored deterministic requests, spread over the models both runs
    share (see the module docstring), each model through a backend built from BASE_RUN's backend settings without
    the call cache.

    A model that cannot be built or reached (no server, no key) is left out and listed in `unreached` with the
    error: the canary then checks nothing for it, which compare.md and the printed lines say.
    """
    from harness.backends.base import BackendOptions
    from harness.config import backend_options
    from harness.pool import BackendPool

    result = CanaryResult(requests, threshold)
    path = Path(base_dir) / CALLS_FILE
    if requests <= 0:
        return result
    if not path.is_file():
        result.skipped.append(f"BASE_RUN has no {CALLS_FILE} (a run records its calls unless --no-cache): "
                              "nothing to re-ask")
        return result
    shared = _shared(base, cand)
    if not local:
        for spec in [s for s, identity in shared.items() if pinned(identity)]:
            del shared[spec]
            result.skipped.append(f"{spec}: identified by its weights (--canary-local re-asks it too)")
    stored = dict(sorted(_stored_requests(path, shared).items()))
    if not stored:
        result.skipped.append("no deterministic request of a shared model to re-ask")
        return result
    config = base.get("config") or {}
    options = backend_options({k: v for k, v in (config.get("backend") or {}).items()
                               if k in BackendOptions.__dataclass_fields__}, where="BASE_RUN's backend")
    judge = (base.get("settings") or {}).get("judge") or {}
    pool = BackendPool(options=options, cache=None)
    rng = random.Random(seed)
    share = max(1, requests // len(stored))
    picked = {spec: sorted(rng.sample(found, min(share, len(found))), key=lambda f: f[0])
              for spec, found in stored.items()}

    async def ask() -> None:
        try:
            for spec, found in picked.items():
                overrides = judge.get("options") if judge.get("model") == spec else None
                canary = ModelCanary(spec, shared[spec])
                try:
                    await _reask(pool.get(spec, overrides=overrides or None), found, canary)
                except HarnessError as exc:  # unreachable or unbuildable: the gate goes on, saying so
                    result.unreached.append(f"{spec}: {exc}")
                    continue
                result.models.append(canary)
        finally:
            await pool.close()

    asyncio.run(ask())
    return result


def check(result: Any, base_run: Path, cand_run: Path, *, requests: int, local: bool) -> None:
    """Run the canary for `harness compare`'s `result` (a `reports.compare.Comparison` of comparable runs; a figure
    of panels is left out) and add what it found: `result.canary`, and a difference per model below the threshold.
    """
    from harness.runstore import Manifest, OutputPaths
    from reports.panels import panels_of

    if requests <= 0 or not result.comparable:
        return
    if panels_of(base_run) is not None:
        result.canary = {"requests": requests, "calls": 0, "models": [],
                         "skipped": ["a figure of panels: run the canary on each panel's runs"]}
        return
    base = Manifest(OutputPaths.run_dir(Path(base_run)).manifest).read()
    cand = Manifest(OutputPaths.run_dir(Path(cand_run)).manifest).read()
    found = run_canary(Path(base_run), base, cand, requests=requests, local=local,
                       threshold=result.config.get("canary_min_agreement", 0.9), seed=result.config.get("seed", 0))
    result.canary = found.to_json()
    result.differences += found.problems()
