"""One Proxmox VE API client for gpunode, on proxmoxer.

- Auth: a root@pam password (ticket, renewed once on 401), an API token, or ``local`` (pvesh on
  the Proxmox host itself, proxmoxer's local backend).
- TLS: verified by default, against a CA file or a pinned SHA-256 certificate fingerprint;
  turning verification off is explicit and warned about by the caller.
- Failures are classified by cause (gpunode.stages.container.causes), not by status: a refusal that
  would repeat (a missing device node, a bad SSH key, a parameter or permission refusal, most of
  Proxmox's 500s) fails at once with Proxmox's message and the fix; reads retry with backoff only
  on connection errors, timeouts and transient answers (a lock timeout, 502/503/504/595/596).
  Writes are not retried here: the caller re-reads state and decides again (a POST that timed
  out may have happened).
- The Proxmox version (GET /version) is read once per client: hot-plug rules depend on it.
- Every request is counted by method, so "a converged run writes nothing" is a number.
- Task UPIDs are waited for with a timeout; a failed task reports its exit status and last log lines.
"""

from __future__ import annotations

import collections
import contextlib
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import requests
from requests.adapters import HTTPAdapter

from gpunode.stages.container.causes import Cause, classify, known

READS = ("GET",)


class PveError(Exception):
    """An API call that failed; ``retryable`` when its cause may pass (causes.classify)."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False,
                 cause: Cause | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.cause = cause


class PveUnreachable(PveError):
    """The API did not answer: connection refused or timed out, or its name did not resolve."""

    def __init__(self, message: str) -> None:
        super().__init__(message, None, retryable=True)


class TaskFailed(PveError):
    def __init__(self, message: str, exitstatus: str, log_tail: list[str]) -> None:
        super().__init__(message)
        self.exitstatus = exitstatus
        self.log_tail = log_tail


@dataclass(frozen=True)
class PveVersion:
    """The Proxmox VE release, as GET /version reports it (``version``: ``9.0.10``, ``8.4.1``)."""

    text: str
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> PveVersion:
        match = re.match(r"(\d+)\.(\d+)", text.strip())
        if match is None:
            raise PveError(f"GET version: {text!r} is not a Proxmox VE version (want e.g. 9.0.10)")
        return cls(text.strip(), int(match.group(1)), int(match.group(2)))

    def at_least(self, major: int, minor: int = 0) -> bool:
        return (self.major, self.minor) >= (major, minor)

    def __str__(self) -> str:
        return self.text


def _failure(prefix: str, message: str, status: int | None) -> PveError:
    """Proxmox's own message, then the fix its cause calls for."""
    cause = classify(status, message)
    text = f"{prefix}{message}" + (f" -> {cause.fix}" if cause.fix and cause.kind == "refused" else "")
    return PveError(text, status, cause.retryable, cause)


@dataclass(frozen=True)
class Connection:
    url: str
    node: str
    method: Literal["password", "token", "local"] = "password"
    user: str = "root@pam"
    password: str | None = field(default=None, repr=False)
    token_id: str | None = None
    token_secret: str | None = field(default=None, repr=False)
    verify: bool = True
    ca_file: str | None = None
    fingerprint: str | None = None
    request_timeout_s: float = 30.0
    # A refused or silent API is "unreachable" in seconds, not after a 30 s read timeout per try.
    connect_timeout_s: float = 3.0
    task_timeout_s: float = 300.0
    retries: int = 4
    unreachable_retries: int = 2  # a host that refuses or is silent is reported, not waited on
    backoff_s: float = 0.5

    @property
    def host_port(self) -> tuple[str, int]:
        parsed = urllib.parse.urlsplit(self.url)
        return parsed.hostname or "", parsed.port or 8006


class _PinnedAdapter(HTTPAdapter):
    """Accept exactly one server certificate, by its SHA-256 fingerprint (urllib3 checks it)."""

    def __init__(self, fingerprint: str) -> None:
        self._fingerprint = fingerprint.replace(":", "").lower()
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["assert_fingerprint"] = self._fingerprint
        super().init_poolmanager(*args, **kwargs)


class _RequestsThroughSession:
    """Stands in for the ``requests`` module inside proxmoxer's https backend.

    proxmoxer fetches (and renews) tickets with module-level ``requests.post``, which no session
    adapter can reach; routing it through our session puts the login under the same pin.
    """

    def __init__(self, session: requests.Session) -> None:
        self._session = session

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        # Explicit False: requests would otherwise take REQUESTS_CA_BUNDLE from the environment.
        kwargs["verify"] = False
        return self._session.post(url, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(requests, name)


def _describe(exc: Exception) -> tuple[str, int | None]:
    from proxmoxer.core import ResourceException

    if isinstance(exc, ResourceException):
        detail = str(exc.content or exc.status_message).strip()
        errors = getattr(exc, "errors", None)
        if isinstance(errors, dict) and errors:
            detail += " (" + "; ".join(f"{key}: {str(text).strip()}" for key, text in sorted(errors.items())) + ")"
        return f"HTTP {exc.status_code}: {detail}", int(exc.status_code)
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS verification failed: {str(exc).splitlines()[0][:300]}", None
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else 'no detail'}", None


def _unreachable(exc: Exception) -> bool:
    # SSLError is a ConnectionError to requests, but a certificate problem is not an absent host.
    return isinstance(exc, (requests.ConnectionError, requests.Timeout)) and not isinstance(
        exc, requests.exceptions.SSLError)


class PveClient:
    def __init__(self, conn: Connection, sleep: Callable[[float], None] = time.sleep) -> None:
        self.conn = conn
        self.sleep = sleep
        self.counts: collections.Counter[str] = collections.Counter()
        self._api: Any = None
        self._version: PveVersion | None = None
        self._session = requests.Session()
        if conn.fingerprint:
            self._session.mount("https://", _PinnedAdapter(conn.fingerprint))

    # -- connection -------------------------------------------------------------------------
    def _verify(self) -> bool | str:
        if self.conn.fingerprint:
            return False  # the pin replaces CA verification; _PinnedAdapter enforces it
        if not self.conn.verify:
            return False
        return self.conn.ca_file or True

    @contextlib.contextmanager
    def _tls_scope(self) -> Iterator[None]:
        if not self.conn.fingerprint:
            yield
            return
        import proxmoxer.backends.https as https_backend

        saved = https_backend.requests
        https_backend.requests = _RequestsThroughSession(self._session)  # type: ignore[assignment]
        try:
            yield
        finally:
            https_backend.requests = saved

    def _connect(self) -> Any:
        from proxmoxer import ProxmoxAPI

        if not self.conn.verify or self.conn.fingerprint:
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        if self.conn.method == "local":
            return ProxmoxAPI(backend="local", service="PVE")
        host, port = self.conn.host_port
        common: dict[str, Any] = {"port": port, "verify_ssl": self._verify(), "timeout": (self.conn.connect_timeout_s, self.conn.request_timeout_s),
                                  "backend": "https", "service": "PVE"}
        if self.conn.method == "token":
            return ProxmoxAPI(host, user=self.conn.user, token_name=self.conn.token_id,
                              token_value=self.conn.token_secret, **common)
        self.counts["POST"] += 1  # the ticket request
        with self._tls_scope():
            return ProxmoxAPI(host, user=self.conn.user, password=self.conn.password, **common)

    def _ensure_connected(self) -> Any:
        if self._api is None:
            try:
                self._api = self._connect()
            except Exception as exc:  # proxmoxer raises several types at login
                message, status = _describe(exc)
                if _unreachable(exc):
                    raise PveUnreachable(f"Proxmox API {self.conn.url} unreachable: {message}") from None
                if "401" in message or "authentication failure" in message.lower():
                    raise PveError(f"login to {self.conn.url} as {self.conn.user} refused: {message}", 401) from None
                # Unreachable was handled above; what is left (a bad CA file, TLS, a refusal) will
                # not change by retrying, a transient answer may.
                if isinstance(exc, requests.exceptions.SSLError) or status is None:
                    raise PveError(f"cannot connect to {self.conn.url}: {message}", status) from None
                raise _failure(f"cannot connect to {self.conn.url}: ", message, status) from None
            if self.conn.fingerprint:
                self._api._store["session"].mount("https://", _PinnedAdapter(self.conn.fingerprint))
        return self._api

    # -- requests ---------------------------------------------------------------------------
    def _once(self, method: str, path: str, params: dict[str, Any]) -> Any:
        api = self._ensure_connected()
        self.counts[method] += 1
        with self._tls_scope():
            return getattr(api(path), method.lower())(**params)

    def call(self, method: str, path: str, **params: Any) -> Any:
        """One API call. Reads retry on connection errors and 5xx; 401 re-logs in once."""
        from proxmoxer.core import ResourceException

        relogged = False
        attempt = 0
        while True:
            try:
                return self._once(method, path, params)
            except PveError as exc:
                error = exc
            except (ResourceException, requests.RequestException) as exc:
                message, status = _describe(exc)
                if status == 401 and self.conn.method == "password" and not relogged:
                    # An expired or revoked ticket: log in again, once; the call did not happen.
                    relogged = True
                    self._api = None
                    continue
                # A read that cannot connect is retried here and then final. A write is never
                # resent here: a dropped one stays a retryable error, so ensure() reads state again
                # and decides afresh (the host answered moments ago; it may have done the write).
                if _unreachable(exc) and method in READS:
                    error = PveUnreachable(f"Proxmox API {self.conn.url} unreachable ({method} {path}): {message}")
                elif isinstance(exc, requests.exceptions.SSLError):
                    error = PveError(f"{method} {path}: {message}", status)  # a certificate does not heal
                else:
                    error = _failure(f"{method} {path}: ", message, status)
            limit = self.conn.unreachable_retries if isinstance(error, PveUnreachable) else self.conn.retries
            if not (error.retryable and method in READS and attempt < limit):
                raise error
            self.sleep(self.conn.backoff_s * (2 ** attempt))
            attempt += 1

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, **params)

    def version(self) -> PveVersion:
        """The Proxmox VE version, read once per client (one run)."""
        if self._version is None:
            self._version = PveVersion.parse(str(self.get("version").get("version", "")))
        return self._version

    @property
    def writes(self) -> int:
        """Writes sent, not counting the login ticket."""
        return self.counts["PUT"] + self.counts["DELETE"] + self.counts["POST"] - (self.conn.method == "password")

    # -- tasks ------------------------------------------------------------------------------
    def wait_task(self, upid: str, timeout_s: float | None = None, poll_s: float = 0.2) -> None:
        """Wait until a task stops; raise TaskFailed unless it ended OK."""
        parts = upid.split(":")
        node = parts[1] if len(parts) > 2 and parts[0] == "UPID" else self.conn.node
        kind = parts[5] if len(parts) > 6 else "task"
        limit = timeout_s if timeout_s is not None else self.conn.task_timeout_s
        deadline = time.monotonic() + limit
        quoted = urllib.parse.quote(upid, safe="")
        while True:
            status = self.get(f"nodes/{node}/tasks/{quoted}/status")
            if status.get("status") == "stopped":
                break
            if time.monotonic() > deadline:
                raise PveError(f"task {upid} did not finish within {limit:g} s; "
                               f"it may still be running: see the task log on node {node}", retryable=False)
            self.sleep(poll_s)
        exitstatus = str(status.get("exitstatus", ""))
        if exitstatus != "OK":
            log = self.get(f"nodes/{node}/tasks/{quoted}/log", limit=500)
            lines = [str(entry.get("t", "")) for entry in log if str(entry.get("t", "")).strip()][-5:]
            rule = known(" ".join([exitstatus, *lines]))
            fix = f" -> {rule.fix}" if rule is not None and rule.kind == "refused" else ""
            raise TaskFailed(f"task {kind} failed: {exitstatus}; last log lines: {' | '.join(lines) or '(none)'}{fix}",
                             exitstatus, lines)
