"""A small file read without being fooled: a regular file only (a FIFO would block for ever, a
device such as /dev/zero never ends), opened non-blocking and checked on what was opened, and
never more than a stated number of bytes. One reading for secret files and SSH keys files."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotReadable(Exception):
    """Why a file was not read, in a few words without its name (``too_long`` for the cap)."""

    def __init__(self, why: str, too_long: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.too_long = too_long


def read_bytes(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; NotReadable otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotReadable(exc.strerror or str(exc)) from None
    except ValueError:  # a NUL in the path
        raise NotReadable("not a valid path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # what was opened, not what a stat saw before
            raise NotReadable("not a regular file")
        data = os.read(fd, limit + 1)
    except OSError as exc:
        raise NotReadable(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotReadable(f"longer than {limit} bytes", too_long=True)
    return data
