"""A pynvml that answers from a recording made on a real GPU (tests/fixtures/monitor/record.py; the lab
keeps it in recorded/h200/nvml): each
nvml* call gets the next recorded answer for its name and GPU, a struct as an object with its
fields, a refusal as pynvml's own NVMLError of the recorded code. Calls may be refused on purpose
(``refuse``: name -> NVML error code, for a GPU or all) and a GPU may be lost (every call on it
answers GPU is lost, as NVML does once a GPU fell off the bus). Xid events can be delivered
(``deliver``); NVML's event wait otherwise times out as the real one does."""

from __future__ import annotations

import json
import queue
import threading
import types
from pathlib import Path
from typing import Any

import pynvml

ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST


def _struct(value: Any) -> Any:
    return types.SimpleNamespace(**value) if isinstance(value, dict) else value


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class ReplayNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, recording: Path, *, gpus: int | None = None, refuse: dict[tuple[str, int | None], int] | None = None,
                 lost: set[int] | None = None, init_error: int | None = None) -> None:
        self.calls: list[dict[str, Any]] = json.loads(recording.read_text())
        self.answers: dict[tuple[str, int | None], list[Any]] = {}
        for call in self.calls:
            self.answers.setdefault((call["fn"], call["gpu"]), []).append(call)
        recorded = next(c["result"] for c in self.calls if c["fn"] == "nvmlDeviceGetCount")
        self.gpus = recorded if gpus is None else gpus
        self.refuse = dict(refuse or {})
        self.lost = set(lost or ())
        self.init_error = init_error
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.asked: list[str] = []
        self.lock = threading.Lock()

    # Constants the exporter reads off the module.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_") or name.startswith("nvmlEventType"):
            return getattr(pynvml, name)
        if name.startswith("nvml"):
            return lambda *args: self._answer(name, args)
        raise AttributeError(name)

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        with self.lock:
            self.asked.append(name)
        gpu = next((a.index for a in args if isinstance(a, Handle)), None)
        if gpu is not None and gpu in self.lost:
            raise pynvml.NVMLError(ERROR_GPU_IS_LOST)
        for key in ((name, gpu), (name, None)):
            if key in self.refuse:
                raise pynvml.NVMLError(self.refuse[key])
        if name == "nvmlInit" and self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        if name == "nvmlDeviceGetCount":
            return self.gpus
        if name == "nvmlDeviceGetHandleByIndex":
            if args[0] in self.lost:
                raise pynvml.NVMLError(ERROR_GPU_IS_LOST)
            return Handle(args[0])
        if name in ("nvmlShutdown", "nvmlEventSetFree"):
            return None
        recorded = self.answers.get((name, 0 if gpu is not None else None))
        if not recorded:
            raise AssertionError(f"{name} was not recorded: the exporter asks NVML something the real run did not")
        call = recorded[0]
        if "error" in call:
            raise pynvml.NVMLError(call["error"][0])
        if name == "nvmlDeviceGetUUID" and gpu:
            return f"{call['result']}-{gpu}"  # a distinct UUID for each replayed GPU past the recorded one
        return _struct(call["result"])

    def deliver(self, gpu: int, xid: int) -> None:
        self.events.put((gpu, xid))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            gpu, xid = self.events.get(timeout=min(timeout_ms, 50) / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(ERROR_TIMEOUT) from None
        return types.SimpleNamespace(device=Handle(gpu), eventData=xid, eventType=pynvml.nvmlEventTypeXidCriticalError)
