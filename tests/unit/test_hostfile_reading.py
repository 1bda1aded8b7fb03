"""How a host file is read (issue #31 item 1, gpunode.ground.yamlsource and the models' strict types):
each class of input that crashed, hung or was silently taken is now refused by ``gpunode validate``
with one line naming the file, the path and the line, and exit 2; what the YAML subset does take
is taken as YAML 1.2 says."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import hostfile
from gpunode.cli import app
from gpunode.ground.text import shown
from gpunode.ground.yamlsource import MAX_BYTES, MAX_VALUES, load_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "inventory" / "example" / "host.yml").read_text()
RUNNER = CliRunner(env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "200"})


def changed(old: str, new: str) -> tuple[str, int]:
    """The example with ``old`` (on one line) replaced by ``new``, and that line's number."""
    assert EXAMPLE.count(old) == 1, old
    return EXAMPLE.replace(old, new), EXAMPLE[:EXAMPLE.index(old)].count("\n") + 1


def validate(path: Path) -> tuple[int, list[str]]:
    result = RUNNER.invoke(app, ["validate", str(path)])
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stderr.splitlines()


def refused(path: Path) -> str:
    """The one error line for ``path``, without its ``error: <path>: `` prefix."""
    code, lines = validate(path)
    assert code == 2 and len(lines) == 1, lines
    prefix = f"error: {shown(str(path), limit=240)}: "
    assert lines[0].startswith(prefix), lines
    return lines[0].removeprefix(prefix)


def write(tmp_path: Path, text: str, name: str = "host.yml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- tags: refused wherever they are, never constructed -------------------------------------------
@pytest.mark.parametrize("old, new, expected", [
    ("vmid: 200", "vmid: !!python/object/apply:os.system ['touch /tmp/gpunode-pwned']",
     "hosts[0].container.vmid: YAML tag !!python/object/apply:os.system: a host file takes plain values, no tags "
     "(remove it; quote a value meant as text)"),
    ("vmid: 200", "vmid: !foo 200", "hosts[0].container.vmid: YAML tag !foo: a host file takes plain values"),
    ("vmid: 200", "vmid: !!int abc", "hosts[0].container.vmid: YAML tag !!int: a host file takes plain values"),
    ("vmid: 200", "vmid: !!str 200", "hosts[0].container.vmid: YAML tag !!str: a host file takes plain values"),
    ("hostname: glm5", "hostname: ! glm5", "hosts[0].container.hostname: YAML tag !: a host file takes plain values"),
    ("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: !!seq [0, 1]", "hosts[0].container.gpus: YAML tag !!seq: "),
    ("    prepare:", "    prepare: !!map", "hosts[0].prepare: YAML tag !!map: "),
])
def test_a_tag_is_refused_naming_path_and_line(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text, line = changed(old, new)
    message = refused(write(tmp_path, text))
    assert message.startswith(expected) and message.endswith(f"(line {line})"), message
    assert not Path("/tmp/gpunode-pwned").exists()


def test_a_tag_directive_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "%TAG !e! tag:example.com,2000:\n---\n" + EXAMPLE)
    assert refused(path) == "a %TAG directive: a host file takes no YAML tags (line 1)"


def test_yaml_1_1_is_refused_and_1_2_taken(tmp_path: Path) -> None:
    assert refused(write(tmp_path, "%YAML 1.1\n---\n" + EXAMPLE)) == "%YAML 1.1: a host file is read as YAML 1.2 (line 1)"
    assert validate(write(tmp_path, "%YAML 1.2\n---\n" + EXAMPLE))[0] == 0


# -- YAML 1.2's core schema: no 1.1 numbers or yes/no, and strict types where a key says so -------
@pytest.mark.parametrize("old, new, expected", [
    ("vmid: 200", "vmid: 0200", "hosts[0].container.vmid: must be a whole number ('0200' is text: a leading 0 is "
     "octal in YAML 1.1 and decimal in 1.2; write it without the 0, or 0o... for octal)"),
    ("port: 30000", "port: 8:20", "hosts[0].server.port: must be a whole number ('8:20' is text: YAML 1.2 has no "
     "base-60 numbers)"),
    ("cores: 64", "cores: 1_000", "hosts[0].container.cores: must be a whole number ('1_000' is text: YAML 1.2 has "
     "no _ in numbers)"),
    ("cores: 64", "cores: true", "hosts[0].container.cores: must be a whole number (found true/false)"),
    ("cores: 64", "cores: '64'", "hosts[0].container.cores: must be a whole number ('64' is quoted: write the "
     "number without quotes)"),
    ("cores: 64", "cores: 64.0", "hosts[0].container.cores: must be a whole number (found 64.0: write it without a "
     "fraction)"),
    ("cores: 64", "cores: [64]", "hosts[0].container.cores: must be a whole number (found a list)"),
    ("onboot: true", "onboot: yes", "hosts[0].container.onboot: must be true or false ('yes' is text in YAML 1.2: "
     "write true or false)"),
    ("onboot: true", "onboot: 1", "hosts[0].container.onboot: must be true or false (found a whole number 1)"),
    ("hostname: glm5", "hostname: 200", "hosts[0].container.hostname: must be a string (YAML reads 200 as a whole "
     "number: quote it)"),
    ("version: 1", "version: true", "version: must be 1"),
    ("version: 1", "version: 1.0", "version: must be 1"),
    ("same_numa_gbps: 45", "same_numa_gbps: .inf", "hosts[0].p2p.same_numa_gbps: must be a finite number (not .inf "
     "or .nan)"),
    ("flags: {}", "flags: {--max-running-requests: {a: 1}}", "hosts[0].server.flags.--max-running-requests: must be "
     "a string, a number or true/false (found a mapping)"),
])
def test_types_are_yaml_1_2_and_strict(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text, line = changed(old, new)
    assert refused(write(tmp_path, text)) == f"{expected} (line {line})"


def test_what_yaml_1_2_takes(tmp_path: Path) -> None:
    text = (EXAMPLE.replace("vmid: 200", "vmid: 0xC8").replace("cores: 64", "cores: 0o100")
            .replace("onboot: true", "onboot: True").replace("mig: false", "mig: FALSE")
            .replace("same_numa_gbps: 45", "same_numa_gbps: 4.5e1"))
    container = hostfile.load(write(tmp_path, text)).hosts[0].container
    assert (container.vmid, container.cores, container.onboot, container.mig) == (200, 64, True, False)
    data = load_yaml(write(tmp_path, "a: on\nb: 2024-01-01\nc: ~\nd: -0\ne: .NaN\nf: 1e3\n", "plain.yml")).data
    assert data["a"] == "on" and data["b"] == "2024-01-01" and data["c"] is None and data["d"] == 0
    assert data["e"] != data["e"] and data["f"] == 1000.0  # NaN is the one value unequal to itself


# -- numbers past the bound: refused before int() ------------------------------------------------
@pytest.mark.parametrize("digits", [21, 100_000])
def test_a_huge_integer_is_refused_before_it_is_converted(tmp_path: Path, digits: int) -> None:
    text, line = changed("vmid: 200", "vmid: " + "9" * digits)
    assert refused(write(tmp_path, text)) == (f"hosts[0].container.vmid: a whole number of {digits} digits: a host "
                                              f"file's numbers have at most 20 (line {line})")


# -- the file itself: a regular file of bounded size, or one line saying why not -----------------
def test_a_file_too_big_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE + "#" * MAX_BYTES)
    assert refused(path) == f"is {path.stat().st_size} bytes: a host file is at most {MAX_BYTES} bytes (1 MiB)"


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, gpunode) -> None:
    # A subprocess with a timeout: were the FIFO opened for reading, it would wait for a writer for ever.
    fifo = tmp_path / "host.yml"
    os.mkfifo(fifo)
    result = gpunode("validate", str(fifo), timeout=30)
    assert result.returncode == 2
    assert result.stderr == f"error: {fifo}: is a FIFO (named pipe), not a host file (a host file is a regular file)\n"


@pytest.mark.parametrize("special, kind", [("/dev/zero", "is a character device"), ("/proc", "is a directory")])
def test_a_device_or_directory_is_refused(special: str, kind: str) -> None:
    assert refused(Path(special)) == f"{kind}, not a host file (a host file is a regular file)"


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "host.yml"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        assert refused(path) == "is a socket, not a host file (a host file is a regular file)"


def test_unreadable_paths_are_one_line(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yml"
    loop.symlink_to(loop)
    assert refused(loop) == "too many levels of symbolic links (a symlink loop?)"
    assert refused(tmp_path / ("x" * 300)) == "file name too long"
    assert refused(tmp_path / "nope.yml") == "no such file"
    assert refused(write(tmp_path, EXAMPLE) / "below") == "a part of the path is not a directory"
    if Path("/proc/self/mem").exists():
        assert refused(Path("/proc/self/mem")) == "input/output error while reading"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000: there is no EACCES to see")
def test_permission_denied_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE)
    path.chmod(0)
    assert refused(path) == "permission denied"


def test_not_utf8_and_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "host.yml"
    path.write_bytes(EXAMPLE.encode() + b"\xff\n")
    assert refused(path) == f"not UTF-8 text (byte {len(EXAMPLE.encode())})"
    text, line = changed("hostname: glm5", "hostname: glm\x015")
    assert refused(write(tmp_path, text)) == (f"YAML syntax error: character #x0001: control characters are not "
                                              f"allowed (line {line})")


# -- what the structure may hold -----------------------------------------------------------------
def test_too_many_values_too_deep_a_nul(tmp_path: Path) -> None:
    wide = "version: 1\nhosts: [" + ", ".join(["1"] * MAX_VALUES) + "]\n"
    assert refused(write(tmp_path, wide)) == f"more than {MAX_VALUES} YAML values; a host file is far smaller (line 2)"
    deep = "version: 1\nhosts:\n" + "".join("  " * (depth + 1) + f"k{depth}:\n" for depth in range(100))
    assert refused(write(tmp_path, deep)) == "YAML nested too deeply for a host file (more than 64 levels)"
    text, line = changed("hostname: glm5", 'hostname: "glm\\0five"')
    assert refused(write(tmp_path, text)) == (f"hosts[0].container.hostname: holds a NUL character (\\x00): a host "
                                              f"file's values are text (line {line})")


def test_keys_are_plain_strings(tmp_path: Path) -> None:
    text, line = changed("      swap_mb: 0", "      1: 0")
    assert refused(write(tmp_path, text)) == (f"hosts[0].container: key 1 must be a string (YAML reads it as a "
                                              f"number: quote it) (line {line})")
    text, line = changed("      swap_mb: 0", "      ? [a]\n      : 0")
    assert refused(write(tmp_path, text)) == f"hosts[0].container: a key must be a plain string, not a mapping or list (line {line})"
    # `on` is a string in YAML 1.2, not true: an unknown key, with the key it was meant to be.
    fleet = (ROOT / "inventory" / "lab" / "fleet.yml").read_text()
    line = fleet[:fleet.index("  runs_on: pve-lab")].count("\n") + 1
    path = write(tmp_path, fleet.replace("  runs_on: pve-lab", "  on: pve-lab"))
    code, lines = validate(path)
    assert code == 2 and f"error: {path}: router.on: unknown key (did you mean 'runs_on'?) (line {line})" in lines


# -- echoes: escaped, cut, never markup, never a second line ---------------------------------------
@pytest.mark.parametrize("value, shown_as", [
    ("'[/x]'", "'[/x]'"),  # Rich markup: printed as written (a MarkupError before)
    ("'[red]x[/red]'", "'[red]x[/red]'"),
    ('"a\\nerror: forged"', "'a\\nerror: forged'"),  # a newline cannot make a second error line
    ('"\\e[31mred"', "'\\x1b[31mred'"),  # an escape sequence is shown, not sent to the terminal
    ('"a\\u202eb"', "'a\\u202eb'"),
    ("'" + "x" * 5000 + "'", "'" + "x" * 77 + "...'"),
])
def test_an_echoed_value_is_escaped_and_cut(tmp_path: Path, value: str, shown_as: str) -> None:
    text, line = changed("stack: sglang-0.5.9-cu128", f"stack: {value}")
    message = refused(write(tmp_path, text))
    assert message.startswith(f"hosts[0].image.stack: unknown stack {shown_as} (known: ") and message.isprintable()
    assert message.endswith(f"(line {line})")


def test_a_regex_in_a_message_is_printed_whole(tmp_path: Path) -> None:
    text, line = changed("hostname: glm5", "hostname: glm_5")
    assert refused(write(tmp_path, text)) == (f"hosts[0].container.hostname: has the wrong form (expected to match "
                                              f"{hostfile.HOSTNAME_RE}) (line {line})")


def test_an_odd_key_is_shown_quoted_in_the_path(tmp_path: Path) -> None:
    text, line = changed("      swap_mb: 0", '      "sw\\e[0map\\nmb": 0')
    assert refused(write(tmp_path, text)) == (f"hosts[0].container.'sw\\x1b[0map\\nmb': unknown key (did you mean "
                                              f"'swap_mb'?) (line {line})")


@pytest.mark.parametrize("name", ["[/x].yml", "new\nline.yml", "esc\x1b[31m.yml"])
def test_an_odd_file_name_is_shown_escaped(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    code, lines = validate(path)
    assert code == 2 and lines == [f"error: {shown(str(path), limit=240)}: no such file"]


def test_shown() -> None:
    assert shown("a\nb\x1b[0m\u202e\\") == "a\\nb\\x1b[0m\\u202e\\\\"
    assert shown("x" * 200) == "x" * 77 + "..." and len(shown("é" * 10_000_000)) == 80
    assert shown("it's", quote=True) == "'it\\'s'" and shown(None) == "None" and shown(True) == "True"
    assert shown(10 ** 5000) == "(a whole number of 16610 bits)" and shown(12) == "12"
