"""Loopback ports for tests, safe with two xdist workers (and the lab) running side by side.

A port picked by binding to 0 and closing the socket again can be taken by anyone before the
server under test binds it. So every test that needs a port gets it here, one of three ways:

- ``bound_socket()``: the bound socket itself, to hand to the server (``listen()`` on it, or pass
  its descriptor to a child process): the port is never free in between;
- ``closed_port()``: a port that refuses connections for as long as the test holds it: bound, never
  listening, and without SO_REUSEADDR, so no other socket can bind it (the kernel also keeps it out
  of the ephemeral ports it hands to outgoing connections); ``session_closed_port()`` holds one
  until the test process ends;
- ``on_free_port(start)``: for a server that must bind the port itself (a published container
  port, a separate binary): ``start(port)`` raises ``PortTaken`` when the port was taken in the
  meantime, and another port is tried.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

LOOPBACK = "127.0.0.1"
ATTEMPTS = 5

T = TypeVar("T")


class PortTaken(Exception):
    """Raised by an ``on_free_port`` start function: someone else bound the port first."""

    def __init__(self, port: int, evidence: str = "") -> None:
        super().__init__(f"port {port} was taken before the server bound it" + (f": {evidence}" if evidence else ""))
        self.port = port


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


@contextmanager
def bound_socket(host: str = LOOPBACK) -> Iterator[socket.socket]:
    """A TCP socket bound to a free port on ``host``, not listening; closed at the end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        yield sock
    finally:
        sock.close()


@contextmanager
def closed_port(host: str = LOOPBACK) -> Iterator[int]:
    """A port on ``host`` where a connection is refused, held so for the block's life."""
    with bound_socket(host) as sock:
        yield port_of(sock)


_HELD_FOR_THE_SESSION: list[socket.socket] = []


def session_closed_port(host: str = LOOPBACK) -> int:
    """Like ``closed_port``, for a helper that returns before its caller is done with the port: held
    closed until this test process ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    _HELD_FOR_THE_SESSION.append(sock)
    return port_of(sock)


def on_free_port(start: Callable[[int], T], attempts: int = ATTEMPTS, host: str = LOOPBACK) -> T:
    """``start(port)`` on a port that was free when picked; again on another port while it raises
    ``PortTaken``. The last ``PortTaken`` propagates after ``attempts`` tries."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(attempts):
        with bound_socket(host) as sock:
            port = port_of(sock)
        # Closed here: the server binds it itself; start() says whether someone got there first.
        try:
            return start(port)
        except PortTaken:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
