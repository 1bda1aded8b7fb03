"""The stand-in's flags are sglang's: the data it parses with (0.5.9's and 0.5.23's) equals the real
parser's, dumped in each stack's built image, and a misspelt flag fails the same way in both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from gpunode.stages.image import BuildResult
from gpunode.catalogue.sglangargs import ARGS_DIR
from gpunode_lab.contract import STANDIN

pytestmark = pytest.mark.image

FAKES = STANDIN  # the stand-in server the lab ships


@pytest.mark.parametrize(("image", "data"), [("built", "sglang_0_5_9_args.json"),
                                            ("current_built", "sglang_0_5_23_args.json")])
def test_the_stand_ins_flag_data_is_the_real_parsers(image: str, data: str, engine: docker.DockerClient,
                                                      request: pytest.FixtureRequest) -> None:
    tag = request.getfixturevalue(image).tag
    dumped = engine.containers.run(tag, ["python3", "-c", (FAKES / "dump_sglang_args.py").read_text()],
                                   remove=True, network_disabled=True, stderr=False)
    real = json.loads(dumped)
    shipped = json.loads((ARGS_DIR / data).read_text())
    assert len(real["actions"]) > 300
    assert shipped == real


def test_a_misspelt_flag_fails_alike(built: BuildResult, engine: docker.DockerClient, tmp_path: Path) -> None:
    argv = ["--model-path", "/m", "--disable-radix-cahce"]
    container = engine.containers.create(built.tag, ["python3", "-m", "sglang.launch_server", *argv],
                                         network_disabled=True)
    try:
        container.start()
        real_status = container.wait(timeout=300)["StatusCode"]
        real_last = container.logs(stdout=False, stderr=True).decode().strip().splitlines()[-1]
    finally:
        container.remove(force=True)
    fake = subprocess.run([sys.executable, str(FAKES / "sglang_server.py"), *argv], capture_output=True, text=True,
                          timeout=60)
    assert (fake.returncode, fake.stderr.strip().splitlines()[-1]) == (real_status, real_last) == (
        2, "launch_server.py: error: unrecognized arguments: --disable-radix-cahce")
