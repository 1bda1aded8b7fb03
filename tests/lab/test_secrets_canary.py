"""Secrets as an attacker looks for them: the lab's real Proxmox password, given by env, file and
vault, is used (the login works) and appears nowhere a run leaves text: stdout, stderr, --json,
the state directory with ansible-runner's artifacts, /dev/shm and the temporary folders; also
after a `gpunode check` killed with SIGKILL mid-run, which can clean nothing up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpunode_lab as lab

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
FILE_REF = "password: {file: /var/lib/gpunode-lab/pve/password}"
# Where a run could leave a file behind besides its state directory.
SCRATCH = (Path("/dev/shm"), Path("/tmp"), Path("/var/tmp"))
READ_AT_MOST = 4 * 1024 * 1024  # bytes of one scratch file read (image layers and the like are not secrets' size)


@pytest.fixture(scope="module")
def password() -> str:
    return lab.PVE_PASSWORD_FILE.read_text().strip()


def variant(tmp_path: Path, new: str) -> Path:
    text = LAB_HOSTS.read_text()
    assert FILE_REF in text
    path = tmp_path / "host.yml"
    path.write_text(text.replace(FILE_REF, new, 1))
    return path


def files_holding(secret: str, roots: tuple[Path, ...], since: float) -> list[str]:
    """Regular files under ``roots`` changed since ``since`` whose first bytes hold ``secret``."""
    found = []
    for root in roots:
        for folder, _dirs, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                try:
                    if not path.is_file() or path.is_symlink() or path.stat().st_mtime < since:
                        continue
                    with path.open("rb") as handle:
                        if secret.encode() in handle.read(READ_AT_MOST):
                            found.append(str(path))
                except OSError:
                    continue  # gone, or not ours to read: not a file this run left
    return found


def run_leaves_no_trace(result: subprocess.CompletedProcess[str], secret: str, state: Path, since: float) -> None:
    assert secret not in result.stdout + result.stderr
    assert files_holding(secret, (state, *SCRATCH), since) == []


@pytest.mark.parametrize("given", ["env", "file"])
def test_a_secret_is_in_no_output_artifact_or_scratch_file(gpunode, tmp_path: Path, password: str, given: str) -> None:
    hosts = variant(tmp_path, "password: {env: GPUNODE_CANARY_PASS}" if given == "env" else FILE_REF)
    env = {"GPUNODE_CANARY_PASS": password}
    since = time.time() - 1
    for args in (("validate",), ("plan",), ("plan", "--json"), ("plan", "--live", "--json")):
        shown = gpunode(*args, str(hosts), env=env, timeout=120)
        assert shown.returncode == 0, (args, shown.stderr)
        run_leaves_no_trace(shown, password, tmp_path / "state", since)
    provision = gpunode("provision", str(hosts), "--tags", "host,container", "--json", "--diff", "-vvv", env=env,
                        timeout=900)
    assert provision.returncode == 0, provision.stderr[-2000:]
    assert json.loads(provision.stdout)["stats"]["ok"]["pve-lab"] >= 3, "the container stage logged in with it"
    artifacts = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in artifacts), "ansible-runner's command file (the env it ran with) is read"
    run_leaves_no_trace(provision, password, tmp_path / "state", since)
    check = gpunode("check", str(hosts), "--layer", "container", env=env, timeout=600)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    run_leaves_no_trace(check, password, tmp_path / "state", since)


def test_a_vault_secret_is_in_no_output_or_artifact(gpunode, tmp_path: Path, password: str) -> None:
    vault_pass = tmp_path / "vault-pass"
    vault_pass.write_text("canary-vault-passphrase\n")
    secret = tmp_path / "password.vault"
    secret.write_text(password)
    encrypted = subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt", str(secret),
                                "--vault-password-file", str(vault_pass)], capture_output=True, text=True, timeout=120)
    assert encrypted.returncode == 0, encrypted.stderr
    assert password not in secret.read_text()
    hosts = variant(tmp_path, f"password: {{vault: {secret}}}")
    since = time.time() - 1
    provision = gpunode("provision", str(hosts), "--tags", "host,container", "--json", "--vault-password-file",
                        str(vault_pass), timeout=900)
    assert provision.returncode == 0, provision.stderr[-2000:]
    assert json.loads(provision.stdout)["stats"]["ok"]["pve-lab"] >= 3, "the container stage logged in with it"
    run_leaves_no_trace(provision, password, tmp_path / "state", since)


def test_a_check_killed_with_sigkill_leaves_no_secret_behind(tmp_path: Path, password: str) -> None:
    hosts = variant(tmp_path, "password: {env: GPUNODE_CANARY_PASS}")
    state = tmp_path / "state"
    env = {**os.environ, "GPUNODE_STATE_DIR": str(state), "GPUNODE_CANARY_PASS": password}
    since = time.time() - 1
    proc = subprocess.Popen([sys.executable, "-m", "gpunode", "check", str(hosts)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # Kill it while its checks run: once its pytest has the inventory written and has begun.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (state / "check" / "inventory.yml").exists():
                break
            time.sleep(0.2)
        assert proc.poll() is None, "gpunode check ended before it could be killed"
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its pytest and ssh children too
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL
    out, err = proc.communicate(timeout=30)
    assert password.encode() not in out + err
    assert files_holding(password, (state, *SCRATCH), since) == []
