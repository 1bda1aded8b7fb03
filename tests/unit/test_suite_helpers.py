"""The test suite's own helpers (tests/fakes): CI read as a boolean, ports no other process can take,
and virtual time."""

from __future__ import annotations

import errno
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import CiValueError, under_ci  # noqa: E402 - tests/ put on the path just above
from fakes.clock import VirtualClock, VirtualEvent  # noqa: E402
from fakes.ports import PortTaken, bound_socket, closed_port, on_free_port, port_of, session_closed_port  # noqa: E402


# -- CI ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "yes", "Yes", "on", " true "])
def test_ci_spellings_that_mean_ci(value: str) -> None:
    assert under_ci({"CI": value}) is True


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "NO", "off"])
def test_ci_spellings_that_mean_not_ci(value: str) -> None:
    assert under_ci({"CI": value}) is False


def test_ci_unset_is_not_ci() -> None:
    assert under_ci({"PATH": "/usr/bin"}) is False


def test_an_unknown_ci_spelling_is_refused_not_read_as_false() -> None:
    with pytest.raises(CiValueError) as refused:
        under_ci({"CI": "maybe"})
    message = str(refused.value)
    assert "CI='maybe'" in message and "is not a boolean" in message and "1, on, true, yes" in message
    assert "\n" not in message


def test_ci_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    assert under_ci() is True
    monkeypatch.delenv("CI")
    assert under_ci() is False


# -- ports ------------------------------------------------------------------------------------------
def test_a_closed_port_refuses_and_cannot_be_taken() -> None:
    with closed_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=30)
        for reuse in (False, True):  # not even by a socket that asks to reuse the address
            other = socket.socket()
            try:
                if reuse:
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError) as taken:
                    other.bind(("127.0.0.1", port))
                assert taken.value.errno == errno.EADDRINUSE
            finally:
                other.close()
    again = socket.socket()
    try:
        again.bind(("127.0.0.1", port))  # given back at the end of the block
    finally:
        again.close()


def test_a_session_closed_port_stays_held() -> None:
    port = session_closed_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=30)


def test_a_bound_socket_is_handed_over_and_served_on() -> None:
    with bound_socket() as sock:
        port = port_of(sock)
        with pytest.raises(ConnectionRefusedError):  # bound, not yet listening
            socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=30):
            accepted, _ = sock.accept()
            accepted.close()
    assert sock.fileno() == -1  # closed at the end


def test_on_free_port_tries_another_port_when_one_was_taken() -> None:
    tried: list[int] = []

    def start(port: int) -> str:
        tried.append(port)
        if len(tried) < 3:
            raise PortTaken(port, "bind: address already in use")
        return f"serving on {port}"

    assert on_free_port(start) == f"serving on {tried[-1]}"
    assert len(tried) == 3 and all(port > 0 for port in tried)


def test_on_free_port_gives_up_after_its_attempts() -> None:
    tried: list[int] = []

    def start(port: int) -> None:
        tried.append(port)
        raise PortTaken(port)

    with pytest.raises(PortTaken, match="was taken before the server bound it"):
        on_free_port(start, attempts=2)
    assert len(tried) == 2
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        on_free_port(start, attempts=0)


def test_on_free_port_does_not_retry_other_errors() -> None:
    tried: list[int] = []

    def start(port: int) -> None:
        tried.append(port)
        raise RuntimeError("the server failed for its own reasons")

    with pytest.raises(RuntimeError):
        on_free_port(start)
    assert len(tried) == 1


# -- virtual time -----------------------------------------------------------------------------------
def test_virtual_time_moves_only_when_everyone_waits() -> None:
    clock = VirtualClock()
    seen: list[tuple[str, float]] = []
    stop = VirtualEvent(clock)

    def ticker() -> None:
        while not stop.wait(0.3):
            seen.append(("tick", clock.monotonic()))

    thread = threading.Thread(target=ticker)
    thread.start()
    clock.adopt([thread])
    clock.sleep(1.0)
    seen.append(("main", clock.monotonic()))
    stop.set()
    clock.leave()
    thread.join(30)
    assert not thread.is_alive()
    assert seen == [("tick", pytest.approx(0.3)), ("tick", pytest.approx(0.6)), ("tick", pytest.approx(0.9)),
                    ("main", pytest.approx(1.0))]
    assert clock.time() - clock.monotonic() == pytest.approx(1_767_225_600.0)


def test_a_virtual_event_needs_a_timeout() -> None:
    with pytest.raises(ValueError):
        VirtualEvent(VirtualClock()).wait()
