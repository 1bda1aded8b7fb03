"""Virtual time for code that runs its own threads (gpunode.bench.sampler): the clock moves only
when every thread taking part waits on it, and then straight to the earliest wake-up. Each thread
sees exactly the times its own arithmetic asks for, however slow or loaded the machine, so a test
can assert where the ticks fall instead of bounding how late they come.

Use: ``clock = VirtualClock()`` in the test's thread (which takes part from then on), put it where
the code reads the time (it has ``monotonic``, ``perf_counter`` and ``time``), give the code's
waits a ``VirtualEvent``, ``adopt`` the code's threads once they exist, ``sleep`` to let time pass,
and ``leave`` before joining them (the clock then runs on for the threads alone).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

EPOCH = 1_767_225_600.0  # what time.time() reads at virtual 0 (2026-01-01 00:00 UTC)
RECHECK_S = 0.005  # real seconds between looks at threads that may have ended without waiting


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._cond = threading.Condition()
        self._members: set[threading.Thread] = {threading.current_thread()}
        # Each waiting thread: when it wakes, and what else ends its wait.
        self._wakes: dict[threading.Thread, tuple[float, Callable[[], bool]]] = {}

    # what the code reads
    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return EPOCH + self.now

    # who takes part
    def adopt(self, threads: Iterable[threading.Thread]) -> None:
        """Make ``threads`` take part: time waits for them whenever they are not waiting themselves."""
        with self._cond:
            self._members.update(threads)
            self._cond.notify_all()

    def leave(self) -> None:
        """The calling thread no longer holds time back (before it joins the others)."""
        with self._cond:
            self._members.discard(threading.current_thread())
            self._cond.notify_all()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # passing time
    def sleep(self, seconds: float, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Wait ``seconds`` of virtual time, or until ``interrupted()`` (checked on every change)."""
        me = threading.current_thread()
        with self._cond:
            wake = self.now + max(0.0, seconds)
            self._wakes[me] = (wake, interrupted)
            try:
                while self.now < wake and not interrupted():
                    if all(self._waiting(member) for member in self._members):
                        self.now = min(when for when, _ in self._wakes.values())
                        self._cond.notify_all()
                    else:
                        self._cond.wait(RECHECK_S)
            finally:
                del self._wakes[me]

    def _waiting(self, thread: threading.Thread) -> bool:
        """Ended, or waiting for a later time: a thread whose wait is over is about to run."""
        if thread not in self._wakes:
            return not thread.is_alive()
        when, interrupted = self._wakes[thread]
        return when > self.now and not interrupted()


class VirtualEvent:
    """threading.Event on a VirtualClock: ``wait(timeout)`` passes virtual time, ``set()`` ends it."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        self.clock.wake_all()

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            raise ValueError("a VirtualEvent waits a virtual time: give a timeout")
        self.clock.sleep(timeout, self.is_set)
        return self._flag
