"""The run's secret files: an env secret lives in memory only (a memfd this process holds), readable
by the run's modules at /proc/<pid>/fd/<n> and gone with the process; a secret file is read only
when it is a small regular file, whatever else the path names, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode import hostfile, runner
from gpunode.hostfile import SECRET_FILE_MAX, SecretRef

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventory" / "lab" / "host.yml"
CANARY = "-canary-secret-7f3a"


def lab_with_env_password(tmp_path: Path) -> hostfile.HostFile:
    text = LAB.read_text().replace("password: {file: /var/lib/gpunode-lab/pve/password}",
                                   "password: {env: GPUNODE_UNIT_CANARY}", 1)
    (tmp_path / "host.yml").write_text(text)
    return hostfile.load(tmp_path / "host.yml")


def test_an_env_secret_is_a_memory_file_and_no_path_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUNODE_UNIT_CANARY", CANARY)
    hf = lab_with_env_password(tmp_path)
    with runner.secret_files(hf) as files:
        path = files[("pve-lab", "password")]
        assert str(path).startswith(f"/proc/{os.getpid()}/fd/")
        assert os.readlink(path).startswith("/memfd:gpunode-secret-password")
        # Read as a module reads it: another process, opening the path, from the start each time.
        for _ in range(2):
            read = subprocess.run([sys.executable, "-c", f"print(open({str(path)!r}).read(), end='')"],
                                  capture_output=True, text=True, timeout=60)
            assert read.stdout == CANARY
        assert not [p for p in Path("/dev/shm").rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert not path.exists()  # closed: the kernel has freed it


def test_a_secret_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text(CANARY + "\n")
    assert SecretRef(file=good).resolve() == CANARY
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * (SECRET_FILE_MAX + 1))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    cases = {tmp_path: "not a regular file", fifo: "not a regular file", Path("/dev/zero"): "not a regular file",
             tmp_path / "missing": "No such file or directory", big: "not a secret", binary: "not UTF-8 text"}
    for path, words in cases.items():
        with pytest.raises(LookupError) as refused:
            SecretRef(file=path).resolve()
        message = str(refused.value)
        assert message.startswith(f"secret file {path}: ") and words in message and "\n" not in message
