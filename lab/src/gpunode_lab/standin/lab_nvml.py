"""The lab's NVML for gpunode's GPU exporter (``--nvml-module=lab_nvml``, in the stand-in image): the lab
has no GPU, so every call is answered from what NVML answered the exporter on a real H200
(recorded/h200/nvml, by tests/fixtures/monitor/record.py), once for each /dev/nvidiaN the container
was handed (the lab's mknod'd nodes, as the real driver enumerates the GPUs it is given). nvidia-ml-py
itself, beside it, gives the error codes and constants."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from nvml_replay import ReplayNvml  # beside this file in the stand-in image

RECORDING = Path(__file__).resolve().parent.parent / "nvml_calls.json"


def _handed_gpus() -> int:
    return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))


_replay = ReplayNvml(RECORDING, gpus=_handed_gpus())
NVMLError = _replay.NVMLError


def __getattr__(name: str) -> Any:
    return getattr(_replay, name)
