"""Small helpers of the lab: commands run with one-line errors, idempotent writes, the lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpunode_lab.contract import LAB_DIR, LOCK_FILE, LXC_PATH, LabContainer, LabError, REQUIRED_COMMANDS

def noop(_: str) -> None:
    pass


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run(cmd: Sequence[str], *, check: bool = True, timeout: float = 120, what: str = "",
         fix: str = "", env: dict[str, str] | None = None,
         input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure (check) raise LabError naming it."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise LabError(f"{cmd[0]} not found: apt-get install {REQUIRED_COMMANDS.get(cmd[0], cmd[0])}") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{what or ' '.join(cmd)}: timed out after {timeout:.0f} s"
                       + (f"; {fix}" if fix else "")) from None
    if check and proc.returncode != 0:
        detail = one_line(proc.stderr) or one_line(proc.stdout) or f"exit status {proc.returncode}"
        raise LabError(f"{what or ' '.join(cmd)} failed: {detail}" + (f"; {fix}" if fix else ""))
    return proc


def ok(cmd: Sequence[str], timeout: float = 30) -> bool:
    try:
        return subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def write_if_changed(path: Path, content: str | bytes, mode: int | None = None) -> bool:
    """Write content to path unless it is already there (and has the mode); True if changed."""
    data = content.encode() if isinstance(content, str) else content
    changed = False
    if path.is_symlink() or not path.is_file() or path.read_bytes() != data:
        if path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".gpunode-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode if mode is not None else 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
        changed = True
    if mode is not None and stat.S_IMODE(path.stat().st_mode) != mode:
        os.chmod(path, mode)
        changed = True
    return changed


def tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:])


def pid_alive(pid: int, needle: str) -> bool:
    """True if process pid runs and its command line contains needle."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and needle in cmdline


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (it makes device nodes, a bridge, iptables rules and an LXC "
                       "container): run it as root, e.g. `sudo gpunode lab up`")


def require_commands(names: Sequence[str]) -> None:
    missing = sorted({REQUIRED_COMMANDS.get(n, n) for n in names if shutil.which(n) is None})
    if missing:
        cmds = ", ".join(n for n in names if shutil.which(n) is None)
        raise LabError(f"missing command(s) {cmds}: apt-get install {' '.join(missing)}")


@contextlib.contextmanager
def locked() -> Iterator[None]:
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(LAB_DIR, 0o755)
    with open(LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"another `gpunode lab` command holds {LOCK_FILE}: wait for it to finish") from None
        yield


def lxc(ct: LabContainer, cmd: str, *args: str) -> list[str]:
    return [cmd, "-P", str(LXC_PATH), "-n", ct.name, *args]
