"""Reach a node's Docker engine (and its loopback ports) from where gpunode runs, over SSH.

OpenSSH forwards the node's /var/run/docker.sock to a private local socket, with the same key and
pinned host key as Ansible uses; the Docker SDK then talks to ``unix://`` that socket. The server
binds to the node's loopback by default, so its port is forwarded the same way for the smoke test.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpunode.ground.paths import control_path_dir
from gpunode.hostfile import Ssh
from gpunode.hostfile.fleet import reached_at


class EngineUnreachable(Exception):
    """The SSH forward to a node could not be opened."""


# A port to forward: a port on the machine's loopback, or (the address the machine itself reaches it
# at, the port) for a server bound to an address of its own (a published port listens there only).
Port = int | tuple[str, int]


@dataclass(frozen=True)
class Forward:
    docker_url: str | None  # None: this machine's own engine
    ports: dict[int, int]  # the machine's port -> local port
    hosts: dict[int, str] = field(default_factory=dict)  # the machine's port -> where it is reached here

    def at(self, port: int) -> str:
        """``host:port`` where this machine reaches the machine's ``port`` (a URL's authority)."""
        return f"{self.hosts.get(port, '127.0.0.1')}:{self.ports[port]}"


def probe_address(bind: str) -> str:
    """Where the machine itself reaches a server bound to ``bind``: ``bind``, or its loopback when it
    binds all (0.0.0.0, ::); an IPv6 literal in brackets, as ssh's -L and a URL take it."""
    return reached_at(bind, "127.0.0.1" if ipaddress.ip_address(bind).version == 4 else "::1")


def served_at(bind: str, port: int) -> tuple[str, int]:
    """A port published on ``bind``, as forward takes it: where the machine reaches it, and the port
    (a published port listens on its bind address only)."""
    return probe_address(bind), port


def docker_client(docker_url: str | None):  # -> docker.DockerClient (imported lazily: it is heavy)
    """The engine at ``docker_url`` (e.g. a forward's unix:// socket), else this machine's own."""
    import docker

    return docker.DockerClient(base_url=docker_url) if docker_url else docker.from_env()


def ssh_options(ssh: Ssh) -> list[str]:
    """``ssh`` and its options, each value inside its own option argument."""
    argv = ["ssh", f"-p{ssh.port}", "-oBatchMode=yes", "-oExitOnForwardFailure=yes", "-oServerAliveInterval=15"]
    if ssh.key_file is not None:
        argv.append(f"-i{ssh.key_file.expanduser()}")
    if ssh.known_hosts is not None:
        argv += [f"-oUserKnownHostsFile={ssh.known_hosts.expanduser()}", "-oStrictHostKeyChecking=yes"]
    return argv


def shared_connection() -> list[str]:
    """Options that run a command over the machine's shared SSH connection (gpunode's ansible.cfg's
    ControlPath, so the same socket for the same user, address and port, which `gpunode check` uses
    too), opened when there is none: a command then costs a round trip, not a handshake (about 0.3 s;
    issue 36). Provision's own tasks go through Mitogen's connection, which opens no such socket."""
    folder = control_path_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return ["-oControlMaster=auto", "-oControlPersist=60s", f"-oControlPath={folder}/%C"]


def ssh_base(ssh: Ssh, *options: str, shared: bool = True) -> list[str]:
    """ssh to the node, ready for a remote command: the destination after ``--``, so that nothing
    from the host file can be read as an option (``-oProxyCommand=...`` runs a command here).
    ``shared``: over the machine's shared connection; a forward has a connection of its own, since
    a master keeps what a client forwarded through it after that client is gone."""
    return [*ssh_options(ssh), *(shared_connection() if shared else ()), *options, "--", f"{ssh.user}@{ssh.address}"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def forward(ssh: Ssh, ports: tuple[Port, ...] = (), timeout_s: float = 20.0) -> Iterator[Forward]:
    """Forward the node's Docker socket (and ``ports``) for the duration of the block."""
    targets = {number: address for address, number in (
        (("127.0.0.1", port) if isinstance(port, int) else port) for port in ports)}
    if ssh.connection == "local":
        yield Forward(None, {port: port for port in targets}, targets)
        return
    folder = Path(tempfile.mkdtemp(prefix="gpunode-engine-"))
    folder.chmod(0o700)
    sock = folder / "docker.sock"
    local_ports = {port: _free_port() for port in targets}
    forwards = [f"-L{sock}:/var/run/docker.sock"]
    forwards += [f"-L127.0.0.1:{local}:{targets[remote]}:{remote}" for remote, local in local_ports.items()]
    argv = ssh_base(ssh, "-nNT", *forwards, shared=False)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not sock.exists():
            if proc.poll() is not None:
                raise EngineUnreachable(f"ssh to {ssh.user}@{ssh.address} could not forward Docker's socket: "
                                        f"{(proc.stderr.read() if proc.stderr else '').strip() or 'exited'}")
            if time.monotonic() > deadline:
                raise EngineUnreachable(f"ssh to {ssh.user}@{ssh.address}: no forwarded socket after {timeout_s:g} s")
            time.sleep(0.05)
        yield Forward(f"unix://{sock}", local_ports)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


def _read_on_node(ssh: Ssh, command: str, path: str, timeout_s: float) -> str | None:
    """``command -- path`` on the node: its output, None when the path is absent; an SSH that fails
    otherwise is EngineUnreachable (never "absent": a check that read nothing must not pass)."""
    # The remote command is read by the node's shell: the path goes quoted, after "--".
    proc = subprocess.run(ssh_base(ssh) + [f"{command} -- {shlex.quote(path)}"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode == 0:
        return proc.stdout
    if "No such file" in proc.stderr:
        return None
    raise EngineUnreachable(f"ssh to {ssh.user}@{ssh.address} could not read {path}: "
                            f"{proc.stderr.strip() or f'exit {proc.returncode}'}")


def read_file(ssh: Ssh, path: str, timeout_s: float = 20.0) -> str | None:
    """A file on the node (the node stage's records and CDI spec), or None when it is absent."""
    if ssh.connection == "local":
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None
    return _read_on_node(ssh, "cat", path, timeout_s)


def link_count(ssh: Ssh, path: str, timeout_s: float = 20.0) -> int | None:
    """A folder's link count on the node (0: deleted on the host, yet still mounted), None where absent."""
    if ssh.connection == "local":
        try:
            return os.stat(path).st_nlink
        except FileNotFoundError:
            return None
    out = _read_on_node(ssh, "stat -c %h", path, timeout_s)
    if out is None:
        return None
    if not out.strip().isdigit():
        raise EngineUnreachable(f"ssh to {ssh.user}@{ssh.address}: stat of {path} said {out.strip()[:80]!r}")
    return int(out)
