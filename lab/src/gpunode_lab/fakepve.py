"""fakepve, run as gpunode_lab.pve on loopback with its own CA and a random root@pam password: one
per lab site (a Proxmox host of the lab), each on its own loopback address."""

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
from pathlib import Path

from gpunode_lab.contract import (
    CERT_MAX_AGE_S, LXC_PATH, PVE_MODULE, PVE_PORT, PVE_USER, SITE, LabError, LabSite, Progress,
)
from gpunode_lab.util import pid_alive, read_pid, run, tail, write_if_changed

def _pve_password(site: LabSite = SITE) -> str:
    return site.pve_password_file.read_text()


def pve_ticket(password: str | None = None, cafile: str | None = None, timeout: float = 5,
               site: LabSite = SITE) -> dict[str, object]:
    """POST /access/ticket to the site's fakepve, verifying TLS against cafile (default its CA);
    returns the `data` of the answer. Raises urllib/ssl errors as they come."""
    ctx = ssl.create_default_context(cafile=cafile or str(site.pve_ca))
    body = urllib.parse.urlencode({"username": PVE_USER,
                                   "password": _pve_password(site) if password is None else password}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(urllib.request.Request(f"{site.pve_url}/api2/json/access/ticket", data=body),
                     timeout=timeout) as r:
        data = json.load(r)["data"]
    if not isinstance(data, dict) or "ticket" not in data:
        raise ValueError(f"no ticket in the answer: {data!r}")
    return data


def pve_answers(site: LabSite = SITE) -> bool:
    try:
        pve_ticket(site=site)
        return True
    except (OSError, ValueError, KeyError, ssl.SSLError):
        return False


def stop_pve(site: LabSite = SITE) -> bool:
    pid = read_pid(site.pve_pid_file)
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
    site.pve_pid_file.unlink(missing_ok=True)
    return stopped


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def ensure_pve(progress: Progress, site: LabSite = SITE) -> bool:
    changed = False
    site.pve_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(site.pve_dir, 0o755)
    if run([sys.executable, "-c", "import fakepve.certs, cryptography"], check=False).returncode != 0:
        raise LabError(f"fakepve is not installed for {sys.executable}: pip install 'gpunode[test]' "
                       "(fakepve[crypto])")
    password_file = site.pve_password_file
    if not password_file.is_file() or not password_file.read_text():
        changed |= write_if_changed(password_file, secrets.token_urlsafe(24), 0o600)
    elif stat.S_IMODE(password_file.stat().st_mode) != 0o600:
        os.chmod(password_file, 0o600)
        changed = True
    changed |= write_if_changed(site.pve_guests, json.dumps({"guests": []}) + "\n", 0o644)
    cert_old = not site.pve_cert.is_file() or not site.pve_key.is_file() or \
        time.time() - site.pve_cert.stat().st_mtime > CERT_MAX_AGE_S
    if cert_old:
        code = ("import sys; from fakepve.certs import make_cert; "
                "make_cert(sys.argv[1], name='fakepve', hosts=(sys.argv[2],))")
        run([sys.executable, "-c", code, str(site.pve_dir), site.pve_host], what="fakepve.certs.make_cert")
        changed = True
    changed |= write_if_changed(site.pve_ca, site.pve_cert.read_bytes(), 0o644)
    # The command line names fakepve (its certificate, the site's fakepve.crt): stop_pve finds the
    # process by that word. Its realizer mounts into the site's host container's rootfs.
    cmd = [sys.executable, "-m", PVE_MODULE, str(site.pve_guests), "--host", site.pve_host, "--port", str(PVE_PORT),
           "--user", PVE_USER, "--time-scale", "0", "--cert", str(site.pve_cert), "--key", str(site.pve_key),
           "--lxcpath", str(LXC_PATH), "--host-rootfs", str(site.host.rootfs), "--state", str(site.pve_mounts),
           "--host-container", site.host.name]
    pid = read_pid(site.pve_pid_file)
    running = pid is not None and pid_alive(pid, "fakepve")
    # A lab made before gpunode_lab.pve runs plain `python -m fakepve` (or gpunode.labpve): that one is replaced.
    # One started with another command line (an older gpunode's) is replaced too.
    current = running and pid is not None and pid_alive(pid, PVE_MODULE) and _cmdline(pid) == cmd
    if current and not changed and pve_answers(site):
        progress(f"fakepve: answering on {site.pve_url}")
        return False
    if running:
        stop_pve(site)
    progress(f"fakepve: starting on {site.pve_url} (log {site.pve_log})")
    env = dict(os.environ, PVE_PASS=_pve_password(site))
    env.pop("PVE_USER", None)
    with open(site.pve_log, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, close_fds=True)
    site.pve_pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            site.pve_pid_file.unlink(missing_ok=True)
            raise LabError(f"fakepve exited with status {proc.returncode}: {tail(site.pve_log)} (see {site.pve_log}; "
                           f"is {site.pve_host}:{PVE_PORT} taken?)")
        if pve_answers(site):
            progress(f"fakepve: answering on {site.pve_url}")
            return True
        time.sleep(0.3)
    raise LabError(f"fakepve did not answer a ticket request on {site.pve_url} within 30 s: see {site.pve_log}")
