"""What the GPU-side stages leave on the node for `gpunode check`: the P2P verdict and the image
record, built from recorded device runs (tests/fixtures/p2p)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from gpunode.ground import exitcodes
from gpunode.stages.p2p import stage as p2p_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.recorded import RECORDED_EXIT  # noqa: E402 - tests/ put on the path just above

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "p2p"


def _verdict(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())["verdict"]


def test_two_gpu_pass_is_recorded_ok_without_warnings_as_failures() -> None:
    verdict = _verdict("h200x2/p2p_x2.json")  # the H200 x2 run: pass, with vm-passthrough warnings
    record = p2p_stage.record([0, 1], verdict["exit_code"], verdict)
    assert record == {"gpus": [0, 1], "ok": True, "exit_code": 0, "status": "pass",
                      "summary": "all 2 ordered pairs of 2 GPUs met expectations", "failed": [], "causes": []}


def test_single_gpu_pass_is_ok() -> None:
    verdict = _verdict("p2p.json")  # one H200: pairs not applicable (recorded as exit 3, 5 now)
    code = RECORDED_EXIT[verdict["exit_code"]]
    record = p2p_stage.record("all", code, {**verdict, "exit_code": code})
    assert record["ok"] and record["exit_code"] == exitcodes.NOT_APPLICABLE
    assert record["status"] == "pass (pairs not applicable)"


def test_failed_findings_are_named_in_the_record() -> None:
    verdict = copy.deepcopy(_verdict("h200x2/p2p_x2.json"))
    verdict["findings"].append({"severity": "fail", "code": "p2p-unavailable", "subject": "GPU0->GPU1",
                                "message": "NVML says P2P read is not supported", "cause": None, "fix": None,
                                "category": "p2p"})
    verdict["status"], verdict["exit_code"] = "fail", 1
    record = p2p_stage.record([0, 1], 1, verdict)
    assert not record["ok"]
    assert record["failed"] == ["FAIL GPU0->GPU1 p2p-unavailable: NVML says P2P read is not supported"]


def test_record_carries_no_timings() -> None:
    # The node's record is rewritten by every run: were timings in it, a healthy re-run would change it.
    verdict = _verdict("h200x2/p2p_x2.json")
    text = json.dumps(p2p_stage.record([0, 1], 0, verdict))
    assert "gbps" not in text.lower() and "seconds" not in text


def test_the_p2p_archive_runs_alone_as_the_image_runs_it(tmp_path: Path) -> None:
    """What the p2p stage puts into the server image is the p2p package, the exit codes, ground.text,
    the finding type and the fabric reader (pci_fabric; both stdlib only), no more of gpunode, and it runs from there on its own: here,
    with no GPU, it says so (exit 4)."""
    import io
    import os
    import subprocess
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(p2p_stage.archive())) as tar:
        names = sorted(tar.getnames())
        tar.extractall(tmp_path, filter="data")
    assert [name for name in names if not name.startswith("gpunode/stages/p2p/")] == [
        "gpunode/__init__.py", f"gpunode/{p2p_stage.PCI_FABRIC}", "gpunode/ground/__init__.py",
        "gpunode/ground/exitcodes.py", "gpunode/ground/finding.py", "gpunode/ground/text.py", "gpunode/stages/__init__.py"]
    assert "gpunode/stages/p2p/stage.py" not in names and "gpunode/stages/p2p/__main__.py" in names
    code = ("import sys, runpy; import gpunode; assert gpunode.__file__.startswith(sys.argv[1]), gpunode.__file__; "
            "sys.argv = ['p2p', '--json']; runpy.run_module('gpunode.stages.p2p', run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == exitcodes.ENVIRONMENT, done.stderr[-2000:]
    assert json.loads(done.stdout)["verdict"]["exit_code"] == exitcodes.ENVIRONMENT
