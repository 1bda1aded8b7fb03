"""`gpunode diagnose` and serve's matcher: linear time, bounded memory, and no input that blocks it
or gets a traceback (issue 31, item 5)."""

from __future__ import annotations

import errno
import json
import os
import pty
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.stages.serve import diagnose as d
from gpunode.stages.serve import logread

sys.path.insert(0, str(Path(__file__).parent))
from test_diagnose_signatures import REAL  # noqa: E402  (the real messages, one source)

ROOT = Path(__file__).resolve().parents[2]
BY_KEY = {key: text for key, text in reversed(REAL)}  # the first text of each signature
HANG_S = 30  # a subprocess that blocks fails the test instead of hanging the suite


def cli(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["diagnose", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def subprocess_cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode", "diagnose", *args], capture_output=True, text=True,
                          timeout=HANG_S, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def one_error_line(stderr: str) -> str:
    """The single line of an error; fails on a traceback or a second line."""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --- what is refused, each with one line and exit 2 -----------------------------------------------


def unreadable(tmp_path: Path) -> Path:
    """A regular file this process may not read: mode 000, or for root a write-only /proc file."""
    if os.geteuid() != 0:
        path = tmp_path / "locked.log"
        path.write_text("x\n")
        path.chmod(0)
        return path
    path = Path("/proc/sys/vm/drop_caches")  # mode 0200: proc refuses reads even to root
    if not path.exists():
        pytest.skip("running as root with no file that root cannot read")
    return path


@pytest.mark.parametrize("case", ["missing", "not_a_directory", "name_too_long", "symlink_loop", "directory",
                                  "unreadable", "device", "socket"])
def test_unreadable_or_special_paths_are_bad_input_in_one_line(case: str, tmp_path: Path) -> None:
    (tmp_path / "file.log").write_text("x\n")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    paths = {
        "missing": lambda: (tmp_path / "nope.log", os.strerror(errno.ENOENT)),
        "not_a_directory": lambda: (tmp_path / "file.log" / "x.log", os.strerror(errno.ENOTDIR)),
        "name_too_long": lambda: (tmp_path / ("x" * 300), os.strerror(errno.ENAMETOOLONG)),
        "symlink_loop": lambda: (tmp_path / "loop", os.strerror(errno.ELOOP)),
        "directory": lambda: (tmp_path, os.strerror(errno.EISDIR)),
        "unreadable": lambda: (unreadable(tmp_path), os.strerror(errno.EACCES)),
        "device": lambda: (Path(os.devnull), "is a character device, not a log file"),
    }
    with tempfile.TemporaryDirectory(prefix="gpn") as short, socket.socket(socket.AF_UNIX) as listening:
        if case == "socket":  # in a short folder: a socket's path must fit in 108 bytes
            listening.bind(f"{short}/s")
            path, said = Path(short) / "s", "is a socket, not a log file"
        else:
            path, said = paths[case]()
        code, stdout, stderr = cli(str(path))
    assert code == 2 and stdout == ""
    assert one_error_line(stderr) == f"error: {path}: {said}"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)  # no writer: opening it to read would wait for one forever
    result = subprocess_cli(str(fifo), "--json")
    assert result.returncode == 2
    assert one_error_line(result.stderr) == f"error: {fifo}: is a FIFO (named pipe), not a log file"


def test_a_path_swapped_for_a_fifo_after_the_check_does_not_block(tmp_path: Path) -> None:
    """Between stat and open the path may change: open is non-blocking and what it opened is checked."""
    fifo, regular = tmp_path / "log.fifo", tmp_path / "file.log"
    os.mkfifo(fifo)
    regular.write_text("x\n")
    race = (f"import os\nfrom gpunode.stages.serve import logread\nreal = os.stat\n"
            f"logread.os.stat = lambda path, *a, **k: real({str(regular)!r}) if path == {str(fifo)!r} else real(path)\n"
            f"try:\n    logread.open_path({str(fifo)!r})\nexcept logread.LogUnreadable as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", race], capture_output=True, text=True, timeout=HANG_S)
    assert result.stdout.strip() == f"{fifo}: is a FIFO (named pipe), not a log file", result.stderr


def test_closed_standard_input_is_bad_input() -> None:
    result = subprocess.run(["sh", "-c", 'exec "$0" -m gpunode diagnose - <&-', sys.executable],
                            capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert result.returncode == 2
    assert one_error_line(result.stderr) == f"error: standard input is closed: {logread.PIPE_IT_IN}"


def test_a_terminal_on_standard_input_is_bad_input_not_a_wait() -> None:
    main, terminal = pty.openpty()
    try:
        result = subprocess_cli("-", stdin=terminal)
    finally:
        os.close(terminal)
        os.close(main)
    assert result.returncode == 2
    assert one_error_line(result.stderr) == f"error: standard input is a terminal: {logread.PIPE_IT_IN}"


def test_standard_input_from_a_file_a_pipe_or_dev_null(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("boot\n" + BY_KEY["weights_missing"] + "\n")
    with log.open() as redirected:
        from_file = subprocess_cli("-", "--json", stdin=redirected)
    assert (from_file.returncode, [f["id"] for f in json.loads(from_file.stdout)["findings"]]) == (0, ["weights_missing"])
    with open(os.devnull) as empty:
        assert json.loads(subprocess_cli("-", "--json", stdin=empty).stdout) == {"findings": []}
    code, stdout, _ = cli("-", "--json", stdin=BY_KEY["jit_no_nvcc"] + "\n")
    assert (code, [f["id"] for f in json.loads(stdout)["findings"]]) == (0, ["jit_no_nvcc"])


# --- linear time -------------------------------------------------------------------------------------

PATHOLOGICAL = "[2026-12-01 07:40:00 TP3] " + "NCCL error in: " * 70_000  # ~1 MB: 35 s before


def test_the_pathological_megabyte_line_costs_a_pass() -> None:
    log = "\n".join(["boot", PATHOLOGICAL, BY_KEY["nccl_error"], BY_KEY["kv_cache_no_room"]])
    began = time.process_time()
    found = d.findings(log)
    assert time.process_time() - began < 5
    assert [f.code for f in found] == ["nccl_error", "kv_cache_no_room"]
    assert found[0].evidence == BY_KEY["nccl_error"]
    # Serve's failure path: the same matcher, the same cost.
    began = time.process_time()
    assert d.diagnose(PATHOLOGICAL + "\n" + BY_KEY["cuda_oom"], exit_code=1).key == "cuda_oom"
    assert d.diagnose_docker_error("could not select device driver " * 70_000) is None
    assert time.process_time() - began < 5


def test_the_pathological_line_through_the_cli(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"{PATHOLOGICAL}\n{BY_KEY['nccl_error']}\n")
    began = time.process_time()
    code, stdout, _ = cli(str(log), "--json")
    assert time.process_time() - began < 5
    assert code == 0 and [f["id"] for f in json.loads(stdout)["findings"]] == ["nccl_error"]


def test_a_long_line_is_cut_before_matching_and_shown_cut() -> None:
    # A signature past the cut is not seen; one before it is, and its line is shown at most LINE_CHARS long.
    beyond = "x" * logread.LINE_CHARS + BY_KEY["weights_missing"]
    assert d.findings(beyond) == []
    within = BY_KEY["nccl_error"] + " tail" * 100_000
    (found,) = d.findings(within)
    assert found.code == "nccl_error" and len(found.evidence) == d.LINE_CHARS


def test_no_pattern_backtracks_over_repeated_prefixes() -> None:
    """Uncut, each pattern (as the scan uses it) on each real message's first half repeated over
    768 KB, the shape that made `X.*Y` quadratic: one pass each, about a second in all. The patterns
    before took ~11 s, nearly all of it in the config and NCCL patterns."""
    patterns = [re.compile(p) for signature in d.SIGNATURES for p in signature.patterns]
    patterns += [finder for finder, _ in d._ERRORISH] + [d._FRAME]
    checks = [check for _, check in d._ERRORISH if check]
    size = 768_000
    lines = {text[:len(text) // 2] * (size // (len(text) // 2)) for _, text in REAL}
    lines |= {"a." * (size // 2), "a" * size, "Error" * (size // 5)}
    began = time.process_time()
    for line in lines:
        for pattern in patterns:
            pattern.search(line)
        for check in checks:
            check(line)
    assert time.process_time() - began < 5


def test_no_match_spans_a_line_break() -> None:
    """A chunk's matches are its lines' matches: a real message broken in two names nothing that
    neither half names alone."""
    for key, text in REAL[::3]:
        for cut in range(1, len(text), 7):
            halves = {f.code for f in d.findings(text[:cut]) + d.findings(text[cut:])}
            broken = {f.code for f in d.findings(text[:cut] + "\n" + text[cut:])}
            assert broken <= halves | {"unknown"}, (key, cut)


# --- the same findings however the text comes in ----------------------------------------------------

def sample_log() -> str:
    frame = '  File "/sglang/srt/model_executor/model_runner.py", line 840, in init'
    return "\r\n".join([
        "[2026-12-01 07:30:00] server_args=ServerArgs(model_path='/model', api_key='s3cret', ...)",
        "Loading shards:  50%\rLoading shards: 100%",
        "Traceback (most recent call last):", frame,
        '    raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static")',
        BY_KEY["weights_missing"], "", BY_KEY["kv_cache_no_room"], "x" * 9000 + BY_KEY["cuda_oom"],
        BY_KEY["nccl_watchdog"], "KeyError: 'rope_theta'", "[x] Received sigquit from a child process.",
    ]) + "\n"


def chunked(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start:start + size]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 1 << 20])
def test_chunks_give_the_findings_of_the_whole_text(size: int) -> None:
    whole = d.findings(sample_log())
    assert [f.code for f in whole] == ["weights_missing", "kv_cache_no_room", "nccl_watchdog"]
    assert d.scan(chunked(sample_log(), size)).findings() == whole
    # The source line of the traceback (after `File ...`) is passed over even across a chunk's edge.
    assert d.scan(chunked(sample_log(), size)).first["kv_cache_no_room"][2] == BY_KEY["kv_cache_no_room"]


def test_lines_are_split_as_str_splitlines_and_cut() -> None:
    pieces = ["a", "bb", "\n", "\r", "\r\n", "\x0b", "\u2028", "é", "x" * 30, ""]
    generator = random.Random(31)
    for _ in range(300):
        text = "".join(generator.choice(pieces) for _ in range(generator.randint(0, 40)))
        chunks = list(chunked(text, generator.randint(1, 9)))
        lines = [line for block in logread.cut_lines(chunks, line_chars=8) for line in block or []]
        assert lines == [line[:8] for line in text.splitlines()], repr(text)


# --- bounded memory and what is read of a large file -------------------------------------------------


def test_memory_stays_bounded_on_a_long_stream() -> None:
    """32 MB of serving lines with errors throughout: peak traced memory stays near one chunk's."""
    line = "[2026-12-01 08:00:00 TP0] Decode batch. #running-req: 12, #token: 18234, gen throughput: 1234.5\n"
    block = line * (logread.CHUNK_BYTES // len(line)) + "ValueError: something odd\n"

    def stream() -> Iterator[str]:
        for _ in range(32):
            yield block

    tracemalloc.start()
    try:
        result = d.scan(stream())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.lines == 32 * (block.count("\n")) and len(result.errors) == d.ERROR_LINES
    assert peak < 8 * logread.CHUNK_BYTES


def test_a_long_file_is_read_in_its_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logread, "HEAD_BYTES", 4096)
    monkeypatch.setattr(logread, "TAIL_BYTES", 8192)
    monkeypatch.setattr(logread, "CHUNK_BYTES", 1000)
    filler = "[2026-12-01 08:00:00 TP0] Decode batch. #running-req: 12\n"
    log = tmp_path / "server.log"
    log.write_text(BY_KEY["bad_argument"] + "\n" + filler * 200 + BY_KEY["gpu_busy"] + "\n" + filler * 300
                   + BY_KEY["nan_in_sampling"] + "\n" + filler * 10)
    with logread.open_path(str(log)) as source:
        result = d.scan(source.chunks())
    # The start and the end are read; the middle is not, and the note says so.
    assert [f.code for f in result.findings()] == ["bad_argument", "nan_in_sampling"]
    assert source.note is not None and source.note.startswith(f"{log} holds ")
    assert result.last_line == filler.rstrip("\n")
    code, stdout, stderr = cli(str(log), "--json")
    assert code == 0 and [f["id"] for f in json.loads(stdout)["findings"]] == ["bad_argument", "nan_in_sampling"]
    assert stderr == f"note: {source.note}\n"


def test_the_tail_starts_at_a_whole_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logread, "HEAD_BYTES", 10)
    monkeypatch.setattr(logread, "TAIL_BYTES", 20)
    log = tmp_path / "server.log"
    log.write_bytes(b"0123456789" * 5 + b"\n" + b"line one\n" + b"Ninja build failed.\n")
    with logread.open_path(str(log)) as source:
        chunks = list(source.chunks())
    assert chunks == ["0123456789", None, "Ninja build failed.\n"]  # not "ne one" from the middle of a line
    # Nor the start of the line the head ends in: a part of a line is never matched or shown.
    assert list(logread.cut_lines(chunks)) == [None, ["Ninja build failed."]]


# --- what a finding shows ------------------------------------------------------------------------------


def test_findings_hide_every_secret_shape(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "launch_server.py: error: unrecognized arguments: --api-key sk-flag --admin-api-key=sk-admin "
        "HF_TOKEN=hf_env Authorization: Bearer sk-bearer https://user:pa55@hub.example/x api_key='sk-repr'",
    ]) + "\n")
    code, stdout, _ = cli(str(log), "--json")
    (found,) = json.loads(stdout)["findings"]
    assert code == 0 and found["id"] == "bad_argument"
    for secret in ("sk-flag", "sk-admin", "hf_env", "sk-bearer", "pa55", "sk-repr", "user:"):
        assert secret not in stdout
    assert found["line"].startswith("launch_server.py: error: unrecognized arguments: --api-key ***")


def test_a_secret_cut_in_two_by_the_line_cut_is_not_shown_in_part() -> None:
    known = "K" * 3500  # hidden whole: what follows it moves into the shown part of the line
    line = BY_KEY["weights_missing"] + " " + known + " "
    line += "y" * (logread.LINE_CHARS - len(line) - 8) + " tok-0123456789abcdef"  # cut after "tok-0123"
    (found,) = d.findings(line, secrets=(known, "tok-0123456789abcdef"))
    assert found.code == "weights_missing" and "***" in found.evidence
    assert "tok-" not in found.evidence and "K" * 10 not in found.evidence
