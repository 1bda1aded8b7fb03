"""container.ssh_public_keys checked as Proxmox checks it (issue #32): each non-blank line must pass
``ssh-keygen -l -f`` on its own (pve-common src/PVE/Tools.pm validate_ssh_public_keys, line 1104),
so the real ssh-keygen is the oracle here. ``gpunode validate`` and the container module both
refuse a bad file, naming the file and the line and never printing the line; the file is read
bounded, and a FIFO does not hang."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode import hostfile

from gpunode.hostfile import sshkeys

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_module_failures import LXC_ARGS, run_module  # noqa: E402 - this folder put on the path just above

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.keys import KEY_KINDS as KINDS  # noqa: E402
from fakes.ports import closed_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"
PRIVATE = "a private key, not a public key"


@pytest.fixture(scope="module")
def keys(key_pairs: dict[str, Path]) -> dict[str, Path]:
    return key_pairs


def public(keys: dict[str, Path], name: str) -> str:
    return keys[name].with_suffix(".pub").read_text().strip()


def keygen_takes(line: str, folder: Path) -> bool:
    """What Proxmox does with one line: write it to a file of its own and run ssh-keygen -l -f on it."""
    path = folder / "line"
    path.write_bytes(line.encode())
    return subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, timeout=30).returncode == 0


def variants(line: str) -> dict[str, str]:
    """One public key line written the ways an authorized_keys file has it, and damaged ways."""
    kind, blob, comment = line.split(" ", 2)
    raw = base64.b64decode(blob)
    return {
        "as-is": line,
        "no-comment": f"{kind} {blob}",
        "tab": f"{kind}\t{blob}\t{comment}",
        "leading-blanks": f"  \t{line}",
        "crlf": f"{line}\r",
        "options": f'no-pty,command="echo a b" {line}',
        "options-escaped-quote": f'command="echo \\" x" {line}',
        "host-list": f"node1,192.0.2.20 {line}",
        "zero-first": f"0 {line}",
        "private-in-comment": f"{kind} {blob} my PRIVATE KEY backup",
        "two-blanks-after-options": f"no-pty  {line}",
        "number-first": f"2048 {line}",
        "comment": f"# {line}",
        "type-only": kind,
        "truncated": f"{kind} {blob[:-8]}",
        "short-by-a-byte": f"{kind} {base64.b64encode(raw[:-1]).decode()}",
        "byte-extra": f"{kind} {base64.b64encode(raw + b'x').decode()}",
        "padding-dropped": f"{kind} {blob.rstrip('=')}" if blob.endswith("=") else f"{kind} {blob}AA",
        "not-base64": f"{kind} {blob[:20]}!{blob[21:]}",
        "type-mismatch": f"{'ssh-rsa' if kind != 'ssh-rsa' else 'ssh-ed25519'} {blob}",
        "curve-mismatch": f"ecdsa-sha2-nistp384 {blob}" if kind != "ecdsa-sha2-nistp384" else f"ecdsa-sha2-nistp256 {blob}",
        "unquoted-option": f'"no-pty {line}',
    }


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_line_is_judged_as_ssh_keygen_judges_it(keys: dict[str, Path], name: str, tmp_path: Path) -> None:
    """Accepted where ssh-keygen accepts, refused where it refuses, for each kind of key."""
    judged = {label: (sshkeys.line_problem(line) is None, keygen_takes(line, tmp_path))
              for label, line in variants(public(keys, name)).items()}
    assert {label: mine for label, (mine, _) in judged.items()} == {label: real for label, (_, real) in judged.items()}
    # Both ways are covered: the oracle takes some and refuses some.
    assert {real for _, real in judged.values()} == {True, False}


def test_security_key_types_and_their_aliases(keys: dict[str, Path], tmp_path: Path) -> None:
    """sk- keys (no hardware here: made from an ed25519 and an ECDSA key plus an application) and
    the rsa-sha2-* names, against ssh-keygen too."""
    def string(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    ed = base64.b64decode(public(keys, "ed25519").split()[1])
    ec = base64.b64decode(public(keys, "ecdsa256").split()[1])
    ed_pk, ec_rest = ed[4 + len(b"ssh-ed25519") + 4:], ec[4 + len(b"ecdsa-sha2-nistp256"):]
    sk_ed = string(b"sk-ssh-ed25519@openssh.com") + string(ed_pk) + string(b"ssh:")
    sk_ec = string(b"sk-ecdsa-sha2-nistp256@openssh.com") + ec_rest + string(b"ssh:")
    rsa_blob = public(keys, "rsa").split()[1]
    lines = {
        "sk-ed25519": f"sk-ssh-ed25519@openssh.com {base64.b64encode(sk_ed).decode()}",
        "sk-ecdsa": f"sk-ecdsa-sha2-nistp256@openssh.com {base64.b64encode(sk_ec).decode()}",
        "sk-without-application": f"sk-ssh-ed25519@openssh.com {base64.b64encode(sk_ed[:-8]).decode()}",
        "rsa-sha2-512": f"rsa-sha2-512 {rsa_blob}",
        "ecdsa-point-off-curve": f"ecdsa-sha2-nistp256 {base64.b64encode(ec[:-1] + bytes([ec[-1] ^ 1])).decode()}",
    }
    judged = {label: (sshkeys.line_problem(line) is None, keygen_takes(line, tmp_path)) for label, line in lines.items()}
    assert judged == {"sk-ed25519": (True, True), "sk-ecdsa": (True, True), "sk-without-application": (False, False),
                      "rsa-sha2-512": (True, True), "ecdsa-point-off-curve": (False, False)}


def test_messages_say_what_is_wrong(keys: dict[str, Path]) -> None:
    kind, blob, _ = public(keys, "ed25519").split(" ", 2)
    assert sshkeys.line_problem(f"{kind} {blob[:-8]}") == (
        "the ssh-ed25519 key does not parse (damaged or truncated?)")
    rsa_blob = public(keys, "rsa").split()[1]
    assert sshkeys.line_problem(f"ssh-ed25519 {rsa_blob}") == "the line says ssh-ed25519 but the key inside is ssh-rsa"
    assert sshkeys.line_problem("# my laptop").startswith("a comment line, which Proxmox's check refuses")
    assert sshkeys.line_problem("hello world").startswith("not a public key: expected [options] TYPE BASE64 [comment]")


def test_stricter_than_proxmox_for_keys_that_cannot_log_in(keys: dict[str, Path], tmp_path: Path) -> None:
    """A certificate ssh-keygen reads, but sshd never matches in authorized_keys; DSA, which
    OpenSSH 10 (Proxmox VE 9) no longer reads; an empty file, which leaves the node unreachable."""
    ca = keys["ed25519"]
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "test", "-n", "root", str(keys["rsa"].with_suffix(".pub"))],
                   check=True, capture_output=True, timeout=60)
    cert = keys["rsa"].with_name("id_rsa-cert.pub").read_text().strip()
    assert keygen_takes(cert, tmp_path)
    assert sshkeys.line_problem(cert).startswith("a certificate: sshd never matches one in authorized_keys")
    assert sshkeys.line_problem(f"ssh-dss {base64.b64encode(b'x' * 40).decode()}").startswith("a DSA key (ssh-dss)")
    for empty in ("", "\n\n", "  \n\t\n"):
        assert sshkeys.problems(empty) == [(0, "holds no public key: the node is reached with these keys "
                                               "(give at least one)")]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_private_key_is_named_so_and_never_shown(keys: dict[str, Path], name: str, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    private = keys[name].read_text()
    path.write_text(public(keys, "ed25519") + "\n" + private)
    with pytest.raises(sshkeys.KeysFileError) as caught:
        sshkeys.load(path)
    message = str(caught.value)
    assert message == f"{path} line 2: {PRIVATE}: give the .pub file (ssh-keygen -y -f KEY prints it)"
    body = [line for line in private.splitlines() if line and not line.startswith("-----")]
    assert body and not any(line[:16] in message for line in body)


def test_a_file_lists_the_first_bad_line_and_counts_the_rest(keys: dict[str, Path]) -> None:
    text = "\n".join([public(keys, "rsa"), "", "# laptop", public(keys, "ed25519"), "junk here", "  "])
    assert [number for number, _ in sshkeys.problems(text)] == [3, 5]
    with pytest.raises(sshkeys.KeysFileError) as caught:
        sshkeys.check(text, "keys.pub")
    assert str(caught.value).startswith("keys.pub line 3: a comment line") and str(caught.value).endswith("(and 1 more line)")
    good = "\n".join([public(keys, name) for name in sorted(KINDS)] + ["", f"no-pty {public(keys, 'rsa')}", ""])
    assert sshkeys.problems(good) == []


def test_the_file_is_read_bounded_and_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    big = tmp_path / "big.pub"
    big.write_bytes(b"x" * (sshkeys.KEYS_FILE_MAX + 1))
    latin = tmp_path / "latin.pub"
    latin.write_bytes(b"ssh-ed25519 AAAA caf\xe9")
    expected = {fifo: f"cannot read {fifo}: not a regular file", tmp_path: f"cannot read {tmp_path}: not a regular file",
                big: f"{big}: longer than {sshkeys.KEYS_FILE_MAX} bytes: not a public keys file",
                latin: f"{latin}: not UTF-8 text (byte 20)",
                tmp_path / "missing.pub": f"cannot read {tmp_path / 'missing.pub'}: No such file or directory"}
    for path, message in expected.items():
        with pytest.raises(sshkeys.KeysFileError) as caught:
            sshkeys.read(path)
        assert str(caught.value) == message


def host_file(tmp_path: Path, keys_file: Path) -> Path:
    text = EXAMPLE.read_text()
    given = "ssh_public_keys: ~/.ssh/id_ed25519.pub"
    assert given in text
    path = tmp_path / "host.yml"
    path.write_text(text.replace(given, f"ssh_public_keys: {keys_file}", 1))
    return path


def test_validate_refuses_a_keys_file_proxmox_would_refuse(keys: dict[str, Path], tmp_path: Path, gpunode) -> None:
    keys_file = tmp_path / "authorized.pub"
    keys_file.write_text(public(keys, "ed25519") + "\n# the CI key\n")
    path = host_file(tmp_path, keys_file)
    line = next(number for number, text in enumerate(path.read_text().splitlines(), 1) if "ssh_public_keys:" in text)
    result = gpunode("validate", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (f"error: {path}: hosts[0].container.ssh_public_keys: {keys_file} line 2: a comment "
                                     "line, which Proxmox's check refuses (it reads each line as a key file of its own): "
                                     "delete it, or put the words after the key, which may end in a comment "
                                     f"(line {line})")
    keys_file.write_text(keys["ecdsa256"].read_text())  # a private key: named, not shown
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    assert [PRIVATE in problem for problem in caught.value.problems] == [True]
    assert "PRIVATE KEY-----" not in str(caught.value)


def test_validate_takes_a_good_keys_file_and_leaves_a_missing_one_to_the_stage(keys: dict[str, Path],
                                                                                tmp_path: Path) -> None:
    keys_file = tmp_path / "authorized.pub"
    keys_file.write_text(f'{public(keys, "rsa")}\n\nfrom="192.0.2.0/24",no-pty {public(keys, "ed25519")}\n')
    assert hostfile.load(host_file(tmp_path, keys_file)).hosts[0].container.ssh_public_keys == keys_file
    missing = tmp_path / "elsewhere.pub"  # validated on a machine without the keys: the module reports it
    assert hostfile.load(host_file(tmp_path, missing)).hosts[0].container.ssh_public_keys == missing


def test_the_module_refuses_before_any_request(keys: dict[str, Path], tmp_path: Path) -> None:
    keys_file = tmp_path / "authorized.pub"
    kind, blob, _ = public(keys, "ed25519").split(" ", 2)
    keys_file.write_text(f"{kind} {blob[:-8]}\n")
    with closed_port() as port:  # nothing answers there: a request would fail as unreachable instead
        res = run_module("pve_lxc_gpu", {**LXC_ARGS, "api_url": f"https://127.0.0.1:{port}",
                                         "ssh_public_keys_file": str(keys_file)}, tmp_path)
    assert res["failed"] and "gpunode_unreachable" not in res
    assert res["msg"] == (f"container.ssh_public_keys: {keys_file} line 1: the ssh-ed25519 key does not parse "
                          "(damaged or truncated?); nothing was changed")
