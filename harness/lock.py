"""An exclusive lock per output, so that two processes never write one output at once.

The lock is an advisory `flock` on a small file beside the output (`out.jsonl.lock`, or `lock` inside a run
directory) that holds the holder's pid, host, command and start time, so a second writer is told who holds it.
The operating system drops the lock when its process ends, also after `kill -9`, so a stale lock never blocks a
rerun. The file itself is left in place: deleting a lock file while another process waits on it would let two
processes hold "the" lock at once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO

from harness.errors import HarnessError
from harness.redact import redact

try:  # POSIX
    import fcntl

    def _try_lock(fh: IO[str], *, block: bool) -> bool:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def _unlock(fh: IO[str]) -> None:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

except ImportError:  # pragma: no cover - Windows
    import msvcrt

    def _try_lock(fh: IO[str], *, block: bool) -> bool:
        while True:
            try:
                fh.seek(0)
                msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not block:
                    return False
                time.sleep(0.2)

    def _unlock(fh: IO[str]) -> None:
        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)


class OutputBusyError(HarnessError):
    """Another process holds the output's lock."""


class OutputLock:
    """The exclusive write lock of one output.

    Args:
        path: The lock file.
        what: The output as the user named it (for messages).
    """

    def __init__(self, path: Path, *, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._fh: IO[str] | None = None

    def acquire(self, *, wait: bool = False) -> None:
        """Take the lock, or wait for it with `wait`.

        Raises:
            OutputBusyError: naming the holder, when another process holds it and `wait` is false.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+", encoding="utf-8")
        try:
            if not _try_lock(fh, block=False):
                holder = self.holder()
                if not wait:
                    raise OutputBusyError(
                        f"{self.what} is being written by another harness process ({holder}); wait for it to "
                        "finish, or rerun with --wait"
                    )
                print(f"waiting for {self.what}: held by {holder}", file=sys.stderr, flush=True)
                _try_lock(fh, block=True)
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(self._me()) + "\n")
            fh.flush()
        except BaseException:
            fh.close()
            raise
        self._fh = fh

    def holder(self) -> str:
        """Who holds the lock, as recorded in the lock file ("pid 123 on host, harness run ..., since ...")."""
        try:
            info = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            info = {}
        if not info.get("pid"):
            return "a process that has not written its pid yet"
        return f"pid {info['pid']} on {info.get('host', '?')}, `{info.get('command', '?')}`, since {info.get('since', '?')}"

    def live_holder(self) -> str | None:
        """Who is writing the output now, without touching the lock (a reader must never make a writer fail):
        the holder recorded in the lock file when its process is alive on this host, else None."""
        try:
            info = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return None
        pid = info.get("pid")
        if not isinstance(pid, int) or info.get("host") != socket.gethostname():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # killed without releasing: the lock died with it
        except PermissionError:
            pass  # alive, another user's
        return self.holder()

    def release(self) -> None:
        if self._fh is None:
            return
        try:
            self._fh.seek(0)
            self._fh.truncate()
            _unlock(self._fh)
        finally:
            self._fh.close()
            self._fh = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    @staticmethod
    def _me() -> dict[str, object]:
        argv = " ".join(redact(["harness", *sys.argv[1:]]))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        return {"pid": os.getpid(), "host": socket.gethostname(), "command": argv, "since": since}
