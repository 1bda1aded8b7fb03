"""The pure parts of the in-image probe: reading a cubin's SM from its ELF header."""

from __future__ import annotations

import struct
from pathlib import Path

from gpunode.stages.image.probe import EM_CUDA, cubin_arch, main


def cubin(tmp_path: Path, name: str, flags: int, abi_version: int, machine: int = EM_CUDA) -> str:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41, abi_version]) + bytes(7)
    header = ident + struct.pack("<HHIQQQI", 2, machine, 1, 0, 0, 0, flags)
    path = tmp_path / name
    path.write_bytes(header + bytes(12))
    return str(path)


def test_new_abi_keeps_the_sm_in_the_second_byte(tmp_path: Path) -> None:
    # What flashinfer-cubin 0.6.3 ships: ABI 8, e_flags 0x6006402 -> sm_100 (cuobjdump: "sm=100").
    assert cubin_arch(cubin(tmp_path, "a.cubin", 0x6006402, 8)) == "sm_100"
    assert cubin_arch(cubin(tmp_path, "b.cubin", 0x600670A, 8)) == "sm_103"
    assert cubin_arch(cubin(tmp_path, "c.cubin", 0x7807802, 8)) == "sm_120"


def test_old_abi_keeps_the_sm_in_the_low_byte(tmp_path: Path) -> None:
    assert cubin_arch(cubin(tmp_path, "old.cubin", 0x500550, 7)) == "sm_80"


def test_not_a_cuda_elf(tmp_path: Path) -> None:
    assert cubin_arch(cubin(tmp_path, "x86.cubin", 0, 0, machine=62)) is None
    short = tmp_path / "short.cubin"
    short.write_bytes(b"\x7fELF")
    assert cubin_arch(str(short)) is None


def test_probe_reports_missing_things_as_facts() -> None:
    facts = main({"distributions": ["no-such-dist-gpunode"], "tools": ["no-such-tool-gpunode"],
                  "files": ["no/such/file.py"], "kernels": {}, "server_argv": []})
    assert facts["versions"] == {"no-such-dist-gpunode": None}
    assert facts["tools"]["no-such-tool-gpunode"] == {"path": None, "version": None}
    assert facts["files"] == {"no/such/file.py": None}
    assert facts["server_argv"]["ok"] is False and "sglang" in facts["server_argv"]["error"]
