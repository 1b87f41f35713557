"""Disk faults for subprocess tests: imported first, it makes writes under a folder fail as the OS fails them.

    HARNESS_TEST_FAULT_DIR      the folder whose files fail
    HARNESS_TEST_FAULT_ERRNO    EROFS, ENOSPC, EACCES, ... (the OSError raised)
    HARNESS_TEST_FAULT_AFTER    0: opening a file there for writing fails (a read-only disk); N > 0: writes to
                                `*.jsonl` files there fail once N bytes went into them (a disk that fills up)

Running as root ignores permission bits and a test cannot rely on mounting a small filesystem, so the fault is
raised where the OS would raise it: by `open` and by `write`, with the errno and message the OS gives.
"""

from __future__ import annotations

import builtins
import errno
import io
import os

_DIR = os.path.abspath(os.environ["HARNESS_TEST_FAULT_DIR"])
_ERRNO = getattr(errno, os.environ.get("HARNESS_TEST_FAULT_ERRNO", "ENOSPC"))
_AFTER = int(os.environ.get("HARNESS_TEST_FAULT_AFTER", "0"))
_real_open = io.open
_written = 0


def _fault(path: str) -> OSError:
    return OSError(_ERRNO, os.strerror(_ERRNO), path)


class _FillingFile:
    """A file whose writes fail once the shared byte budget is spent."""

    def __init__(self, fh, path: str) -> None:
        self._fh, self._path = fh, path

    def write(self, data):
        global _written
        size = len(data.encode() if isinstance(data, str) else data)
        if _written + size > _AFTER:
            raise _fault(self._path)
        _written += size
        return self._fh.write(data)

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def _open(file, mode="r", *args, **kwargs):
    if isinstance(file, int) or not any(c in mode for c in "wax+"):
        return _real_open(file, mode, *args, **kwargs)
    path = os.path.abspath(os.fspath(file))
    if not path.startswith(_DIR + os.sep):
        return _real_open(file, mode, *args, **kwargs)
    if _AFTER == 0:
        raise _fault(path)
    fh = _real_open(file, mode, *args, **kwargs)
    return _FillingFile(fh, path) if path.endswith(".jsonl") else fh


io.open = builtins.open = _open
