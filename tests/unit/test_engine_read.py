"""Reading a fact off the node over SSH (gpunode.stages.engine.read_file, link_count): an absent path
is None, and an SSH that failed is an error, never "absent" (a stale-mount check that read nothing
would pass a server onto an empty folder)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from gpunode.hostfile import Ssh
from gpunode.stages import engine

NODE = Ssh(address="10.0.3.200")


def answering(monkeypatch: pytest.MonkeyPatch, rc: int, out: str = "", err: str = "") -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    return calls


def test_a_folders_link_count_is_read_with_the_path_quoted_after_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = answering(monkeypatch, 0, "0\n")
    assert engine.link_count(NODE, "/models/GLM 5; rm -rf /") == 0
    assert calls[0][-1] == "stat -c %h -- '/models/GLM 5; rm -rf /'"


def test_an_absent_path_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    answering(monkeypatch, 1, err="stat: cannot statx '/models/x': No such file or directory")
    assert engine.link_count(NODE, "/models/x") is None
    answering(monkeypatch, 1, err="cat: /etc/gpunode/x.json: No such file or directory")
    assert engine.read_file(NODE, "/etc/gpunode/x.json") is None


@pytest.mark.parametrize("reader", [engine.link_count, engine.read_file])
def test_an_ssh_that_failed_is_unreachable_not_absent(monkeypatch: pytest.MonkeyPatch, reader: Any) -> None:
    answering(monkeypatch, 255, err="ssh: connect to host 10.0.3.200 port 22: Connection refused")
    with pytest.raises(engine.EngineUnreachable, match="Connection refused"):
        reader(NODE, "/models/x")


def test_a_link_count_that_is_no_number_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    answering(monkeypatch, 0, "motd banner\n2\n")
    with pytest.raises(engine.EngineUnreachable, match="said"):
        engine.link_count(NODE, "/models/x")
