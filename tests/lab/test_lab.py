"""The local lab (gpunode_lab) stands in for a Proxmox host with GPUs: check that it really does.

Needs the lab up (`gpunode lab up`, as root); skipped otherwise, except under CI (CI=1, true or
yes: tests/fakes/ci.py) where a lab that is not up is a failure.
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
from typing import Any

import pytest

import gpunode_lab as lab

pytestmark = pytest.mark.lab


def _ssh(*remote: str, timeout: float = 60, host: str = lab.CONTAINER_IP) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote, host=host), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _host_ssh(*remote: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _ssh(*remote, timeout=timeout, host=lab.HOST_CONTAINER_IP)


DEVICES_SCRIPT = ("import glob, json, os, stat; print(json.dumps({p[5:]: [stat.S_ISCHR(s.st_mode), os.major(s.st_rdev), "
                  "os.minor(s.st_rdev)] for p in sorted(glob.glob('/dev/nvidia*')) for s in [os.stat(p)]}))")
OPEN_SCRIPT = ("import errno, sys\nfor p in sys.argv[1:]:\n"
               "    try:\n        open(p, 'rb').close(); print(p, 0)\n"
               "    except OSError as e:\n        print(p, e.errno)")


def _host_devices() -> dict[str, list[object]]:
    host = {}
    for name in lab.device_nodes():
        st = os.stat(lab.DEV_DIR / name)
        host[name] = [True, os.major(st.st_rdev), os.minor(st.st_rdev)]
    return host


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


@pytest.mark.parametrize("host", [lab.CONTAINER_IP, lab.HOST_CONTAINER_IP])
def test_device_nodes_in_container_match_host(host: str) -> None:
    proc = _ssh("python3", "-c", f'"{DEVICES_SCRIPT}"', host=host)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _host_devices()


@pytest.mark.parametrize("host", [lab.CONTAINER_IP, lab.HOST_CONTAINER_IP])
def test_open_gives_enxio_not_eperm(host: str) -> None:
    paths = [f"/dev/{name}" for name in lab.device_nodes()]
    proc = subprocess.run(lab.ssh_command("python3", "-", *paths, host=host), input=OPEN_SCRIPT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = dict(line.split() for line in proc.stdout.splitlines())
    assert result == {p: "6" for p in paths}  # ENXIO: allowed by the cgroup, no driver behind it


def test_apt_sources_and_update() -> None:
    proc = _ssh("sh", "-c", "'cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null'")
    sources = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert sources
    assert "security.debian.org" not in proc.stdout
    # Debian 12's three archives, all from deb.debian.org (its security archive too, as a real Debian 12
    # keeps it: the template installs from it, and python3.11-venv needs its python3.11).
    assert sources == ["deb http://deb.debian.org/debian bookworm main",
                       "deb http://deb.debian.org/debian bookworm-updates main",
                       "deb http://deb.debian.org/debian-security bookworm-security main"], sources
    upd = _ssh("apt-get", "-q", "update", timeout=180)
    assert upd.returncode == 0, upd.stderr
    assert not [ln for ln in (upd.stdout + upd.stderr).splitlines() if ln.startswith(("W:", "E:", "Err:"))]


def test_https_from_container_trusts_host_ca() -> None:
    # TLS may be intercepted: the container must trust what the host trusts.
    script = "import urllib.request as u; print(u.urlopen('https://deb.debian.org/debian/', timeout=20).status)"
    proc = _ssh("python3", "-c", f'"{script}"', timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "200", proc.stderr


def test_known_hosts_pins_every_containers_key() -> None:
    """Every site's host and GPU containers (the fleet's sites too), each with its own key."""
    lines = [line.split() for line in lab.KNOWN_HOSTS.read_text().splitlines()]
    expected = []
    assert lab.LAB_CONTAINERS[:2] == (lab.GPU_CONTAINER, lab.HOST_CONTAINER) and len(lab.LAB_CONTAINERS) == 6
    for ct in lab.LAB_CONTAINERS:
        hostkey = (ct.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        expected.append([ct.ip, *hostkey[:2]])
    assert lines == expected
    assert len({line[2] for line in lines}) == 6
    assert _ssh("true").returncode == 0
    assert _host_ssh("true").returncode == 0
    for site in lab.SITES[1:]:
        assert _ssh("true", host=site.gpu.ip).returncode == 0 and _ssh("true", host=site.host.ip).returncode == 0


def test_host_container_running_with_systemd() -> None:
    out = subprocess.run(["lxc-info", "-P", str(lab.LXC_PATH), "-n", lab.HOST_CONTAINER_NAME, "-sH"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "RUNNING"
    assert _host_ssh("hostname").stdout.strip() == lab.HOST_CONTAINER_HOSTNAME
    assert _host_ssh("cat", "/proc/1/comm").stdout.strip() == "systemd"
    assert _host_ssh("ip", "-4", "-o", "addr", "show", "eth0").stdout.split()[3] == f"{lab.HOST_CONTAINER_IP}/24"


def test_host_container_ssh_is_strict(tmp_path: Path) -> None:
    cmd = lab.ssh_command("true", host=lab.HOST_CONTAINER_IP)
    assert "StrictHostKeyChecking=yes" in cmd and f"root@{lab.HOST_CONTAINER_IP}" in cmd
    assert subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    # The same command with a known_hosts that lacks the key must be refused.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    bad = [f"UserKnownHostsFile={empty}" if a.startswith("UserKnownHostsFile=") else a for a in cmd]
    proc = subprocess.run(bad, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr


def test_host_container_config_block() -> None:
    config = lab.HOST_CONTAINER.config.read_text()
    assert config.count(lab.CONFIG_BEGIN) == 1 and config.count(lab.CONFIG_END) == 1
    block = config[config.index(lab.CONFIG_BEGIN):]
    gpu = lab.CONTAINER_CONFIG.read_text()
    assert block == gpu[gpu.index(lab.CONFIG_BEGIN):].replace(f"{lab.CONTAINER_IP}/24", f"{lab.HOST_CONTAINER_IP}/24")


def test_host_container_facts() -> None:
    root = lab.LAB_HOST_FACTS_ROOT
    proc = _host_ssh("cat", f"{root}/proc/driver/nvidia/version", f"{root}/etc/os-release")
    assert proc.returncode == 0, proc.stderr
    assert "Open Kernel Module" in proc.stdout
    script = (f"import glob, os; ds = glob.glob('{root}/sys/bus/pci/devices/*/driver'); "
              "print(len(ds), all(os.path.islink(d) for d in ds), "
              "sorted({os.path.basename(os.path.realpath(d)) for d in ds}))")
    proc = _host_ssh("python3", "-c", f'"{script}"')
    assert proc.returncode == 0, proc.stderr
    count, links, names = proc.stdout.split(" ", 2)
    assert int(count) >= 1 and links == "True" and names.strip() == "['nvidia']"
    # Without the tarball's top folder, owned by root.
    assert not (lab.HOST_ROOTFS / root.lstrip("/") / "sysroot").exists()
    assert os.stat(lab.HOST_ROOTFS / root.lstrip("/") / "proc/driver/nvidia/version").st_uid == 0


def test_host_container_has_initramfs_tools_and_kmod() -> None:
    proc = _host_ssh("sh", "-c", "'command -v update-initramfs && command -v modprobe && "
                     "dpkg-query -W -f=\"\\${Status}\\n\" initramfs-tools kmod'")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["/usr/sbin/update-initramfs", "/usr/sbin/modprobe"]
    assert lines[2:] == ["install ok installed"] * 2
    # udev came with initramfs-tools: masked, as /sys is the real machine's.
    assert _host_ssh("systemctl", "is-enabled", "systemd-udevd.service").stdout.strip() == "masked"


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


def test_status_reports_everything(lab_status: dict[str, object], fleet_sites_whole: Any) -> None:
    with fleet_sites_whole():
        st = lab.status()
    assert st["up"] is True and st["dockerd"] is True and st["iptables"] is True and st["ssh"] is True
    assert st["bridge"] == {"name": lab.BRIDGE, "present": True, "address": lab.BRIDGE_CIDR, "up": True}
    assert st["container"]["state"] == "RUNNING"  # type: ignore[index]
    assert st["container_ip"] == lab.CONTAINER_IP
    assert st["devices"] == {n: f"{a}:{b}" for n, (a, b) in lab.device_nodes().items()}
    assert st["fakepve"]["answering"] is True  # type: ignore[index]
    host = st["host_container"]
    assert host["name"] == lab.HOST_CONTAINER_NAME and host["state"] == "RUNNING"  # type: ignore[index]
    assert host["ip"] == lab.HOST_CONTAINER_IP and host["ssh"] is True  # type: ignore[index]
    assert host["devices"] == st["devices"]  # type: ignore[index]
    assert host["facts"] is True and host["facts_root"] == lab.LAB_HOST_FACTS_ROOT  # type: ignore[index]
    json.dumps(st)


def test_second_up_is_fast_and_changes_nothing(fleet_sites_whole: Any) -> None:
    with fleet_sites_whole():
        _second_up_is_fast_and_changes_nothing()


def _second_up_is_fast_and_changes_nothing() -> None:
    config = lab.CONTAINER_CONFIG.read_text()
    host_config = lab.HOST_CONTAINER.config.read_text()
    known_hosts = lab.KNOWN_HOSTS.read_text()
    facts = lab.HOST_ROOTFS / lab.LAB_HOST_FACTS_ROOT.lstrip("/")
    facts_ino = os.stat(facts).st_ino
    host_pid = _host_ssh("systemctl", "show", "-P", "MainPID", "ssh").stdout
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
    assert lab.HOST_CONTAINER.config.read_text() == host_config
    assert lab.KNOWN_HOSTS.read_text() == known_hosts
    assert os.stat(facts).st_ino == facts_ino
    assert _host_ssh("systemctl", "show", "-P", "MainPID", "ssh").stdout == host_pid
    assert _rule_counts() == rules
    assert lab.PVE_PID_FILE.read_text() == pid
    assert info.container_ip == lab.CONTAINER_IP and info.pve_node == lab.PVE_NODE
    assert info.host_container == lab.HOST_CONTAINER_NAME and info.host_ip == lab.HOST_CONTAINER_IP
