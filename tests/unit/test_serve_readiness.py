"""Readiness and diagnosis against the fake SGLang server run as a local process: the startup
sequence as sglang 0.5.9 logs and answers it, each crash signature, a 503 that never clears, a hang."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpunode.stages.serve import readiness
from gpunode.stages.serve.diagnose import diagnose, redact

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above

SLOW = {"FAKE_SGLANG_LOAD_S": "0.6", "FAKE_SGLANG_AUTOTUNE_S": "0.3", "FAKE_SGLANG_WARMUP_S": "0.6"}


def watch(process, url: str, timeout_s: float = 60.0, secrets: tuple[str, ...] = ()) -> readiness.Readiness:
    return readiness.wait_ready(process, readiness.HttpHealthProbe(url), timeout_s=timeout_s, secrets=secrets)


def test_slow_start_goes_through_every_phase_then_ready(tmp_path: Path) -> None:
    statuses: list[int | None] = []
    with fake_server(tmp_path, env=SLOW, wait=False) as (process, url):
        probe = readiness.HttpHealthProbe(url)

        def recording_probe() -> int | None:
            statuses.append(probe())
            return statuses[-1]

        result = readiness.wait_ready(process, recording_probe, timeout_s=60)
    assert result.ready and result.phase == "ready" and result.diagnosis is None
    seen = [event.phase for event in result.events]
    assert seen == ["container", "distributed", "loading", "loaded", "memory_pool", "autotune", "autotuned",
                    "http", "fired_up", "ready"]
    # The port is closed while loading (None: the first poll comes at once, the port opens after the
    # load), /health_generate is 503 while warming up, then 200: never back to an earlier answer.
    # (How many 503s a poll catches depends on the machine's speed, so their number is not asserted.)
    shape = "".join({None: "n", 503: "w", 200: "r"}.get(status, "?") for status in statuses)
    assert re.fullmatch(r"n+w*r", shape), statuses
    loaded = next(e for e in result.events if e.phase == "loaded")
    assert "avail mem=37.10 GB" in loaded.detail


def test_readiness_is_noticed_by_the_poll_that_sees_the_server_fired_up(tmp_path: Path) -> None:
    """The real health tick (sglang sleeps 1 s before it checks its generation came back): the probe
    sent after the "fired up" line waits out that tick and answers 200, and that poll reports ready,
    so readiness comes one tick after warm-up, with no extra poll (counted, not timed)."""
    statuses: list[int | None] = []
    polls_before: dict[str, int] = {}
    with fake_server(tmp_path, env={"FAKE_SGLANG_HEALTH_TICK_S": "1.0", "FAKE_SGLANG_WARMUP_S": "0.7"},
                     wait=False) as (process, url):
        probe = readiness.HttpHealthProbe(url)

        def recording_probe() -> int | None:
            statuses.append(probe())
            return statuses[-1]

        result = readiness.wait_ready(process, recording_probe, timeout_s=60,
                                      on_event=lambda event: polls_before.setdefault(event.phase, len(statuses)))
    assert result.ready
    # The server says "fired up" once it answers health with a generation (its status is Up just
    # before the line is written, so a probe may meet Up in the poll before the line is read).
    fired = polls_before.get("fired_up", len(statuses) - 1)
    assert statuses[fired:] == [200]
    assert polls_before["ready"] == len(statuses)


class ScriptedServer:
    """A server handle whose log lines arrive poll by poll, and which never exits."""

    def __init__(self, lines_per_poll: list[list[str]]) -> None:
        self.lines_per_poll = list(lines_per_poll)

    def state(self) -> readiness.ProcessState:
        return readiness.ProcessState(running=True)

    def new_log_lines(self) -> list[str]:
        return self.lines_per_poll.pop(0) if self.lines_per_poll else []

    def log_text(self, tail: int = 400) -> str:
        return ""


class FakeClock:
    """wait_ready's clock and sleep: time moves only when the loop sleeps or a probe takes time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


UVICORN = "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"
FIRED_UP = "[2026-01-01 00:00:00] The server is fired up and ready to roll!"


def scripted_probe(clock: FakeClock, answers: list[int | None], takes_s: float) -> tuple[Callable[[], int | None],
                                                                                          list[float]]:
    """A probe answering ``answers`` in turn, each taking ``takes_s`` of the clock; and when each was sent."""
    sent: list[float] = []
    pending = list(answers)

    def probe() -> int | None:
        sent.append(clock.now)
        clock.now += takes_s
        return pending.pop(0)

    return probe, sent


def test_polls_keep_their_cadence_and_ready_is_the_first_200() -> None:
    clock = FakeClock()
    probe, sent = scripted_probe(clock, [None, None, 503, 503, 200], takes_s=0.1)
    server = ScriptedServer([[], [], [UVICORN], [FIRED_UP]])
    result = readiness.wait_ready(server, probe, timeout_s=60, poll_s=0.25, clock=clock, sleep=clock.sleep)
    assert result.ready and result.last_health == 200
    # A poll every 0.25 s from the start, whatever the probe costs: it sleeps what is left of the period.
    assert sent == pytest.approx([100.0, 100.25, 100.5, 100.75, 101.0])
    assert clock.sleeps == pytest.approx([0.15] * 4)
    at = {event.phase: event.at_s for event in result.events}
    assert at == pytest.approx({"container": 0.0, "http": 0.5, "fired_up": 0.75, "ready": 1.1})
    assert result.elapsed_s == pytest.approx(1.1)


def test_a_probe_slower_than_the_poll_is_followed_at_once() -> None:
    """A health request that waits out sglang's 1 s tick: the next poll does not add a sleep on top,
    so readiness is seen at most a tick and a poll after the server is up."""
    clock = FakeClock()
    probe, sent = scripted_probe(clock, [503, 503, 200], takes_s=1.0)
    result = readiness.wait_ready(ScriptedServer([[UVICORN], [FIRED_UP]]), probe, timeout_s=60, poll_s=0.25,
                                  clock=clock, sleep=clock.sleep)
    assert result.ready and clock.sleeps == [0.0, 0.0]
    assert sent == pytest.approx([100.0, 101.0, 102.0])
    assert next(e.at_s for e in result.events if e.phase == "ready") == pytest.approx(3.0)


def test_the_timeout_is_read_on_the_loops_own_clock() -> None:
    clock = FakeClock()
    probe, sent = scripted_probe(clock, [503] * 100, takes_s=0.0)
    result = readiness.wait_ready(ScriptedServer([[UVICORN]]), probe, timeout_s=2.0, poll_s=0.25, clock=clock,
                                  sleep=clock.sleep)
    assert not result.ready and not result.exited and result.last_health == 503
    assert len(sent) == 9 and result.elapsed_s == pytest.approx(2.0)  # polls at 0, 0.25, ... 2.0
    assert result.diagnosis is not None and result.diagnosis.key == "no_generation"


@pytest.mark.parametrize(("crash", "key", "fix_words"), [
    ("oom", "cuda_oom", "--mem-fraction-static"),
    ("cuinit", "cuda_init_hmm", "uvm_disable_hmm=1"),
    ("nccl", "nccl_error", "gpunode p2p"),
    ("nccl_timeout", "nccl_watchdog", "NCCL_P2P_DISABLE"),
    ("nan", "nan_in_sampling", "trtllm"),
    ("page_table", "page_table_1_flattened", "--kv-cache-dtype bf16"),
    ("weights", "weights_missing", "*.safetensors"),
])
def test_crash_is_diagnosed_fast_with_its_fix(tmp_path: Path, crash: str, key: str, fix_words: str) -> None:
    with fake_server(tmp_path, api_key="k3y-not-to-print", env={"FAKE_SGLANG_CRASH": crash}, wait=False) as (
            process, url):
        result = watch(process, url, timeout_s=60, secrets=("k3y-not-to-print",))
        assert process.proc.poll() is not None
    # exited: the loop returned on the exit, not at its timeout (that path leaves exited False).
    assert not result.ready and result.exited and result.elapsed_s < 60
    assert result.diagnosis is not None and result.diagnosis.key == key
    assert fix_words in result.diagnosis.fix
    assert result.diagnosis.exit_code not in (0, None)
    assert "k3y-not-to-print" not in str(result.as_dict())


def test_missing_model_directory(tmp_path: Path) -> None:
    with fake_server(tmp_path, wait=False, extra_args=["--model-path", str(tmp_path / "nowhere")]) as (process, url):
        result = watch(process, url)
    assert result.exited and result.diagnosis is not None and result.diagnosis.key == "model_path_missing"
    assert "model.path" in result.diagnosis.fix and result.diagnosis.exit_code == 1


def test_empty_model_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with fake_server(tmp_path, wait=False, extra_args=["--model-path", str(empty)]) as (process, url):
        result = watch(process, url)
    assert result.exited and result.diagnosis is not None and result.diagnosis.key == "model_dir_empty"
    assert result.diagnosis.evidence == (f"ValueError: Unrecognized model in {empty}. Should have a `model_type` "
                                         "key in its config.json.")


def test_503_that_never_clears_times_out_with_a_diagnosis(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_HEALTH": "never", "SGLANG_HEALTH_CHECK_TIMEOUT": "0.3"}
    with fake_server(tmp_path, env=env) as (process, url):
        result = watch(process, url, timeout_s=2.0)
        assert process.proc.poll() is None  # still running: left alone
    assert not result.ready and not result.exited and result.last_health == 503
    assert result.phase == "fired_up"
    assert result.diagnosis is not None and result.diagnosis.key == "no_generation"
    assert "Health check failed" in result.diagnosis.title


def test_hang_in_nccl_init_times_out_naming_nccl(tmp_path: Path) -> None:
    with fake_server(tmp_path, env={"FAKE_SGLANG_HANG": "nccl_init"}, wait=False) as (process, url):
        # Watched once the hang has begun (its last line is logged), so a slow start of the process
        # cannot pass for a hang in an earlier phase; the watch reads the log from its start.
        deadline = time.monotonic() + 30
        while "Init torch distributed begin." not in process.log_path.read_text(errors="replace"):
            assert process.proc.poll() is None and time.monotonic() < deadline, process.log_text()
            time.sleep(0.02)
        result = watch(process, url, timeout_s=1.5)
    assert result.phase == "distributed" and result.last_health is None
    assert result.diagnosis is not None and result.diagnosis.key == "nccl_init_hang"
    assert "gpunode p2p" in result.diagnosis.fix


def test_restart_counts_as_a_failure() -> None:
    class Restarting:
        def __init__(self) -> None:
            self.calls = 0

        def state(self) -> readiness.ProcessState:
            self.calls += 1
            return readiness.ProcessState(running=True, restarts=0 if self.calls == 1 else 1, exit_code=None)

        def new_log_lines(self) -> list[str]:
            return []

        def log_text(self, tail: int = 400) -> str:
            return "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0\n"

    result = readiness.wait_ready(Restarting(), lambda: None, timeout_s=5, poll_s=0.01)
    assert result.exited and result.diagnosis is not None and result.diagnosis.key == "nan_in_sampling"


def test_unknown_failures_quote_the_last_error_and_redact() -> None:
    log = ("[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/model', api_key='abc123', admin_api_key=None)\n"
           "ValueError: something new went wrong with key abc123\n")
    found = diagnose(log, exit_code=1, secrets=("abc123",))
    assert found.key == "unknown" and "status 1" in found.title
    assert "something new" in found.evidence and "abc123" not in found.evidence
    assert redact(log) .count("'***'") == 1
    assert diagnose("Killed\n", exit_code=137, oom_killed=True).key == "host_oom"
