"""The lab's two LXC containers (the GPU node and the Proxmox host stand-in): made, configured with
the devN-style hand-off, reachable over SSH; the model stand-in, the server stand-in's image and
the recorded host facts put in place."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tarfile
import time
from pathlib import Path

from gpunode_lab.contract import (
    BRIDGE, BRIDGE_IP, CONFIG_BEGIN, CONFIG_END, CONTAINER_IP, DEBIAN_MIRROR, DEBIAN_RELEASE, DEV_DIR,
    GPU_CONTAINER, HOST_CA_BUNDLE, HOST_DRIVER_LAYOUT, HOST_FACTS_TARBALL, KNOWN_HOSTS, LAB_CONTAINERS,
    LAB_HOST_FACTS_ROOT, LAB_MODEL_DIR, LXC_CACHE, LXC_PATH, LabContainer, LabError,
    MASKED_UNITS, PACKAGE_PROBES, Progress, SSH_DIR, SSH_KEY, SSH_PUBKEY, TEMPLATE_SECURITY_MIRROR,
)
from gpunode_lab.devices import device_nodes
from gpunode_lab.util import lxc, ok, one_line, run, tail, write_if_changed

def cgroup_device_key() -> str:
    """The LXC key for device rules on this host: lxc.cgroup2.devices.allow on a pure cgroup v2
    (unified) host, lxc.cgroup.devices.allow on cgroup v1 or hybrid (devices controller in v1)."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "lxc.cgroup2.devices.allow"
    return "lxc.cgroup.devices.allow"


def _config_block(ct: LabContainer, uvm: int) -> str:
    key = cgroup_device_key()
    lines = [
        CONFIG_BEGIN,
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {BRIDGE}",
        "lxc.net.0.flags = up",
        f"lxc.net.0.ipv4.address = {ct.cidr}",
        f"lxc.net.0.ipv4.gateway = {BRIDGE_IP}",
        "lxc.apparmor.profile = unconfined",
        f"{key} = a",
        "lxc.mount.auto = proc:rw sys:rw cgroup:rw",
    ]
    for name, (major, minor) in device_nodes(uvm).items():
        lines.append(f"{key} = c {major}:{minor} rwm")
        lines.append(f"lxc.mount.entry = {DEV_DIR / name} dev/{name} none bind,optional,create=file")
    lines.append(CONFIG_END)
    return "\n".join(lines) + "\n"


def _with_block(text: str, block: str) -> str:
    # Any block an earlier lab wrote, whatever its first line says of it (the package was gpunode.lab once).
    begin = CONFIG_BEGIN.split(":", 1)[0]
    pattern = re.compile(rf"\n*{re.escape(begin)}[^\n]*\n.*?{re.escape(CONFIG_END)}\n?", re.S)
    base = pattern.sub("\n", text).rstrip("\n")
    return base + "\n\n" + block


def container_state(ct: LabContainer = GPU_CONTAINER) -> str:
    """RUNNING, STOPPED, ... or ABSENT."""
    if not ct.config.exists():
        return "ABSENT"
    proc = run(lxc(ct, "lxc-info", "-sH"), check=False, timeout=20)
    return (proc.stdout.strip() or "UNKNOWN") if proc.returncode == 0 else "UNKNOWN"


def _create_container(progress: Progress, ct: LabContainer) -> None:
    cached = (LXC_CACHE / "debian" / f"rootfs-{DEBIAN_RELEASE}-amd64").is_dir()
    progress(f"container: creating {ct.name} ({'from the debootstrap cache' if cached else 'debootstrap'} "
             f"{DEBIAN_RELEASE}, packages {' '.join(ct.packages)}; log {ct.create_log})")
    LXC_PATH.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MIRROR=DEBIAN_MIRROR, SECURITY_MIRROR=TEMPLATE_SECURITY_MIRROR,
               LXC_CACHE_PATH=str(LXC_CACHE), DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    cmd = lxc(ct, "lxc-create", "-t", "debian", "--", "-r", DEBIAN_RELEASE,
               f"--packages={','.join(ct.packages)}", f"--mirror={DEBIAN_MIRROR}",
               f"--security-mirror={TEMPLATE_SECURITY_MIRROR}")
    with open(ct.create_log, "wb") as log:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, timeout=1800).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc != 0 or not ct.config.exists():
        raise LabError(f"lxc-create -t debian for {ct.name} failed ({tail(ct.create_log)}): see {ct.create_log}; "
                       f"check that {DEBIAN_MIRROR} answers")


def _ensure_packages(progress: Progress, ct: LabContainer) -> bool:
    """The template skips --packages silently when its apt-get update fails: install what is missing."""
    missing = [pkg for pkg in ct.packages if not (ct.rootfs / PACKAGE_PROBES[pkg]).exists()]
    if not missing:
        return False
    progress(f"container: installing {' '.join(missing)} in the rootfs of {ct.name}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    run(["chroot", str(ct.rootfs), "apt-get", "update"], env=env, timeout=600,
         what=f"apt-get update in the rootfs of {ct.name}", fix=f"check that {DEBIAN_MIRROR} answers")
    run(["chroot", str(ct.rootfs), "apt-get", "install", "-y", "--no-install-recommends", *missing], env=env,
         timeout=1200, what=f"apt-get install {' '.join(missing)} in the rootfs of {ct.name}")
    return True


def _host_nameservers() -> list[str]:
    for source in (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf")):
        try:
            text = source.read_text()
        except OSError:
            continue
        servers = [m for m in re.findall(r"^\s*nameserver\s+(\S+)", text, re.M)
                   if not m.startswith("127.") and m != "::1"]
        if servers:
            return servers
    raise LabError("no usable nameserver in /etc/resolv.conf (only loopback ones, which the container "
                   "cannot reach): add a real nameserver to the host's /etc/resolv.conf")


def _ensure_rootfs(progress: Progress, ct: LabContainer, pubkey: str) -> bool:
    """Files inside the container's rootfs; True if any changed."""
    if not HOST_CA_BUNDLE.is_file():
        raise LabError(f"{HOST_CA_BUNDLE} is missing: apt-get install ca-certificates")
    changed = False
    rootfs = ct.rootfs
    etc = rootfs / "etc"
    sources = (f"deb {DEBIAN_MIRROR} {DEBIAN_RELEASE} main\n"
               f"deb {DEBIAN_MIRROR} {DEBIAN_RELEASE}-updates main\n"
               f"deb {TEMPLATE_SECURITY_MIRROR} {DEBIAN_RELEASE}-security main\n")
    if write_if_changed(etc / "apt/sources.list", sources, 0o644):
        changed = True
        # New sources: the package lists of the old ones go and the cache reads as never updated, so
        # that the next apt task with a cache_valid_time updates (ansible's apt module dates the cache
        # by update-success-stamp, else by the lists folder's mtime: modules/apt.py get_cache_mtime).
        lists = rootfs / "var/lib/apt/lists"
        for stale in [*lists.glob("*_dists_*"), rootfs / "var/lib/apt/periodic/update-success-stamp"]:
            stale.unlink(missing_ok=True)
        if lists.is_dir():
            os.utime(lists, (0, 0))
    for extra in sorted((etc / "apt/sources.list.d").glob("*")):
        if extra.is_file() and "security.debian.org" in extra.read_text(errors="replace"):
            extra.unlink()
            changed = True
    resolv = "".join(f"nameserver {ns}\n" for ns in _host_nameservers())
    changed |= write_if_changed(etc / "resolv.conf", resolv, 0o644)
    bundle = HOST_CA_BUNDLE.read_bytes()
    changed |= write_if_changed(rootfs / "usr/local/share/ca-certificates/host-ca.crt", bundle, 0o644)
    # What update-ca-certificates would make of it; the bundle is the file OpenSSL and apt read.
    changed |= write_if_changed(etc / "ssl/certs/ca-certificates.crt", bundle, 0o644)
    changed |= write_if_changed(etc / "hostname", ct.hostname + "\n", 0o644)
    # LXC configures eth0 (static address and gateway) before init: ifupdown must leave it alone,
    # or networking.service waits for a DHCP server that is not there.
    changed |= write_if_changed(etc / "network/interfaces",
                                 "auto lo\niface lo inet loopback\n\niface eth0 inet manual\n", 0o644)
    # The container is privileged with /sys mounted read-write: a udevd in it (initramfs-tools pulls
    # udev in) would see and re-trigger the real machine's devices. Mask it, as a real LXC guest has.
    for unit in MASKED_UNITS:
        link = etc / "systemd/system" / unit
        if not (link.is_symlink() and os.readlink(link) == "/dev/null"):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink("/dev/null", link)
            changed = True
    ssh_dir = rootfs / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(ssh_dir.stat().st_mode) != 0o700:
        os.chmod(ssh_dir, 0o700)
        changed = True
    changed |= write_if_changed(ssh_dir / "authorized_keys", pubkey, 0o600)
    wants = etc / "systemd/system/multi-user.target.wants/ssh.service"
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/lib/systemd/system/ssh.service", wants)
        changed = True
    if not list((etc / "ssh").glob("ssh_host_ed25519_key*")):
        raise LabError(f"container {ct.name} has no ssh host key ({etc / 'ssh'}): run `gpunode lab down` and "
                       "`gpunode lab up` to rebuild it")
    progress(f"container: {ct.name} rootfs (apt sources, resolv.conf, CA bundle, hostname, ssh key) "
             + ("updated" if changed else "in place"))
    return changed


def ensure_model_stand_in(progress: Progress, ct: LabContainer, wanted: bool = True) -> bool:
    """The lab's checkpoint in the node at LAB_MODEL_DIR (model.source: node_path); where the site's host
    file fetches from the lab Hub instead, none: a leftover under the store's mount would hide a
    mount that is missing."""
    folder = ct.rootfs / LAB_MODEL_DIR.lstrip("/")
    changed = False
    from gpunode_lab.weights import files

    for name, data in files().items():
        if wanted:
            changed |= write_if_changed(folder / name, data, 0o644)
        elif (folder / name).is_file():
            (folder / name).unlink()
            changed = True
    state = ("written" if changed else "in place") if wanted else ("removed" if changed else "none (the store's mount)")
    progress(f"container: {ct.name} model stand-in {LAB_MODEL_DIR} {state}")
    return changed


def ensure_server_stand_in(progress: Progress) -> bool:
    """The fake SGLang server's image on this machine's engine (the image stage ships it to the node)."""
    import docker

    from gpunode_lab.image import ensure_fake_image, fake_tag

    client = docker.from_env()
    tag = fake_tag()  # hashes the fake's files: once
    had = bool(client.images.list(name=tag))
    if not had:
        progress(f"docker: building the stand-in server image {tag} (debootstrap, 1-2 minutes the first time)")
    try:
        tag = ensure_fake_image(client)
    except (docker.errors.DockerException, RuntimeError, subprocess.SubprocessError) as exc:
        raise LabError(f"the stand-in server image could not be built: {one_line(str(exc))}") from exc
    progress(f"docker: stand-in server image {tag} " + ("built" if not had else "in place"))
    return not had


def _ensure_driver_layout(progress: Progress, ct: LabContainer) -> bool:
    """The NVIDIA driver's files as recorded on the H200 (names, SONAME links, the real ld cache;
    stand-in contents) under LAB_HOST_FACTS_ROOT, where the host stage builds its driver tree from."""
    from gpunode_lab import driver

    fixture = HOST_DRIVER_LAYOUT
    if not (fixture / "layout.json").is_file():
        raise LabError(f"the recorded driver layout {fixture} is missing: reinstall gpunode (it is package data)")
    changed = driver.lay_out(fixture, ct.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/"))
    progress(f"facts: driver layout in {LAB_HOST_FACTS_ROOT} in {ct.name} {'written' if changed else 'in place'}")
    return changed


def _ensure_host_facts(progress: Progress, ct: LabContainer) -> bool:
    """Unpack the recorded H200 host files into ct's rootfs at LAB_HOST_FACTS_ROOT (without the
    tarball's top folder `sysroot/`); redone only when the tarball's sha256 changed."""
    tarball = HOST_FACTS_TARBALL
    if not tarball.is_file():
        raise LabError(f"recorded host facts {tarball} are missing: reinstall gpunode (they are package data)")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    dest = ct.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/")
    stamp = ct.dir / "facts.sha256"
    if dest.is_dir() and stamp.is_file() and stamp.read_text().strip() == digest:
        progress(f"facts: {LAB_HOST_FACTS_ROOT} in {ct.name} in place")
        return False
    tmp = dest.with_name(dest.name + ".gpunode-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o755)
    with tarfile.open(tarball) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not parts or parts[0] != "sysroot":
                raise LabError(f"{tarball}: member {member.name!r} is outside sysroot/: re-record the host facts")
            if len(parts) == 1:
                continue
            if not (member.isfile() or member.isdir() or member.issym()):
                raise LabError(f"{tarball}: member {member.name!r} is not a file, folder or symlink")
            target = os.path.normpath(os.path.join(*parts[1:-1], member.linkname)) if member.issym() else ""
            if member.issym() and (member.linkname.startswith("/") or target.split(os.sep)[0] == ".."):
                raise LabError(f"{tarball}: symlink {member.name!r} -> {member.linkname!r} leaves the sysroot")
            if ".." in parts:
                raise LabError(f"{tarball}: member {member.name!r} has '..' in its path")
            member.name = str(Path(*parts[1:]))
            members.append(member)
        # Members checked above; "tar" keeps the symlink and owner root:root.
        tar.extractall(tmp, members=members, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    stamp.write_text(digest + "\n")
    progress(f"facts: {tarball.name} unpacked to {LAB_HOST_FACTS_ROOT} in {ct.name}")
    return True


def _ensure_ssh_key() -> tuple[bool, str]:
    SSH_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)
    changed = False
    if not SSH_KEY.exists() or not SSH_PUBKEY.exists():
        for path in (SSH_KEY, SSH_PUBKEY):
            path.unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpunode-lab", "-f", str(SSH_KEY)],
             what="ssh-keygen")
        changed = True
    return changed, SSH_PUBKEY.read_text()


def _known_hosts_text() -> str:
    """One line per lab container that has a host key, GPU node first."""
    lines = []
    for ct in LAB_CONTAINERS:
        with contextlib.suppress(OSError, IndexError):
            key = (ct.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{ct.ip} {key[0]} {key[1]}\n")
    return "".join(lines)


def ssh_command(*remote: str, host: str = CONTAINER_IP, batch: bool = True) -> list[str]:
    """The ssh command line that runs `remote` as root in a lab container: the GPU node (default)
    or, with host=HOST_CONTAINER_IP, the Proxmox host stand-in."""
    opts = ["-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR"]
    if batch:
        opts += ["-o", "BatchMode=yes"]
    return ["ssh", *opts, f"root@{host}", *remote]


def ssh_works(ct: LabContainer = GPU_CONTAINER) -> bool:
    return ok(ssh_command("true", host=ct.ip), timeout=20)


def _wait_for_ssh(ct: LabContainer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with socket.create_connection((ct.ip, 22), timeout=2):
                if ssh_works(ct):
                    return
        time.sleep(1)
    proc = run(ssh_command("true", host=ct.ip), check=False, timeout=20)
    raise LabError(f"ssh root@{ct.ip} does not work after {timeout:.0f} s "
                   f"({one_line(proc.stderr) or 'no answer'}): see {ct.start_log} and "
                   f"`lxc-attach -P {LXC_PATH} -n {ct.name} -- systemctl status ssh`")


def _start_container(progress: Progress, ct: LabContainer) -> None:
    progress(f"container: starting {ct.name}")
    run(lxc(ct, "lxc-start", "-d", "-o", str(ct.start_log), "-l", "INFO"), timeout=60,
         what=f"lxc-start {ct.name}", fix=f"see {ct.start_log}")
    run(lxc(ct, "lxc-wait", "-s", "RUNNING", "-t", "30"), timeout=40, what=f"waiting for {ct.name}",
         fix=f"see {ct.start_log}")


def stop_container(progress: Progress, ct: LabContainer) -> None:
    progress(f"container: stopping {ct.name}")
    proc = run(lxc(ct, "lxc-stop", "-t", "20"), check=False, timeout=60)
    if proc.returncode != 0 and container_state(ct) != "STOPPED":
        run(lxc(ct, "lxc-stop", "-k"), timeout=30, what=f"lxc-stop -k {ct.name}")


def ensure_container(progress: Progress, ct: LabContainer, uvm: int) -> bool:
    changed = False
    key_changed, pubkey = _ensure_ssh_key()
    changed |= key_changed
    state = container_state(ct)
    if state == "ABSENT":
        _create_container(progress, ct)
        changed = True
        state = "STOPPED"
    elif state not in ("RUNNING", "STOPPED"):
        raise LabError(f"container {ct.name} is {state}: run `gpunode lab down` then `gpunode lab up`")
    if state == "STOPPED":
        changed |= _ensure_packages(progress, ct)
    config = ct.config.read_text()
    new_config = _with_block(config, _config_block(ct, uvm))
    config_changed = new_config != config
    if config_changed:
        write_if_changed(ct.config, new_config)
        progress(f"container: config block in {ct.config} written")
    rootfs_changed = _ensure_rootfs(progress, ct, pubkey)
    changed |= config_changed or rootfs_changed
    if ct.facts:
        changed |= _ensure_host_facts(progress, ct)
        changed |= _ensure_driver_layout(progress, ct)
    started = False
    if state == "RUNNING" and (config_changed or rootfs_changed and not ssh_works(ct)):
        stop_container(progress, ct)
        state = "STOPPED"
    if state != "RUNNING":
        _start_container(progress, ct)
        changed = started = True
    else:
        progress(f"container: {ct.name} running")
    changed |= write_if_changed(KNOWN_HOSTS, _known_hosts_text(), 0o644)
    _wait_for_ssh(ct, 90 if started else 20)
    progress(f"ssh: root@{ct.ip} answers")
    if started:
        proc = run(ssh_command("apt-get", "-q", "update", host=ct.ip), check=False, timeout=180)
        if proc.returncode != 0 or re.search(r"^(W|E): ", proc.stdout + proc.stderr, re.M):
            raise LabError(f"apt-get update in {ct.name} failed ({one_line(proc.stderr) or one_line(proc.stdout)}): "
                           f"check NAT (iptables -t nat -S POSTROUTING) and DNS ({ct.rootfs / 'etc/resolv.conf'})")
        progress(f"container: apt-get update in {ct.name} works (NAT and DNS)")
    return changed
