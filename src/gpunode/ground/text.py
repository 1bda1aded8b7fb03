"""Showing a user's value inside a message: escaped and cut, never printed as it is.

A value from a host file can hold anything: a newline (which would make one error two lines), an
escape sequence (which a terminal would act on), a megabyte of text. ``shown`` turns it into one
short, inert line: characters that do not print are written as escapes the way ``repr`` writes
them (``\\x1b``, ``\\n``, ``\\u202e``), and the result is cut to about ``limit`` characters.
"""

from __future__ import annotations

from typing import Any

LIMIT = 80
ELLIPSIS = "..."
# Past this many bits a whole number is described, not written out: str() of an int past 4,300
# digits raises, and nobody reads thousands of digits in an error anyway.
MAX_INT_BITS = 256


def _escape(char: str) -> str:
    if char == "\\":
        return "\\\\"  # so that a written "\x1b" and a real escape character read differently
    if char.isprintable():
        return char
    return repr(char)[1:-1]


def shown(value: Any, limit: int = LIMIT, quote: bool = False) -> str:
    """``value`` as one inert line of at most about ``limit`` characters (``quote``: in '...')."""
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        text = f"(a whole number of {value.bit_length()} bits)"
    elif isinstance(value, str):
        text = value
    else:
        text = str(value)
    pieces: list[str] = []
    length = 0
    cut = False
    # Only the first ``limit`` characters can show, so a huge value costs no more than a short one.
    for char in text[:limit + 1]:
        piece = "\\'" if quote and char == "'" else _escape(char)
        if length + len(piece) > limit:
            cut = True
            break
        pieces.append(piece)
        length += len(piece)
    if cut:  # room for the ellipsis, never half an escape
        while pieces and length + len(ELLIPSIS) > limit:
            length -= len(pieces.pop())
        pieces.append(ELLIPSIS)
    body = "".join(pieces)
    return f"'{body}'" if quote else body


def one_line(text: str) -> str:
    """A whole message as one line that drives no terminal: what does not print is escaped as in
    ``shown``, but nothing is cut and a backslash stays one (its values are shown() already)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
