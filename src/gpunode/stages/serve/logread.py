"""Read a server log for diagnosis: safely, in bounded memory and bounded time.

- Only a regular file is read as a log. A FIFO, a device, a socket or a directory is refused with
  one line naming the path, before anything is read: a FIFO with no writer would block forever and
  a device (/dev/zero) never ends. The path is checked with ``stat`` and opened non-blocking, and
  what was opened is checked again, so a file swapped for a FIFO in between cannot block either.
- Standard input is read when it is a pipe, a socket or a regular file; a terminal (nothing would
  come), a closed standard input or a device is refused the same way.
- Lines are cut to ``LINE_CHARS`` characters before anything matches them, so a 1 MB line costs
  what a 4 KiB one does; the rest of a long line is read and dropped, never held.
- Of a regular file, at most ``HEAD_BYTES + TAIL_BYTES`` are read: its first 16 MiB (the server's
  arguments and its start: where a failure that stops a start is) and its last 240 MiB (what the
  server did before it stopped: where a failure while serving is). A file that is longer is read
  in those two windows, and ``note`` says what was left out. A pipe cannot be seeked: standard
  input is read to its end, in the same bounded memory.

Text comes out in chunks of about ``CHUNK_BYTES``; ``cut_lines`` turns chunks into lists of cut
lines (``None`` where a window ends: the next line does not follow the one before it).
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

CHUNK_BYTES = 1 << 20
LINE_CHARS = 4096  # a line is cut to this before matching; sglang's longest message is ~600 characters
HEAD_BYTES = 16 << 20
TAIL_BYTES = 240 << 20
# What str.splitlines() breaks lines at: a chunk is split the way a whole text would be.
_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
PIPE_IT_IN = "pipe a log in: gpunode diagnose - < server.log"


class LogUnreadable(Exception):
    """A log that is not read: one line that names it and says why."""


def _kind(mode: int) -> str | None:
    """What a file that is not a log is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return os.strerror(errno.EISDIR)
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a log file"
    if stat.S_ISCHR(mode):
        return "is a character device, not a log file"
    if stat.S_ISBLK(mode):
        return "is a block device, not a log file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a log file"
    return "is not a regular file"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB" if size >= 1 << 20 else f"{size} bytes"


class LogSource:
    """An opened log: a regular file (read by offset, in windows) or a stream (read to its end)."""

    def __init__(self, name: str, fd: int | None = None, size: int | None = None, start: int = 0,
                 read: Callable[[int], bytes] | None = None, close: bool = False) -> None:
        self.name = name
        self._fd = fd
        self._size = size  # a regular file's size when opened; None for a stream
        self._start = start
        self._read = read
        self._close = close
        self.note: str | None = None  # what was left unread, once chunks() has run

    def __enter__(self) -> LogSource:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._close and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def chunks(self) -> Iterator[str | None]:
        """The log's text in chunks; None between the two windows of a long file."""
        if self._size is None:
            yield from _decoded(self._stream())
            return
        length = self._size - self._start
        if length <= HEAD_BYTES + TAIL_BYTES:
            yield from _decoded(self._range(self._start, length))
            return
        skipped = length - HEAD_BYTES - TAIL_BYTES
        self.note = (f"{self.name} holds {_mib(length)}: read its first {_mib(HEAD_BYTES)} and last "
                     f"{_mib(TAIL_BYTES)}, not the {_mib(skipped)} between")
        yield from _decoded(self._range(self._start, HEAD_BYTES))
        yield None
        # From the byte before the window: the partial line it starts in is dropped, a whole one kept.
        yield from _decoded(self._range(self._size - TAIL_BYTES - 1, TAIL_BYTES + 1, partial=True))

    def _range(self, offset: int, length: int, partial: bool = False) -> Iterator[bytes]:
        assert self._fd is not None
        while length > 0:
            data = self._call(os.pread, self._fd, min(CHUNK_BYTES, length), offset)
            if not data:
                return  # the file shrank (rotated): what is there has been read
            offset, length = offset + len(data), length - len(data)
            if partial:
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                data, partial = data[cut + 1:], False
            if data:
                yield data

    def _stream(self) -> Iterator[bytes]:
        read = self._read or (lambda size: self._call(os.read, self._fd, size))
        while data := read(CHUNK_BYTES):
            yield data

    def _call(self, function: Callable[..., bytes], *args: object) -> bytes:
        try:
            return function(*args)
        except OSError as exc:
            raise LogUnreadable(f"{self.name}: {exc.strerror or exc}") from None


def _decoded(chunks: Iterable[bytes]) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for data in chunks:
        if text := decoder.decode(data):
            yield text
    if text := decoder.decode(b"", final=True):
        yield text


def open_path(path: str) -> LogSource:
    """A regular file, opened for reading; anything else is refused (LogUnreadable) without blocking."""
    try:
        kind = _kind(os.stat(path).st_mode)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise LogUnreadable(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    if kind:
        raise LogUnreadable(f"{path}: {kind}")
    try:
        # O_NONBLOCK: were the path swapped for a FIFO since stat, open still returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise LogUnreadable(f"{path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if kind := _kind(info.st_mode):
            raise LogUnreadable(f"{path}: {kind}")
    except BaseException:
        os.close(fd)
        raise
    return LogSource(path, fd, info.st_size, close=True)


def open_stdin() -> LogSource:
    """Standard input as a log: a pipe or socket (read to its end), or a regular file (in windows)."""
    name = "standard input"
    stdin = sys.stdin
    if stdin is None:  # fd 0 was closed when Python started
        raise LogUnreadable(f"{name} is closed: {PIPE_IT_IN}")
    try:
        fd = stdin.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        # Not a file descriptor (a test harness's in-memory stream): read what it holds.
        buffer = getattr(stdin, "buffer", None)
        if buffer is None:
            return LogSource(name, read=lambda size: stdin.read(size).encode())
        return LogSource(name, read=buffer.read)
    try:
        info = os.fstat(fd)
    except OSError:
        raise LogUnreadable(f"{name} is closed: {PIPE_IT_IN}") from None
    if os.isatty(fd):
        raise LogUnreadable(f"{name} is a terminal: {PIPE_IT_IN}")
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return LogSource(name, fd)
    if stat.S_ISREG(info.st_mode):
        try:
            start = os.lseek(fd, 0, os.SEEK_CUR)  # `(head -1; gpunode diagnose -) < log` reads on from there
        except OSError:
            start = 0
        return LogSource(name, fd, info.st_size, start=min(start, info.st_size))
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == os.stat(os.devnull).st_rdev:
        return LogSource(name, read=lambda size: b"")  # < /dev/null: an empty log
    raise LogUnreadable(f"{name} {_kind(info.st_mode)}: {PIPE_IT_IN}")


def open_log(name: str) -> LogSource:
    """``-`` for standard input, else a path."""
    return open_stdin() if name == "-" else open_path(name)


def text_chunks(text: str) -> Iterator[str]:
    """A text already in memory, in chunks for ``cut_lines``."""
    for start in range(0, len(text), CHUNK_BYTES):
        yield text[start:start + CHUNK_BYTES]


def cut_lines(chunks: Iterable[str | None], line_chars: int = LINE_CHARS) -> Iterator[list[str] | None]:
    """The lines of ``chunks`` as ``str.splitlines`` would give them, each cut to ``line_chars``, in
    lists of about a chunk; None where the text does not go on from the line before (a window ends:
    the line it ends in is left out, as the next window leaves out the line it starts in)."""
    partial = ""  # the start of a line whose end has not come yet (at most line_chars)
    dropping = False  # partial is full: the rest of its line is dropped as it comes
    after_cr = False  # the last chunk ended in \r: a \n that starts the next one ends the same line
    for chunk in chunks:
        if chunk is None:  # a window ends inside its last line: that part of a line is dropped, as at a start
            partial, dropping, after_cr = "", False, False
            yield None
            continue
        if after_cr and chunk.startswith("\n"):
            chunk = chunk[1:]
        after_cr = False
        if dropping:
            found = _BREAK.search(chunk)
            if found is None:
                continue
            chunk, dropping = chunk[found.start():], False
        if not chunk:
            continue
        text = partial + chunk
        lines = text.splitlines()
        partial = ""
        if text[-1] not in _BREAKS:
            partial = lines.pop()
            if len(partial) > line_chars:
                partial, dropping = partial[:line_chars], True
        after_cr = text[-1] == "\r"
        if lines:
            yield [line if len(line) <= line_chars else line[:line_chars] for line in lines]
    if partial:
        yield [partial]
