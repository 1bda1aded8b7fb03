"""Take a host's server out of the router before its restart, and put it back after.

SGLang's router has no drain verb; its worker API does what a drain needs (stages/router/api.py):
``DELETE /workers/{id}`` takes a worker out of the rotation, so the router routes nothing new to
it, and the requests it already sent there go on to their end. The drain then waits, bounded by
``drain_timeout_s``, until nothing is in flight there: the server holds no request by its own
count (gpunode.stages.serve.load: /v1/loads, else its metrics), and the router's count of requests
it sent the worker (counted as each ends) has not moved for ``QUIET_S``. Every count is read, never
assumed; what could not be read is said.
Putting it back is ``POST /workers`` with the fleet's key, then a wait until the router reports it
healthy: the next host goes out only once this one serves again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gpunode.stages.router.api import RouterApi, RouterUnavailable

POLL_S = 1.0
# The router counts a request to a worker when it ends: once its count has not moved for this long
# (and the server holds nothing), nothing it sent there is still coming back.
QUIET_S = 2.0


@dataclass
class Drained:
    """One worker's way out of the router and back, as the router's own counters saw it."""

    host: str
    url: str
    listed: bool = False  # the router had it when the drain began
    routed_at_removal: int | None = None  # requests the router had sent it, counted once its last one ended
    in_flight: int | None = None  # what the server held at the last reading (None: it could not say)
    waited_s: float = 0.0
    timed_out: bool = False
    routed_before_return: int | None = None  # the same count just before it was put back: equal, or the drain leaked
    restored: bool = False
    healthy_after_s: float | None = None
    note: str = ""

    def leaked(self) -> int:
        """Requests the router sent it while it was out (0 when drained as it should be)."""
        if self.routed_at_removal is None or self.routed_before_return is None:
            return 0
        return self.routed_before_return - self.routed_at_removal

    def line(self) -> str:
        parts = [f"{self.host} ({self.url}):"]
        if not self.listed:
            parts.append("not in the router (nothing to drain)")
        else:
            parts.append(f"taken out of the router after {self.routed_at_removal} requests; in flight at the restart: "
                         f"{'unread' if self.in_flight is None else self.in_flight} ({self.waited_s:.1f} s"
                         + (", the drain timeout passed" if self.timed_out else "") + ")")
        if self.routed_before_return is not None:
            parts.append(f"routed while out: {self.leaked()}")
        if self.restored:
            parts.append(f"back in the router, healthy after {self.healthy_after_s:.1f} s")
        if self.note:
            parts.append(self.note)
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "routed_while_out": self.leaked()}


@dataclass
class RouterView:
    """What the drain reads and changes: the router's worker API and its per-worker counts of
    requests sent (each counted as it ends)."""

    api: RouterApi
    routed: Callable[[], dict[str, int]]  # worker url -> requests the router sent it
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def drain(view: RouterView, host: str, url: str, server_in_flight: Callable[[], int | None],
          timeout_s: float) -> Drained:
    """Take ``url`` out of the router and wait until nothing is in flight there (bounded)."""
    record = Drained(host, url)
    listed = next((w for w in view.api.workers() if w.url == url), None)
    start = view.clock()
    if listed is not None:
        record.listed = True
        view.api.remove_worker(listed)
        left = view.api.wait_gone({url}, timeout_s=30.0)
        if left:
            raise RouterUnavailable(f"the router still lists {url} 30 s after DELETE /workers/{listed.id}")
    deadline = start + timeout_s
    routed, moved = view.routed().get(url, 0), view.clock()
    while True:
        record.in_flight = server_in_flight()
        now_routed = view.routed().get(url, 0)
        if now_routed != routed:
            routed, moved = now_routed, view.clock()
        if not record.in_flight and view.clock() - moved >= QUIET_S:
            break
        if view.clock() >= deadline:
            record.timed_out = True
            break
        view.sleep(POLL_S)
    record.waited_s = view.clock() - start
    # Read once what was in flight has ended: any count beyond this one is a request routed to the
    # worker while it was out.
    record.routed_at_removal = routed
    if record.in_flight is None:
        record.note = ("the server could not say what it held (no /v1/loads, no --enable-metrics): the drain "
                       f"waited for the router's count to hold still {QUIET_S:.0f} s, and the server's own "
                       "shutdown finishes what it holds")
    return record


def restore(view: RouterView, record: Drained, api_key: str | None, timeout_s: float) -> Drained:
    """Put the worker back (with the fleet's key, so the router can read its model) and wait until
    the router reports it healthy; ``record.restored`` says whether it did in time."""
    record.routed_before_return = view.routed().get(record.url, 0)
    start = view.clock()
    view.api.add_worker(record.url, api_key)
    record.restored = bool(view.api.wait_listed({record.url}, healthy=True, timeout_s=timeout_s))
    record.healthy_after_s = view.clock() - start if record.restored else None
    if not record.restored:
        record.note = f"the router did not report it healthy within {timeout_s:.0f} s"
    return record
