#!/usr/bin/env python3
"""CUDA probe: can a process here initialise CUDA and see the GPUs? Stdlib only (ctypes).

Run inside a container started the way the server will be. Prints one JSON object:
{"ok": bool, "cuinit": int, "error": str|null, "hint": str|null, "driver_version": int,
 "devices": [{"ordinal", "name", "uuid", "pci_bus_id", "memory_mib", "cc"}]}
Exit 0 when cuInit succeeds and at least one device is seen, 1 otherwise.
Error 3 (CUDA_ERROR_NOT_INITIALIZED) with nvidia-smi working is the HMM problem of open kernel
modules on some kernels: the fix is on the host, uvm_disable_hmm=1 for nvidia_uvm.
"""

from __future__ import annotations

import ctypes
import json
import sys

HINTS = {
    3: "cuInit returned CUDA_ERROR_NOT_INITIALIZED (3): the HMM problem of NVIDIA's open kernel modules. "
       "On the Proxmox HOST set `options nvidia_uvm uvm_disable_hmm=1` in /etc/modprobe.d and reload "
       "nvidia_uvm (or reboot); containers share the host's kernel, so nothing inside can fix it.",
    100: "CUDA_ERROR_NO_DEVICE (100): no GPU is visible here: check the container's devN entries and the "
         "GPU hand-off to Docker (the node's CDI spec, or the nvidia runtime).",
    999: "CUDA_ERROR_UNKNOWN (999): often /dev/nvidia-uvm missing or not allowed: check the uvm device nodes.",
    304: "CUDA_ERROR_OPERATING_SYSTEM (304): a device node cannot be opened (cgroup rules or permissions).",
}


def _error_text(cuda: ctypes.CDLL, code: int) -> str:
    text = ctypes.c_char_p()
    if cuda.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode()
    return f"error {code}"


def probe() -> dict[str, object]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"ok": False, "cuinit": None, "error": f"libcuda.so.1 not loadable: {exc}",
                "hint": "the NVIDIA user-space driver is not in this container: with gpunode's host-driver hand-off "
                        "the host's tree is mounted at /usr/local/nvidia and its lib64 must be on "
                        "LD_LIBRARY_PATH (re-run the node stage); with nvidia-runtime, the nvidia runtime",
                "driver_version": None, "devices": []}
    code = cuda.cuInit(0)
    result: dict[str, object] = {"cuinit": code, "error": None, "hint": None, "devices": []}
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    result["driver_version"] = version.value
    if code != 0:
        result.update(ok=False, error=_error_text(cuda, code), hint=HINTS.get(code))
        return result
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
        uuid = (ctypes.c_ubyte * 16)()
        cuda.cuDeviceGetUuid(uuid, dev)
        bus = ctypes.create_string_buffer(64)
        cuda.cuDeviceGetPCIBusId(bus, 64, dev)
        mem = ctypes.c_size_t()
        cuda.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        major, minor = ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        hexed = bytes(uuid).hex()
        devices.append({
            "ordinal": ordinal, "name": name.value.decode(), "pci_bus_id": bus.value.decode(),
            "uuid": f"GPU-{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}",
            "memory_mib": mem.value // (1024 * 1024), "cc": f"{major.value}.{minor.value}",
        })
    result["devices"] = devices
    result["ok"] = bool(devices)
    if not devices:
        result.update(error="cuInit succeeded but no device is visible", hint=HINTS[100])
    return result


def main() -> int:
    result = probe()
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
