"""Readiness and diagnosis against the fake SGLang server run as a local process: the startup
sequence as sglang 0.5.9 logs and answers it, each crash signature, a 503 that never clears, a hang."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpunode.serve import readiness
from gpunode.serve.diagnose import diagnose, redact

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above

SLOW = {"FAKE_SGLANG_LOAD_S": "0.6", "FAKE_SGLANG_AUTOTUNE_S": "0.3", "FAKE_SGLANG_WARMUP_S": "0.6"}


def watch(process, url: str, timeout_s: float = 15.0, secrets: tuple[str, ...] = ()) -> readiness.Readiness:
    return readiness.wait_ready(process, readiness.HttpHealthProbe(url), timeout_s=timeout_s, secrets=secrets)


def test_slow_start_goes_through_every_phase_then_ready(tmp_path: Path) -> None:
    statuses: list[int | None] = []
    with fake_server(tmp_path, env=SLOW, wait=False) as (process, url):
        probe = readiness.HttpHealthProbe(url)

        def recording_probe() -> int | None:
            statuses.append(probe())
            return statuses[-1]

        result = readiness.wait_ready(process, recording_probe, timeout_s=15)
    assert result.ready and result.phase == "ready" and result.diagnosis is None
    seen = [event.phase for event in result.events]
    assert seen == ["container", "distributed", "loading", "loaded", "memory_pool", "autotune", "autotuned",
                    "http", "fired_up", "ready"]
    # The port is closed while loading (None), /health_generate is 503 while warming up, then 200.
    first_503 = statuses.index(503)
    assert None in statuses[:first_503] and statuses[-1] == 200
    assert set(statuses[first_503:-1]) <= {503}
    loaded = next(e for e in result.events if e.phase == "loaded")
    assert "avail mem=37.10 GB" in loaded.detail


def test_readiness_is_noticed_within_two_seconds(tmp_path: Path) -> None:
    # The real health tick (sglang sleeps 1 s before it checks its generation came back).
    with fake_server(tmp_path, env={"FAKE_SGLANG_HEALTH_TICK_S": "1.0", "FAKE_SGLANG_WARMUP_S": "0.7"},
                     wait=False) as (process, url):
        result = watch(process, url)
        fired = next(e.at_s for e in result.events if e.phase == "fired_up")
        ready = next(e.at_s for e in result.events if e.phase == "ready")
    assert result.ready
    assert ready - fired < 2.0


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
        began = time.monotonic()
        result = watch(process, url, secrets=("k3y-not-to-print",))
        exited_at = time.monotonic()
        assert process.proc.poll() is not None
    assert not result.ready and result.exited
    assert result.diagnosis is not None and result.diagnosis.key == key
    assert fix_words in result.diagnosis.fix
    assert result.diagnosis.exit_code not in (0, None)
    assert exited_at - began < 5.0  # fails within seconds, not at the timeout
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
