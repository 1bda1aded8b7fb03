"""fakepve, run as gpunode.lab.pve on loopback with its own CA and a random root@pam password."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from gpunode.lab.contract import (
    CERT_MAX_AGE_S, HOST_ROOTFS, LXC_PATH, LabError, PVE_CA, PVE_CERT, PVE_DIR, PVE_GUESTS, PVE_HOST,
    PVE_KEY, PVE_LOG, PVE_MODULE, PVE_MOUNTS, PVE_PASSWORD_FILE, PVE_PID_FILE, PVE_PORT, PVE_URL,
    PVE_USER, Progress,
)
from gpunode.lab.util import pid_alive, read_pid, run, tail, write_if_changed

def _pve_password() -> str:
    return PVE_PASSWORD_FILE.read_text()


def pve_ticket(password: str | None = None, cafile: str | None = None, timeout: float = 5) -> dict[str, object]:
    """POST /access/ticket to fakepve, verifying TLS against cafile (default LAB_DIR/pve/ca.pem);
    returns the `data` of the answer. Raises urllib/ssl errors as they come."""
    ctx = ssl.create_default_context(cafile=cafile or str(PVE_CA))
    body = urllib.parse.urlencode({"username": PVE_USER,
                                   "password": _pve_password() if password is None else password}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(urllib.request.Request(f"{PVE_URL}/api2/json/access/ticket", data=body), timeout=timeout) as r:
        data = json.load(r)["data"]
    if not isinstance(data, dict) or "ticket" not in data:
        raise ValueError(f"no ticket in the answer: {data!r}")
    return data


def pve_answers() -> bool:
    try:
        pve_ticket()
        return True
    except (OSError, ValueError, KeyError, ssl.SSLError):
        return False


def stop_pve() -> bool:
    pid = read_pid(PVE_PID_FILE)
    stopped = False
    if pid and pid_alive(pid, "fakepve"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(50):
            if not pid_alive(pid, "fakepve"):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stopped = True
    PVE_PID_FILE.unlink(missing_ok=True)
    return stopped


def ensure_pve(progress: Progress) -> bool:
    changed = False
    PVE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(PVE_DIR, 0o755)
    if run([sys.executable, "-c", "import fakepve.certs, cryptography"], check=False).returncode != 0:
        raise LabError(f"fakepve is not installed for {sys.executable}: pip install 'gpunode[test]' "
                       "(fakepve[crypto])")
    if not PVE_PASSWORD_FILE.is_file() or not PVE_PASSWORD_FILE.read_text():
        changed |= write_if_changed(PVE_PASSWORD_FILE, secrets.token_urlsafe(24), 0o600)
    elif stat.S_IMODE(PVE_PASSWORD_FILE.stat().st_mode) != 0o600:
        os.chmod(PVE_PASSWORD_FILE, 0o600)
        changed = True
    changed |= write_if_changed(PVE_GUESTS, json.dumps({"guests": []}) + "\n", 0o644)
    cert_old = not PVE_CERT.is_file() or not PVE_KEY.is_file() or \
        time.time() - PVE_CERT.stat().st_mtime > CERT_MAX_AGE_S
    if cert_old:
        code = ("import sys; from fakepve.certs import make_cert; "
                "make_cert(sys.argv[1], name='fakepve', hosts=(sys.argv[2],))")
        run([sys.executable, "-c", code, str(PVE_DIR), PVE_HOST], what="fakepve.certs.make_cert")
        changed = True
    changed |= write_if_changed(PVE_CA, PVE_CERT.read_bytes(), 0o644)
    pid = read_pid(PVE_PID_FILE)
    running = pid is not None and pid_alive(pid, "fakepve")
    # A lab made before gpunode.lab.pve runs plain `python -m fakepve` (or gpunode.labpve): that one is replaced.
    current = running and pid is not None and pid_alive(pid, PVE_MODULE)
    if current and not changed and pve_answers():
        progress(f"fakepve: answering on {PVE_URL}")
        return False
    if running:
        stop_pve()
    progress(f"fakepve: starting on {PVE_URL} (log {PVE_LOG})")
    # The command line names fakepve (its certificate, PVE_CERT): stop_pve finds the process by
    # that word.
    cmd = [sys.executable, "-m", PVE_MODULE, str(PVE_GUESTS), "--host", PVE_HOST, "--port", str(PVE_PORT),
           "--user", PVE_USER, "--time-scale", "0", "--cert", str(PVE_CERT), "--key", str(PVE_KEY),
           "--lxcpath", str(LXC_PATH), "--host-rootfs", str(HOST_ROOTFS), "--state", str(PVE_MOUNTS)]
    env = dict(os.environ, PVE_PASS=_pve_password())
    env.pop("PVE_USER", None)
    with open(PVE_LOG, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, close_fds=True)
    PVE_PID_FILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            PVE_PID_FILE.unlink(missing_ok=True)
            raise LabError(f"fakepve exited with status {proc.returncode}: {tail(PVE_LOG)} (see {PVE_LOG}; "
                           f"is {PVE_HOST}:{PVE_PORT} taken?)")
        if pve_answers():
            progress(f"fakepve: answering on {PVE_URL}")
            return True
        time.sleep(0.3)
    raise LabError(f"fakepve did not answer a ticket request on {PVE_URL} within 30 s: see {PVE_LOG}")
