"""Run the fake SGLang server as a local process, and watch it the way readiness watches a
container (``gpunode.stages.serve.readiness.ServerHandle``). The server gets its port as a socket bound
here and handed over (held_socket_server.py), so the other xdist worker cannot take it meanwhile."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpunode.stages.serve.readiness import ProcessState

from .held_socket_server import FD_VARIABLE
from .ports import bound_socket, port_of

HELD_SOCKET_SERVER = Path(__file__).with_name("held_socket_server.py")


def model_dir(root: Path) -> Path:
    """A model directory the fake accepts (it checks for config.json, as transformers would)."""
    folder = root / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}')
    (folder / "tokenizer.json").write_text("{}")
    return folder


class FakeProcess:
    """The fake server as a child process with its stderr in a file, serving on ``sock`` (bound,
    not listening; the child inherits it and the caller closes its own copy)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_path: Path, sock: socket.socket) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        fd = sock.fileno()
        self.proc = subprocess.Popen([sys.executable, str(HELD_SOCKET_SERVER), *args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env={**os.environ, **env, FD_VARIABLE: str(fd)},
                                     pass_fds=(fd,))
        self._offset = 0
        self._partial = ""

    # readiness.ServerHandle
    def state(self) -> ProcessState:
        code = self.proc.poll()
        return ProcessState(running=code is None, exit_code=code, status="running" if code is None else "exited")

    def new_log_lines(self) -> list[str]:
        with open(self.log_path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        *lines, self._partial = text.split("\n")
        return lines

    def log_text(self, tail: int = 400) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _gone(process: FakeProcess | None) -> None:
    if process is not None and process.proc.poll() is not None:
        raise RuntimeError(f"the fake server exited ({process.proc.returncode}):\n{process.log_text(40)}")


def wait_port(port: int, timeout_s: float = 30.0, process: FakeProcess | None = None) -> None:
    """Until the port accepts a connection (the server listens); fails at once when ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _gone(process)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"the fake server did not open port {port} in {timeout_s:.0f} s")


@contextmanager
def fake_server(tmp: Path, *, served_name: str = "glm-5", api_key: str | None = None,
                env: Mapping[str, str] | None = None, extra_args: Sequence[str] = (),
                wait: bool = True, parsers: bool = True) -> Iterator[tuple[FakeProcess, str]]:
    """Start the fake (fast timings unless ``env`` says otherwise); yields it and its base URL.
    ``parsers``: the profile's --reasoning-parser and --tool-call-parser, as the launch has them."""
    with bound_socket() as sock:
        port = port_of(sock)
        process = _start(tmp, port, sock, served_name, api_key, env, extra_args, parsers)
    # Only the child holds the socket now: once it exits, connections are refused, not left queued.
    try:
        if wait:
            wait_port(port, process=process)
            deadline = time.monotonic() + 30
            while "fired up" not in process.log_path.read_text(errors="replace"):
                _gone(process)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fake server did not fire up in 30 s:\n{process.log_text(40)}")
                time.sleep(0.02)
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def _start(tmp: Path, port: int, sock: socket.socket, served_name: str, api_key: str | None,
           env: Mapping[str, str] | None, extra_args: Sequence[str], parsers: bool) -> FakeProcess:
    args = ["--model-path", str(model_dir(tmp)), "--served-model-name", served_name, "--host", "127.0.0.1",
            "--port", str(port), "--tp-size", "2",
            *(["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"] if parsers else []), *extra_args]
    if api_key:
        args += ["--api-key", api_key]
    quick = {"FAKE_SGLANG_LOAD_S": "0.05", "FAKE_SGLANG_AUTOTUNE_S": "0.01", "FAKE_SGLANG_WARMUP_S": "0.05",
             "FAKE_SGLANG_HEALTH_TICK_S": "0.05", "FAKE_SGLANG_TOKEN_S": "0.001", "FAKE_SGLANG_TTFT_S": "0.002",
             "FAKE_SGLANG_DRAIN_TICK_S": "0.05"}
    return FakeProcess(args, {**quick, **(env or {})}, tmp / f"fake-{port}.log", sock)
