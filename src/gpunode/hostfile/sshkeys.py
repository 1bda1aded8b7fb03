"""SSH public keys checked the way Proxmox checks them before it writes a container's authorized_keys.

pve-container's create handler (src/PVE/API2/LXC.pm, line 290) gives the ``ssh-public-keys``
parameter to ``PVE::Tools::validate_ssh_public_keys`` (pve-common src/PVE/Tools.pm, line 1104): the
text is split at newlines, blank lines (``/^\\s*$/``) are skipped, and every other line is written to
a file of its own and read by ``ssh-keygen -l -f``; one failure is HTTP 500 "SSH public key validation
error", naming no line. ssh-keygen reads that one-line file in ``do_fingerprint`` (openssh-portable
ssh-keygen.c, line 896), which accepts, after leading blanks:

- a key ``TYPE BASE64 [comment]`` (``sshkey_read``, sshkey.c line 1297), or
- one word first (authorized_keys options, where a quoted part may hold blanks; or a known_hosts
  host list; but not a number other than 0), one blank, then the key;

and fails a file with no key in it: a comment line alone, or one line of a private key.
``sshkey_read`` decodes the base64 (``b64_pton``: padding required, no stray bits), parses the blob
(``sshkey_from_blob_internal``, sshkey.c line 1987: its type, the key's own fields, nothing left
over) and requires the blob's type (and curve) to be the one the line names. The blob is parsed
here by cryptography's OpenSSH public key loader, which makes the same checks.

Stricter than Proxmox, each for a key that could never log in: DSA (``ssh-dss``; OpenSSH 10, on
Proxmox VE 9, no longer reads it, and sshd has refused it by default since 7.0); a certificate (sshd
never matches a certificate line of authorized_keys: ``auth_check_authkey_line`` in
auth2-pubkeyfile.c; a CA is trusted as its plain key with the ``cert-authority`` option); a file
with no key at all (Proxmox takes it and the node cannot be reached with it).

Messages name the line and what is wrong, never the line's text: a private key pasted by mistake
must not reach a terminal or a log.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from gpunode.ground import regularfile
from gpunode.ground.text import shown

# A keys file is a few lines; this is far above any real one and below the 512 KiB request body
# pveproxy takes (pve-http-server src/PVE/APIServer/AnyEvent.pm, $limit_max_post).
KEYS_FILE_MAX = 64 * 1024
RSA_MIN_BITS = 1024  # SSH_RSA_MINIMUM_MODULUS_SIZE, sshkey.h; checked in sshkey_check_rsa_length


class KeysFileError(ValueError):
    """A keys file that cannot be read, or a line Proxmox would refuse; one line of text."""


# The names ssh-keygen reads for the plain key types (keyimpls[] in sshkey.c), each with the name
# the key blob itself carries: rsa-sha2-* name an RSA key (sshkey_type_from_name), whose blob says ssh-rsa.
KEY_TYPES: dict[str, str] = {
    "ssh-ed25519": "ssh-ed25519",
    "sk-ssh-ed25519@openssh.com": "sk-ssh-ed25519@openssh.com",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384": "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521": "ecdsa-sha2-nistp521",
    "sk-ecdsa-sha2-nistp256@openssh.com": "sk-ecdsa-sha2-nistp256@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com": "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-rsa": "ssh-rsa",
    "rsa-sha2-256": "ssh-rsa",
    "rsa-sha2-512": "ssh-rsa",
}
_CERT_SUFFIX = "-cert-v01@openssh.com"
_REFUSED_TYPES = {
    "ssh-dss": "a DSA key (ssh-dss): OpenSSH 10 (Proxmox VE 9) no longer reads DSA and sshd has refused it "
               "since 7.0: use an ed25519 key (ssh-keygen -t ed25519)",
}
# How a private key shows itself on one of its lines: a PEM or OpenSSH armour line, PuTTY's
# header, or the base64 of "openssh-key-v1\0" that starts an OpenSSH private key's body.
_PRIVATE = re.compile(r"PRIVATE KEY|^\s*PuTTY-User-Key-File-|^\s*b3BlbnNzaC1rZXktdjE")
_PERL_BLANK = re.compile(r"[ \t\n\r\f\v]*")  # Perl's \s, which validate_ssh_public_keys skips on
_LEADING_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)[ \t]")  # strtol's reading, then a blank


def _blob_type(blob: bytes) -> str | None:
    """The type name a key blob starts with (an SSH string, RFC 4251 section 5), if it has one."""
    length = int.from_bytes(blob[:4], "big")
    raw = blob[4:4 + length]
    if len(blob) < 4 or len(raw) != length:
        return None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None


def _read_key(text: str) -> tuple[str | None, str | None]:
    """``sshkey_read`` on ``text``: (the type named, None) for a key, else (the type named if it is
    one gpunode knows, why it does not parse). The blob is parsed by cryptography's OpenSSH loader,
    which checks what sshkey_from_blob checks (the key's fields, an EC point on its curve, nothing
    left over)."""
    name, blank, rest = _split_word(text)
    if not blank:
        return None, "no blank after the first word"
    if name.endswith(_CERT_SUFFIX):
        return name, ("a certificate: sshd never matches one in authorized_keys; give the CA's own public key "
                      "with the cert-authority option instead")
    if name in _REFUSED_TYPES:
        return name, _REFUSED_TYPES[name]
    inner = KEY_TYPES.get(name)
    if inner is None:
        return None, "not a key type"
    encoded = _split_word(rest.lstrip(" \t"))[0]
    if not encoded:
        return name, f"{name} with no base64 after it"
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return name, f"the {name} key's base64 is damaged (truncated or not base64)"
    if base64.b64encode(blob).decode("ascii") != encoded:  # b64_pton: padding as written, no stray bits
        return name, f"the {name} key's base64 is damaged (stray bits or padding: truncated?)"
    found = _blob_type(blob)
    if found is not None and found != inner and found in KEY_TYPES.values():
        return name, f"the line says {name} but the key inside is {found}"
    # Loaded only when a host file has keys to check: validating one without them needs none of it.
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        key = serialization.load_ssh_public_key(f"{inner} {encoded}".encode("ascii"))
    except (ValueError, UnsupportedAlgorithm):
        return name, f"the {name} key does not parse (damaged or truncated?)"
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < RSA_MIN_BITS:
        return name, f"an RSA key of {key.key_size} bits: OpenSSH takes {RSA_MIN_BITS} or more (use ed25519)"
    return name, None


def _split_word(text: str) -> tuple[str, bool, str]:
    """The first word up to a blank, whether a blank follows, and what is after that blank."""
    match = re.match(r"[^ \t]*", text)
    assert match is not None
    word = match.group(0)
    rest = text[len(word):]
    return word, bool(rest), rest[1:]


def _skip_options(text: str) -> str | None:
    """What follows the first word (do_fingerprint: options or a host list, where a quoted part may
    hold blanks and \\" is a quote inside one), after one blank; None when nothing follows."""
    quoted = False
    index = 0
    while index < len(text) and (quoted or text[index] not in " \t"):
        if text[index] == "\\" and text[index + 1:index + 2] == '"':
            index += 1
        elif text[index] == '"':
            quoted = not quoted
        index += 1
    return text[index + 1:] if index < len(text) else None


def line_problem(line: str) -> str | None:
    """Why Proxmox would refuse one line of a keys file, or None when it takes it (``problems``
    names a private key's line as such)."""
    # ssh-keygen reads a C string: it ends at a NUL, and the line at its first CR (strcspn).
    text = re.split(r"[\r\0]", line, maxsplit=1)[0].lstrip(" \t")
    if not text:
        return "a line of blanks and control characters, which Proxmox's check refuses: delete it"
    if text.startswith("#"):
        return ("a comment line, which Proxmox's check refuses (it reads each line as a key file of its own): "
                "delete it, or put the words after the key, which may end in a comment")
    named, why = _read_key(text)
    if why is None:
        return None
    number = _LEADING_NUMBER.match(text)
    if number and int(number.group(1)) != 0:
        # do_fingerprint takes a leading number for an SSH-1 key and skips nothing (it reads none)
        return why if named else "starts with a number: an SSH-1 key, which OpenSSH no longer reads"
    rest = _skip_options(text)
    if rest is not None:
        named_after, why_after = _read_key(rest)
        if why_after is None:
            return None
        if named_after or not named:
            named, why = named_after, why_after
    if named:
        return why
    return (f"not a public key: expected [options] TYPE BASE64 [comment], one blank between them, with TYPE one of "
            f"{', '.join(sorted(name for name in KEY_TYPES if '@' not in name and not name.startswith('rsa-')))}")


def problems(text: str) -> list[tuple[int, str]]:
    """Every line of a keys file Proxmox would refuse, as (line number, what is wrong); a private
    key is one problem however many lines it has, and so is a file with no key at all."""
    found: list[tuple[int, str]] = []
    keys = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if _PERL_BLANK.fullmatch(line):
            continue
        why = line_problem(line)
        if why is None:  # a key whose comment says PRIVATE KEY is still a key (ssh-keygen loads it)
            keys += 1
        elif _PRIVATE.search(line):
            # Its other lines would each be refused too: one message, and none of its text.
            return [(number, "a private key, not a public key: give the .pub file (ssh-keygen -y -f KEY prints it)")]
        else:
            found.append((number, why))
    if not found and keys == 0:
        return [(0, "holds no public key: the node is reached with these keys (give at least one)")]
    return found


def check(text: str, where: str) -> None:
    """Raise KeysFileError naming ``where`` and the first line Proxmox would refuse."""
    found = problems(text)
    if found:
        number, why = found[0]
        more = f" (and {len(found) - 1} more line{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        raise KeysFileError(f"{where}{f' line {number}' if number else ''}: {why}{more}")


def read(path: Path) -> str:
    """The text of a keys file: a regular file (never a FIFO, which would block, or a device) of at
    most KEYS_FILE_MAX bytes of UTF-8; KeysFileError of one line otherwise. The keys are not checked."""
    name = shown(str(path), limit=240)
    try:
        data = regularfile.read_bytes(path, KEYS_FILE_MAX)
    except regularfile.NotReadable as exc:
        raise KeysFileError(f"{name}: {exc.why}: not a public keys file" if exc.too_long
                            else f"cannot read {name}: {exc.why}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeysFileError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def load(path: Path) -> str:
    """A keys file's text, read and checked as Proxmox will check it; KeysFileError otherwise."""
    text = read(path)
    check(text, shown(str(path), limit=240))
    return text
