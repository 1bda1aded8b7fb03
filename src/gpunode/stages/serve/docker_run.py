"""Start the server container through the Docker SDK, idempotently, and watch it.

``ensure_container(client, spec, key_file)``: a container with the spec's name and config hash that
is running is left alone (same id, not restarted); changed settings, or a changed key file, replace
it; a stopped one with the same settings is started again; one with the name but not gpunode's role
label is never touched. A key goes in as a file written into the created container before it
starts, never through the spec. ``ensure_server`` is that for the SGLang server and its API key
(``spec.API_KEY_FILE``, with the launcher that reads it); the router stage uses it for the router,
the monitor stage for its GPU exporter.
"""

from __future__ import annotations

import hmac
import io
import json
import re
import tarfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import docker
from docker.models.containers import Container

from gpunode.derive import serverspec as specs
from gpunode.stages.serve.diagnose import Diagnosis, diagnose_docker_error
from gpunode.stages.serve.readiness import ProcessState

Action = Literal["kept", "started", "created", "replaced"]
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class ServeError(Exception):
    """Docker refused the container; ``diagnosis`` says why and what to do, when known."""

    def __init__(self, message: str, diagnosis: Diagnosis | None = None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


@dataclass(frozen=True)
class StartResult:
    action: Action
    container_id: str
    name: str
    reason: str
    config_hash: str

    def as_dict(self) -> dict[str, str]:
        return {"action": self.action, "container_id": self.container_id, "name": self.name,
                "reason": self.reason, "config_hash": self.config_hash}


# ----------------------------------------------------------------------------- containers
def find_container(client: docker.DockerClient, name: str) -> Container | None:
    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def foreign_message(container: Container, role: str = specs.ROLE) -> str:
    """One line for a container that has the name gpunode wants but not gpunode's label."""
    image = (container.attrs.get("Config") or {}).get("Image") or "?"
    return (f"a container named {container.name} (image {image}, {container.status}) exists that gpunode did not "
            f"start (no {specs.LABEL_ROLE}={role} label): it was left alone; remove or rename it yourself "
            f"on the node (docker rename {container.name} NEW-NAME) if it may go, then re-run")


def changed_settings(container: Container, spec: Mapping[str, Any]) -> list[str]:
    """Which top-level settings differ from the running container's label (all, if it has none)."""
    labels = container.labels or {}
    if labels.get(specs.LABEL_HASH) == spec["labels"][specs.LABEL_HASH]:
        return []
    try:
        old = json.loads(labels.get(specs.LABEL_CONFIG, ""))
        new = json.loads(spec["labels"][specs.LABEL_CONFIG])
    except ValueError:
        return ["settings (the container was not made by gpunode serve)"]
    return sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key)) or ["settings"]


def _file_from_archive(chunks: Any) -> bytes | None:
    data = b"".join(chunks)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                return handle.read() if handle else None
    return None


@dataclass(frozen=True)
class KeyFile:
    """A secret file written into a container before it starts (mode 0400, its folder 0700), with
    the files that read it (not secret: mode 0444; their content is in the container's command)."""

    path: str
    content: bytes
    readers: tuple[tuple[str, bytes], ...] = ()


def server_key(api_key: str | None) -> KeyFile | None:
    """The SGLang server's API key file, with the launcher that hands it to sglang."""
    if api_key is None:
        return None
    return KeyFile(specs.API_KEY_FILE, specs.api_key_file_content(api_key), (specs.launcher(),))


def key_matches(container: Container, key: KeyFile | None) -> bool:
    """Whether the container holds this key file (compared in constant time)."""
    if key is None:
        return True  # whether a key file is used at all is part of the command, hence of the hash
    try:
        chunks, _stat = container.get_archive(key.path)
        content = _file_from_archive(chunks)
    except docker.errors.NotFound:
        return False
    return content is not None and hmac.compare_digest(content, key.content)


def api_key_matches(container: Container, api_key: str | None) -> bool:
    """Whether the server's key file in the container holds this key."""
    return key_matches(container, server_key(api_key))


def _key_archive(key: KeyFile) -> bytes:
    buf = io.BytesIO()
    folders: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for full, content, mode in [(key.path, key.content, 0o400)] + [(p, c, 0o444) for p, c in key.readers]:
            path = full.lstrip("/")
            parts = path.split("/")
            for depth in range(1, len(parts)):
                name = "/".join(parts[:depth])
                if name not in folders:
                    folders.add(name)
                    folder = tarfile.TarInfo(name)
                    folder.type = tarfile.DIRTYPE
                    folder.mode = 0o755 if depth == 1 else 0o700
                    tar.addfile(folder)
            info = tarfile.TarInfo(path)
            info.size = len(content)
            info.mode = mode
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _docker_failure(exc: docker.errors.DockerException, spec: Mapping[str, Any]) -> ServeError:
    message = getattr(exc, "explanation", None) or str(exc)
    source = spec["mounts"][0]["Source"] if spec.get("mounts") else ""
    diagnosis = diagnose_docker_error(str(message), model_path=source, image=str(spec.get("image", "")))
    return ServeError(f"Docker refused the server container: {message}", diagnosis)


def create_and_start(client: docker.DockerClient, spec: Mapping[str, Any], key: KeyFile | None,
                     files: bytes | None = None) -> Container:
    """The container made from ``spec``, with the key file and ``files`` (a tar put at /: what the
    container runs that its image does not hold) written into it before it starts."""
    try:
        container = client.containers.create(**spec)
    except docker.errors.DockerException as exc:
        raise _docker_failure(exc, spec) from exc
    try:
        if key is not None and not container.put_archive("/", _key_archive(key)):
            raise ServeError("could not write the API key file into the container")
        if files is not None and not container.put_archive("/", files):
            raise ServeError(f"could not write gpunode's files into the container {spec['name']}")
        container.start()
    except (docker.errors.DockerException, ServeError) as exc:
        container.remove(force=True)
        if isinstance(exc, ServeError):
            raise
        raise _docker_failure(exc, spec) from exc
    container.reload()
    return container


def remove_container(container: Container, stop_timeout_s: int = 30) -> None:
    """Stop gracefully (sglang frees GPU memory on SIGTERM), then remove."""
    try:
        container.stop(timeout=stop_timeout_s)
    except docker.errors.APIError:
        pass
    container.remove(force=True)


def stop_quietly(container: Container, timeout_s: int = 10) -> None:
    """Stop a container that failed, leaving it (and its log) in place."""
    try:
        container.stop(timeout=timeout_s)
    except docker.errors.APIError:
        pass


def ensure_server(client: docker.DockerClient, spec: Mapping[str, Any], api_key: str | None = None,
                  stop_timeout_s: int = 30) -> StartResult:
    """Make the server container match ``spec``; see the module docstring for what it decides."""
    return ensure_container(client, spec, server_key(api_key), stop_timeout_s)


@dataclass(frozen=True)
class Decision:
    """What ``ensure_container`` does to the container named in a spec, decided before it acts: the
    serve stage acts on it, check mode and a rolling change read it (a ``replaced`` or ``created``
    server does not serve for the minutes a start takes)."""

    action: Action
    reason: str
    current: Container | None = None

    @property
    def restarts(self) -> bool:
        """Whether acting on it stops a server that may be serving now (or starts one that is not)."""
        return self.action != "kept"


def decide(client: docker.DockerClient, spec: Mapping[str, Any], key: KeyFile | None = None) -> Decision:
    """Kept, started, created or replaced, and why (see the module docstring); a container of the
    name that gpunode did not start is refused (ServeError), never touched."""
    name = spec["name"]
    role = spec["labels"][specs.LABEL_ROLE]
    current = find_container(client, name)
    if current is None:
        return Decision("created", f"no {name} container yet")
    if (current.labels or {}).get(specs.LABEL_ROLE) != role:
        raise ServeError(foreign_message(current, role))
    differs = changed_settings(current, spec)
    key_ok = key_matches(current, key)
    if not differs and key_ok:
        current.reload()
        if current.status in ("running", "restarting"):
            return Decision("kept", "same settings, already running", current)
        return Decision("started", f"same settings; it was {current.status}", current)
    reason = "changed: " + ", ".join(differs) if differs else "changed: the API key"
    if differs and not key_ok:
        reason += ", the API key"
    return Decision("replaced", reason, current)


def ensure_container(client: docker.DockerClient, spec: Mapping[str, Any], key: KeyFile | None = None,
                     stop_timeout_s: int = 30, files: bytes | None = None) -> StartResult:
    """Make the container named in ``spec`` match it (see the module docstring); ``files`` go into a
    container it makes (their digest belongs in the spec's hash: they are not compared here)."""
    name = spec["name"]
    wanted = spec["labels"][specs.LABEL_HASH]
    decision = decide(client, spec, key)
    current = decision.current
    if decision.action == "kept" and current is not None:
        return StartResult("kept", current.id, name, decision.reason, wanted)
    if decision.action == "started" and current is not None:
        try:
            current.start()
        except docker.errors.DockerException as exc:
            raise _docker_failure(exc, spec) from exc
        return StartResult("started", current.id, name, decision.reason, wanted)
    if current is not None:
        remove_container(current, stop_timeout_s)
    made = create_and_start(client, spec, key, files)
    return StartResult(decision.action, made.id, name, decision.reason, wanted)


# ----------------------------------------------------------------------------- watching
def started_at(container: Container) -> float | None:
    """When the container's current run began (epoch seconds), from State.StartedAt."""
    text = str(container.attrs.get("State", {}).get("StartedAt") or "")
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", text)
    if not match or text.startswith("0001-"):
        return None
    whole = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return whole + float(match.group(2) or 0.0)


class DockerServer:
    """A started server container seen through readiness.ServerHandle: its state from inspect,
    its log followed by a background reader. Only the current run's log counts (``since`` its
    start): a container started again keeps the lines of its earlier runs, which must not be read
    as this run's phases or failure."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.since = started_at(container)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._stream = container.logs(stream=True, follow=True, stdout=True, stderr=True, since=self.since)
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()

    def _follow(self) -> None:
        partial = ""
        try:
            for chunk in self._stream:
                partial += chunk.decode("utf-8", errors="replace")
                *complete, partial = partial.split("\n")
                with self._lock:
                    self._lines.extend(complete)
        except (docker.errors.DockerException, OSError, ValueError):
            pass  # the stream breaks when the container stops or the reader is closed: nothing to read
        if partial:
            with self._lock:
                self._lines.append(partial)

    def new_log_lines(self) -> list[str]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def state(self) -> ProcessState:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return ProcessState(running=False, status="removed")
        state = self.container.attrs.get("State", {})
        running = state.get("Status") == "running" and not state.get("Restarting")
        return ProcessState(running=running, exit_code=None if running else state.get("ExitCode"),
                            restarts=int(self.container.attrs.get("RestartCount", 0)),
                            oom_killed=bool(state.get("OOMKilled")), status=str(state.get("Status", "")))

    def log_text(self, tail: int = 400) -> str:
        try:
            data: bytes = self.container.logs(stdout=True, stderr=True, tail=tail, since=self.since)
            return data.decode("utf-8", errors="replace")
        except docker.errors.NotFound:
            return ""

    def close(self) -> None:
        try:
            self._stream.close()
        except (OSError, AttributeError):
            pass  # already closed with its container


class ExecHealthProbe:
    """GET /health_generate from inside the container, for a Docker daemon on another machine
    (the published port is on that machine's loopback). Needs python3 in the image, as sglang has."""

    def __init__(self, container: Container, port: int) -> None:
        self.container = container
        self.code = (
            "import urllib.request, urllib.error\n"
            "try:\n"
            f"    print(urllib.request.urlopen('http://127.0.0.1:{port}/health_generate', timeout=25).status)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code)\n"
            "except Exception:\n"
            "    print(0)\n")

    def __call__(self) -> int | None:
        try:
            result = self.container.exec_run(["python3", "-c", self.code])
        except docker.errors.APIError:
            return None
        output = result.output.decode(errors="replace").strip() if result.output else ""
        return int(output) if output.isdigit() and output != "0" else None
