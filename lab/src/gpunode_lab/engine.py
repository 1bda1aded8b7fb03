"""The lab's Docker Engine: Debian's docker.io, dockerd started in the background if it is not running."""

from __future__ import annotations

import subprocess
import time

from gpunode_lab.contract import DOCKERD_LOG, LabError, Progress
from gpunode_lab.util import ok, tail

def docker_running() -> bool:
    return ok(["docker", "info"], timeout=20)


def ensure_docker(progress: Progress) -> bool:
    if docker_running():
        progress("docker: engine running")
        return False
    progress(f"docker: starting dockerd (log {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as log:
        proc = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if docker_running():
            progress("docker: engine up")
            return True
        if proc.poll() is not None and not docker_running():
            raise LabError(f"dockerd exited with status {proc.returncode}: {tail(DOCKERD_LOG)} "
                           f"(see {DOCKERD_LOG})")
        time.sleep(1)
    raise LabError(f"dockerd did not answer `docker info` within 60 s: see {DOCKERD_LOG}")
