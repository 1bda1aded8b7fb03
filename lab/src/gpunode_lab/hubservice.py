"""The lab's Hub as a service on the lab Proxmox host: gpunode_lab.hub (stdlib only) copied there alone
and run by the host's own python3 under systemd on its loopback, serving a checkpoint made with the real
safetensors library (gpunode_lab.checkpoint). The model stage's tools, which run on that host, fetch
from it through ``model.endpoint``; the lab's tests reach its log and faults with ``call``."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from gpunode_lab import checkpoint, hub
from gpunode_lab.contract import (
    HUB_CODE, HUB_PORT, HUB_REPO, HUB_ROOT, HUB_SHARD_BYTES, HUB_SHARDS, HUB_UNIT, HUB_URL, LabContainer, LabError,
    Progress,
)
from gpunode_lab.util import lxc, ok, one_line, run, write_if_changed

UNIT = f"""[Unit]
Description=gpunode lab: the Hub stand-in (gpunode_lab.hub) on the loopback
After=network.target

[Service]
ExecStart=/usr/bin/python3 {HUB_CODE} --root {HUB_ROOT} --port {HUB_PORT} --host 127.0.0.1
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def repo_dir(ct: LabContainer) -> Path:
    return ct.rootfs / HUB_ROOT.lstrip("/") / HUB_REPO


def commit(ct: LabContainer) -> str:
    """The commit the Hub serves (deterministic: the checkpoint's bytes and names)."""
    return hub.commit_of(repo_dir(ct))


def _files() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.make(tmp, shards=HUB_SHARDS, shard_bytes=HUB_SHARD_BYTES)
        return {f.name: f.read_bytes() for f in sorted(Path(tmp).iterdir())
                if f.is_file() and not f.name.startswith(hub.HIDDEN_PREFIX)}  # the stand-in's own hash cache


def call(ct: LabContainer, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
    """A request to the Hub from inside the host (it listens on the host's loopback only); its JSON."""
    program = ("import json, sys, urllib.request as u; a = json.loads(sys.argv[1]); "
               "d = a['body'] and a['body'].encode(); "
               "r = u.Request(a['url'], method=a['method'], data=d, headers={'Content-Type': 'application/json'}); "
               "print(u.urlopen(r, timeout=a['timeout']).read().decode())")
    request = {"url": HUB_URL + path, "method": method, "timeout": timeout,
               "body": None if body is None else json.dumps(body)}
    proc = run(lxc(ct, "lxc-attach", "--", "python3", "-c", program, json.dumps(request)), timeout=timeout + 10,
               what=f"the lab Hub's {method} {path} on {ct.name}", check=False)
    if proc.returncode != 0:
        raise LabError(f"the lab Hub on {ct.name} did not answer {method} {path}: {one_line(proc.stderr)[-300:]}")
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def _answers(ct: LabContainer) -> bool:
    try:
        call(ct, "GET", "/_lab/faults", timeout=3)
    except LabError:
        return False
    return True


def ensure(progress: Progress, ct: LabContainer) -> bool:
    """The checkpoint, the stand-in's code and its unit in the host's rootfs; the service running and
    answering. A second run changes nothing."""
    changed = False
    for name, data in _files().items():
        changed |= write_if_changed(repo_dir(ct) / name, data, 0o644)
    changed |= write_if_changed(ct.rootfs / HUB_CODE.lstrip("/"), Path(hub.__file__).read_bytes(), 0o644)
    unit = ct.rootfs / "etc/systemd/system" / HUB_UNIT
    changed |= write_if_changed(unit, UNIT, 0o644)
    wants = unit.parent / "multi-user.target.wants" / HUB_UNIT
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to(f"/etc/systemd/system/{HUB_UNIT}")
        changed = True
    active = ok(lxc(ct, "lxc-attach", "--", "systemctl", "is-active", "--quiet", HUB_UNIT))
    if changed or not active:
        run(lxc(ct, "lxc-attach", "--", "systemctl", "daemon-reload"), timeout=60, what="systemctl daemon-reload")
        run(lxc(ct, "lxc-attach", "--", "systemctl", "restart", HUB_UNIT), timeout=60, what=f"starting {HUB_UNIT}",
            fix=f"lxc-attach -n {ct.name} -- journalctl -u {HUB_UNIT}")
        changed = True
    deadline = time.monotonic() + 30
    while not _answers(ct):
        if time.monotonic() > deadline:
            raise LabError(f"the lab Hub on {ct.name} does not answer at {HUB_URL}: "
                           f"lxc-attach -n {ct.name} -- journalctl -u {HUB_UNIT}")
        time.sleep(0.5)
    progress(f"hub: {HUB_REPO} at {commit(ct)} on {ct.name} {HUB_URL} " + ("started" if changed else "in place"))
    return changed
