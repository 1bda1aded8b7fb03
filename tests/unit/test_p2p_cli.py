"""``python3 -m gpunode.stages.p2p`` as a process: input checks, exit codes, what it needs to import."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from gpunode.stages.p2p import command, measure
from gpunode.stages.p2p.verdict import Expectations

ROOT = Path(__file__).resolve().parents[2]


def p2p(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "gpunode.stages.p2p", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize("args", [["--size-mb", "0"], ["--size-mb", "5000"], ["--same-numa-gbps", "-1"],
                                  ["--min-gpus", "0"], ["--size-mb", "many"]])
def test_bad_input_exits_2(args: list[str]) -> None:
    done = p2p(*args)
    assert done.returncode == 2, done.stderr
    assert "error" in done.stderr and done.stdout == ""


def test_bad_input_is_refused_before_anything_is_read() -> None:
    out = io.StringIO()
    assert command.run(as_json=True, expect=Expectations(cross_numa_gbps=0), size_mb=512, quick=False, out=out) == 2
    assert out.getvalue() == ""


def test_expectations_from_the_example_host_file(tmp_path: Path) -> None:
    from gpunode.stages.p2p.__main__ import _parser, expectations

    args = _parser().parse_args(["--expect-file", str(ROOT / "inventory" / "example" / "host.yml"),
                                 "--nvlink-gbps", "150"])
    assert expectations(args) == Expectations(same_numa_gbps=45, cross_numa_gbps=35, nvlink_gbps=150)
    bad = tmp_path / "p2p.yml"
    bad.write_text("p2p: {same_numa_gbs: 50}\n")
    done = p2p("--expect-file", str(bad))
    assert done.returncode == 2 and "same_numa_gbs" in done.stderr


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_it_is_an_environment_problem() -> None:
    done = p2p("--json")
    assert done.returncode == 4
    report = json.loads(done.stdout)
    assert report["schema"] == "gpunode.p2p/1" and report["verdict"]["exit_code"] == 4
    assert [f["code"] for f in report["verdict"]["findings"]] == ["nvml-init"]
    text = p2p()
    assert text.returncode == 4 and "FAIL nvml-init" in text.stdout


def test_help_lists_the_exit_codes() -> None:
    done = p2p("--help")
    assert done.returncode == 0
    for code in ("0  pass", "1  fail", "2  bad input", "4  environment", "5  pass, but pair checks not applicable"):
        assert code in done.stdout


def test_imports_without_torch_or_pydantic() -> None:
    # The check must run in the server image (no pydantic) and import on hosts without torch.
    code = ("import sys; sys.modules['pydantic'] = None; sys.modules['typer'] = None\n"
            "import gpunode.stages.p2p.__main__, gpunode.stages.p2p.command, gpunode.stages.p2p.report\n"
            "assert 'torch' not in sys.modules, 'torch imported eagerly'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert done.returncode == 0, done.stderr


def test_multicast_stays_off_in_the_environment_it_builds() -> None:
    environ: dict[str, str] = {"NCCL_NVLS_ENABLE": "1"}
    measure.apply_safe_environment(environ)
    assert environ == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_progress_reports_a_step_that_overruns(monkeypatch: pytest.MonkeyPatch) -> None:
    # The step's age on Progress's own clock (measure's time.monotonic), moved by the test; the step
    # runs in a thread of its own, as a measurement does beside the watchdog.
    now = [1000.0]
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    progress = measure.Progress()
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        with progress.step("cuda:0->cuda:1 unidirectional"):
            entered.set()
            release.wait(60)

    worker = threading.Thread(target=stuck)
    worker.start()
    assert entered.wait(60)
    assert progress.overdue(0.01) is None  # just begun
    now[0] += 0.05
    assert progress.overdue(10) is None
    assert progress.overdue(0.01) == "cuda:0->cuda:1 unidirectional"
    release.set()
    worker.join(60)
    assert not worker.is_alive() and progress.overdue(0) is None


def test_method_sampling() -> None:
    full, quick = measure.method_for(512, quick=False), measure.method_for(512, quick=True)
    assert full.size_bytes == quick.size_bytes == 512 * 2**20
    assert quick.samples < full.samples and quick.warmup_copies <= full.warmup_copies


def test_gpunode_p2p_takes_expectations_from_the_host_file(gpunode) -> None:
    # No GPU here: exit 4, and the expectations printed are the host file's, min GPUs from --tp-size.
    from pathlib import Path

    lab = Path(__file__).resolve().parents[2] / "inventory" / "lab" / "host.yml"
    result = gpunode("p2p", "--local", str(lab), "--json")
    assert result.returncode == 4, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["expectations"]["min_gpus"] == 2 and data["expectations"]["same_numa_gbps"] == 45.0
    bad = gpunode("p2p", "--local", str(lab), "--host", "nope")
    assert bad.returncode == 2 and "name one host with --host (pve-lab)" in bad.stderr
