"""Merging concurrent calls of a batch operation, so a local engine sees one batch instead of many small ones.

The evaluation loop sends each unit's requests as its own call, many units at once; a local model (`hf`, `vllm`)
runs fastest on one large batch. `CallMerger` queues the calls that arrive while a batch runs and runs them
together as the next batch, handing every caller its own slice of the results (or the batch's exception).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")


class CallMerger(Generic[Req, Res]):
    """Runs `run(requests)` over the requests of every call pending at once; results are aligned per call."""

    def __init__(self, run: Callable[[list[Req]], Awaitable[list[Res]]]) -> None:
        self._run = run
        self._pending: list[tuple[list[Req], asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None

    async def __call__(self, requests: Sequence[Req]) -> list[Res]:
        if not requests:
            return []
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(requests), future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let callers that are starting right now join this round
            calls, self._pending = [c for c in self._pending if not c[1].done()], []  # callers cancelled: dropped
            if not calls:
                continue
            merged = [r for reqs, _ in calls for r in reqs]
            try:
                results = await self._run(merged)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                for _, future in calls:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            start = 0
            for reqs, future in calls:
                if not future.done():
                    future.set_result(results[start : start + len(reqs)])
                start += len(reqs)
