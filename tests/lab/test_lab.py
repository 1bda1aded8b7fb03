"""The local lab (gpunode.lab) stands in for a Proxmox host with GPUs: check that it really does.

Needs the lab up (`gpunode lab up`, as root); skipped otherwise, except under CI=true where a lab
that is not up is a failure.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest

import gpunode.lab as lab

pytestmark = pytest.mark.lab


def _ssh(*remote: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _rule_counts() -> dict[str, int]:
    counts = {}
    for table in ("nat", "filter"):
        out = subprocess.run(["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True,
                             check=True).stdout
        counts[table] = sum(1 for line in out.splitlines() if lab.IPTABLES_COMMENT in line)
    return counts


def test_container_running() -> None:
    out = subprocess.run(["lxc-info", "-P", str(lab.LXC_PATH), "-n", lab.CONTAINER_NAME, "-sH"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "RUNNING"
    assert _ssh("hostname").stdout.strip() == lab.CONTAINER_HOSTNAME
    assert _ssh("cat", "/proc/1/comm").stdout.strip() == "systemd"


def test_host_device_nodes() -> None:
    nodes = lab.device_nodes()
    assert len([n for n in nodes if n[len("nvidia"):].isdigit()]) == lab.LAB_GPU_COUNT
    uvm = int(lab.UVM_MAJOR_FILE.read_text())
    assert nodes["nvidia-uvm"] == (uvm, 0) and nodes["nvidia-uvm-tools"] == (uvm, 1)
    proc_devices = Path("/proc/devices").read_text().split("Block devices:")[0]
    assert f"\n{uvm} " not in proc_devices and f"\n{lab.NVIDIA_MAJOR} " not in proc_devices
    for name, (major, minor) in nodes.items():
        st = os.stat(lab.DEV_DIR / name)
        assert stat.S_ISCHR(st.st_mode), name
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor), name
        assert stat.S_IMODE(st.st_mode) == 0o666, name


def test_device_nodes_in_container_match_host() -> None:
    script = ("import glob, json, os, stat; print(json.dumps({p[5:]: [stat.S_ISCHR(s.st_mode), os.major(s.st_rdev), "
              "os.minor(s.st_rdev)] for p in sorted(glob.glob('/dev/nvidia*')) for s in [os.stat(p)]}))")
    proc = _ssh("python3", "-c", f'"{script}"')
    assert proc.returncode == 0, proc.stderr
    inside = json.loads(proc.stdout)
    host = {}
    for name in lab.device_nodes():
        st = os.stat(lab.DEV_DIR / name)
        host[name] = [True, os.major(st.st_rdev), os.minor(st.st_rdev)]
    assert inside == host


def test_open_gives_enxio_not_eperm() -> None:
    script = ("import errno, sys\nfor p in sys.argv[1:]:\n"
              "    try:\n        open(p, 'rb').close(); print(p, 0)\n"
              "    except OSError as e:\n        print(p, e.errno)")
    paths = [f"/dev/{name}" for name in lab.device_nodes()]
    proc = subprocess.run(lab.ssh_command("python3", "-", *paths), input=script, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = dict(line.split() for line in proc.stdout.splitlines())
    assert result == {p: "6" for p in paths}  # ENXIO: allowed by the cgroup, no driver behind it


def test_apt_sources_and_update() -> None:
    proc = _ssh("sh", "-c", "'cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null'")
    sources = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert sources
    assert "security.debian.org" not in proc.stdout
    assert all(" http://deb.debian.org/debian " in ln for ln in sources), sources
    suites = {ln.split()[2] for ln in sources}
    assert suites == {"bookworm", "bookworm-updates"}
    upd = _ssh("apt-get", "-q", "update", timeout=180)
    assert upd.returncode == 0, upd.stderr
    assert not [ln for ln in (upd.stdout + upd.stderr).splitlines() if ln.startswith(("W:", "E:", "Err:"))]


def test_https_from_container_trusts_host_ca() -> None:
    # TLS may be intercepted: the container must trust what the host trusts.
    script = "import urllib.request as u; print(u.urlopen('https://deb.debian.org/debian/', timeout=20).status)"
    proc = _ssh("python3", "-c", f'"{script}"', timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "200", proc.stderr


def test_known_hosts_pins_container_key() -> None:
    line = lab.KNOWN_HOSTS.read_text().split()
    hostkey = (lab.ROOTFS / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    assert line == [lab.CONTAINER_IP, *hostkey[:2]]
    assert _ssh("true").returncode == 0


def test_fakepve_ticket_verified_against_lab_ca() -> None:
    data = lab.pve_ticket()
    assert data["username"] == lab.PVE_USER
    assert str(data["ticket"]).startswith("PVE:")


def test_fakepve_refused_with_system_bundle() -> None:
    with pytest.raises(urllib.error.URLError) as exc:
        lab.pve_ticket(cafile=str(lab.HOST_CA_BUNDLE))
    assert isinstance(exc.value.reason, ssl.SSLCertVerificationError)


def test_fakepve_wrong_password_refused() -> None:
    with pytest.raises(urllib.error.HTTPError) as exc:
        lab.pve_ticket(password="not-the-password")
    assert exc.value.code == 401


def test_fakepve_password_file() -> None:
    st = os.stat(lab.PVE_PASSWORD_FILE)
    assert stat.S_IMODE(st.st_mode) == 0o600
    password = lab.PVE_PASSWORD_FILE.read_text()
    assert password and "\n" not in password
    pid = int(lab.PVE_PID_FILE.read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert "fakepve" in cmdline and password not in cmdline


def test_config_block() -> None:
    config = lab.CONTAINER_CONFIG.read_text()
    assert config.count(lab.CONFIG_BEGIN) == 1 and config.count(lab.CONFIG_END) == 1
    key = lab.cgroup_device_key()
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert key == ("lxc.cgroup2.devices.allow" if v2 else "lxc.cgroup.devices.allow")
    for name, (major, minor) in lab.device_nodes().items():
        assert f"{key} = c {major}:{minor} rwm\n" in config
        assert f"lxc.mount.entry = {lab.DEV_DIR / name} dev/{name} none bind,optional,create=file\n" in config
    assert f"lxc.net.0.ipv4.address = {lab.CONTAINER_IP}/24\n" in config


def test_status_reports_everything(lab_status: dict[str, object]) -> None:
    st = lab.status()
    assert st["up"] is True and st["dockerd"] is True and st["iptables"] is True and st["ssh"] is True
    assert st["bridge"] == {"name": lab.BRIDGE, "present": True, "address": lab.BRIDGE_CIDR, "up": True}
    assert st["container"]["state"] == "RUNNING"  # type: ignore[index]
    assert st["container_ip"] == lab.CONTAINER_IP
    assert st["devices"] == {n: f"{a}:{b}" for n, (a, b) in lab.device_nodes().items()}
    assert st["fakepve"]["answering"] is True  # type: ignore[index]
    json.dumps(st)


def test_second_up_is_fast_and_changes_nothing() -> None:
    config = lab.CONTAINER_CONFIG.read_text()
    rules = _rule_counts()
    assert rules == {"nat": 1, "filter": 2}
    pid = lab.PVE_PID_FILE.read_text()
    messages: list[str] = []
    start = time.monotonic()
    info = lab.up(messages.append)
    elapsed = time.monotonic() - start
    assert info.changed == [], messages
    assert elapsed < 15, messages
    assert lab.CONTAINER_CONFIG.read_text() == config
    assert _rule_counts() == rules
    assert lab.PVE_PID_FILE.read_text() == pid
    assert info.container_ip == lab.CONTAINER_IP and info.pve_node == lab.PVE_NODE
