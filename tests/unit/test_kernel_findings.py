"""Survive kernel updates: module_utils/kernels.py over sysroot-like trees, and the findings
gpunode.stages.host.findings.check_kernels makes of them (tests/fixtures/host/kernels/README.md)."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpunode.stages.host.findings import Expectations, Finding, check_kernels, evaluate
from gpunode.ground.paths import MODULE_UTILS

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "fixtures" / "host" / "kernels"
DRIVER = "580.159.04"
OLD, NEW = "6.8.12-8-pve", "6.8.12-9-pve"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kernels", MODULE_UTILS / "kernels.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels = _load()


def gather(case: str | Path, **kwargs: Any) -> dict[str, Any]:
    root = case if isinstance(case, Path) else CASES / case
    facts: dict[str, Any] = kernels.gather(str(root), version=DRIVER, **kwargs)
    return facts


def per_kernel(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["version"]: k for k in facts["kernels"]}


def named(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.code == name]


def boot_module(findings: list[Finding]) -> Finding:
    (finding,) = [f for f in named(findings, "kernel_module") if "boots next" in f.message]
    return finding


def copy_case(case: str, tmp_path: Path) -> Path:
    target = tmp_path / case
    shutil.copytree(CASES / case, target, symlinks=True)
    return target


# gather() over each fixture


def test_gather_keys_and_healthy_facts() -> None:
    facts = gather("healthy")
    assert set(facts) == {"running", "boot", "boot_reason", "pinned", "module", "version", "dkms_registered", "kernels"}
    assert facts["running"] == NEW and facts["boot"] == NEW
    assert facts["boot_reason"] == "newest installed" and facts["pinned"] is None
    assert facts["module"] == "nvidia" and facts["version"] == DRIVER and facts["dkms_registered"] is True
    assert [k["version"] for k in facts["kernels"]] == [OLD, NEW]
    assert per_kernel(facts)[OLD] == {
        "version": OLD, "running": False, "boots_next": False, "headers": True,
        "headers_package": f"proxmox-headers-{OLD}", "headers_wanted": f"proxmox-headers-{OLD}",
        "module": "installed", "build_failed": False, "make_log": [],
    }
    assert per_kernel(facts)[NEW]["running"] and per_kernel(facts)[NEW]["boots_next"]
    assert per_kernel(facts)[NEW]["module"] == "installed"


def test_gather_new_kernel_without_module() -> None:
    facts = gather("new-kernel-without-module")
    assert facts["running"] == OLD and facts["boot"] == NEW and facts["boot_reason"] == "newest installed"
    new = per_kernel(facts)[NEW]
    assert new["headers"] and new["module"] == "missing" and not new["build_failed"] and new["boots_next"]
    assert per_kernel(facts)[OLD]["module"] == "installed" and per_kernel(facts)[OLD]["running"]


def test_gather_headers_missing() -> None:
    new = per_kernel(gather("headers-missing"))[NEW]
    assert new["headers"] is False and new["headers_package"] is None
    assert new["headers_wanted"] == f"proxmox-headers-{NEW}" and new["module"] == "missing"


def test_gather_dkms_build_failed() -> None:
    facts = gather("dkms-build-failed")
    new, old = per_kernel(facts)[NEW], per_kernel(facts)[OLD]
    assert new["build_failed"] and new["module"] == "missing" and not old["build_failed"]
    assert new["make_log"][0].endswith("nvidia.c:15:1: error: type defaults to ‘int’ in declaration of "
                                       "‘this_kernel_is_too_new’ [-Werror=implicit-int]")
    assert len(new["make_log"]) == 5 and all("error" in line.lower() for line in new["make_log"])
    assert old["make_log"] == []


def test_gather_pinned() -> None:
    facts = gather("pinned")
    assert facts["boot"] == OLD and facts["boot_reason"] == "pinned" and facts["pinned"] == OLD
    assert per_kernel(facts)[OLD]["boots_next"] and not per_kernel(facts)[NEW]["boots_next"]
    assert per_kernel(facts)[NEW]["module"] == "missing"


def test_runtime_root_gives_the_running_kernel(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.12-9-pve\n")
    facts = gather("pinned", runtime_root=str(tmp_path))
    assert facts["running"] == NEW and per_kernel(facts)[NEW]["running"] and not per_kernel(facts)[OLD]["running"]


def test_version_is_the_registered_one_when_not_given() -> None:
    assert kernels.gather(str(CASES / "healthy"))["version"] == DRIVER


# version sort, pins, dpkg, DKMS layout


def test_version_sort() -> None:
    versions = ["6.8.8-2-pve", "6.8.12-10-pve", "6.8.12-9-pve"]
    assert sorted(versions, key=kernels.version_key) == ["6.8.8-2-pve", "6.8.12-9-pve", "6.8.12-10-pve"]
    key = kernels.version_key
    assert key("6.8.12-10-pve") > key("6.8.12-9-pve") > key("6.8.8-2-pve")


def test_newest_installed_boots_next_by_version_not_by_text(tmp_path: Path) -> None:
    (tmp_path / "boot").mkdir()
    for kernel in ("6.8.8-2-pve", "6.8.12-10-pve", "6.8.12-9-pve"):
        (tmp_path / "boot" / f"vmlinuz-{kernel}").touch()
    (tmp_path / "lib/modules/6.5.13-1-pve").mkdir(parents=True)  # headers' build link only: not installed
    facts = gather(tmp_path)
    assert [k["version"] for k in facts["kernels"]] == ["6.8.8-2-pve", "6.8.12-9-pve", "6.8.12-10-pve"]
    assert facts["boot"] == "6.8.12-10-pve" and facts["boot_reason"] == "newest installed"


def test_next_boot_pin_beats_the_pin(tmp_path: Path) -> None:
    root = copy_case("pinned", tmp_path)
    (root / "etc/kernel/next-boot-pin").write_text(f"{NEW}\n")
    facts = gather(root)
    assert facts["boot"] == NEW and facts["boot_reason"] == "pinned for the next boot" and facts["pinned"] == NEW
    # ... and a pin naming a kernel that is gone has no boot entry: the newest boots.
    (root / "etc/kernel/next-boot-pin").unlink()
    (root / "etc/kernel/proxmox-boot-pin").write_text("6.5.13-1-pve\n")
    facts = gather(root)
    assert facts["boot"] == NEW and facts["boot_reason"] == "newest installed" and facts["pinned"] is None


def test_dpkg_status_counts_installed_packages_only(tmp_path: Path) -> None:
    root = copy_case("healthy", tmp_path)
    status = root / "var/lib/dpkg/status"
    text = status.read_text().replace(f"Package: proxmox-headers-{NEW}\nStatus: install ok installed",
                                      f"Package: proxmox-headers-{NEW}\nStatus: install ok unpacked")
    text = text.replace(f"Package: proxmox-headers-{OLD}\nStatus: install ok installed",
                        f"Package: proxmox-headers-{OLD}\nStatus: deinstall ok config-files")
    text += f"Package: pve-headers-{OLD}\nStatus: hold ok installed\nArchitecture: amd64\nVersion: 6.8.12-8\n"
    status.write_text(text)
    by_version = per_kernel(gather(root))
    assert by_version[NEW]["headers"] is False
    assert by_version[OLD]["headers_package"] == f"pve-headers-{OLD}"


def test_debian_kernel_wants_linux_headers() -> None:
    assert kernels.headers_wanted("6.1.0-37-amd64") == "linux-headers-6.1.0-37-amd64"
    assert kernels.headers_wanted(NEW) == f"proxmox-headers-{NEW}"


@pytest.mark.parametrize("suffix", [".ko", ".ko.xz", ".ko.zst", ".ko.gz"])
def test_built_and_installed_module_suffixes(tmp_path: Path, suffix: str) -> None:
    root = copy_case("new-kernel-without-module", tmp_path)
    built = root / f"var/lib/dkms/nvidia/{DRIVER}/{NEW}/x86_64/module"
    built.mkdir(parents=True)
    (built / f"nvidia{suffix}").touch()
    assert per_kernel(gather(root))[NEW]["module"] == "built"
    installed = root / f"lib/modules/{NEW}/updates/dkms"
    installed.mkdir(parents=True)
    (installed / f"nvidia{suffix}").touch()
    assert per_kernel(gather(root))[NEW]["module"] == "installed"


def test_make_log_without_error_lines_gives_its_last_lines(tmp_path: Path) -> None:
    root = copy_case("dkms-build-failed", tmp_path)
    log = root / f"var/lib/dkms/nvidia/{DRIVER}/build/make.log"
    log.write_text(f"DKMS make.log for nvidia-{DRIVER} for kernel {NEW} (x86_64)\nThu Jun 12 06:25:41 UTC 2025\n"
                   + "".join(f"line {i}\n" for i in range(8)))
    assert per_kernel(gather(root))[NEW]["make_log"] == [f"line {i}" for i in range(3, 8)]
    # A log naming another kernel is not this kernel's failure.
    log.write_text(f"DKMS make.log for nvidia-{DRIVER} for kernel 6.8.4-2-pve (x86_64)\nerror: x\n")
    assert not per_kernel(gather(root))[NEW]["build_failed"]


# findings, one kind at a time


def test_healthy_is_all_ok() -> None:
    found = check_kernels(gather("healthy"), pin_kernel=False)
    assert {f.severity for f in found} == {"ok"} and not any(f.blocking for f in found)
    assert [f.code for f in found] == ["kernel_module", "kernel_module"]
    assert boot_module(found).message == f"module {DRIVER} built for {NEW} (boots next)"


def test_module_missing_for_the_next_boot() -> None:
    found = check_kernels(gather("new-kernel-without-module"), pin_kernel=False)
    module = boot_module(found)
    assert module.severity == "fail" and not module.blocking
    assert "GPUs will be gone after the next reboot" in module.message
    assert module.fix == f"the host stage builds it: dkms autoinstall -k {NEW}"
    assert not named(found, "kernel_headers") and not named(found, "dkms_build")


def test_headers_missing() -> None:
    found = check_kernels(gather("headers-missing"), pin_kernel=False)
    (headers,) = named(found, "kernel_headers")
    assert headers.severity == "fail" and not headers.blocking and NEW in headers.message
    assert headers.fix == f"the host stage installs proxmox-headers-{NEW}"
    assert f"proxmox-headers-{NEW}" in boot_module(found).fix and "dkms autoinstall -k" in boot_module(found).fix
    assert not any(f.blocking for f in found)


def test_dkms_build_failed_blocks_without_pin_kernel() -> None:
    found = check_kernels(gather("dkms-build-failed"), pin_kernel=False)
    (build,) = named(found, "dkms_build")
    assert build.severity == "fail" and build.blocking
    assert "error: type defaults to ‘int’ in declaration of ‘this_kernel_is_too_new’" in build.message
    assert "cc1: some warnings being treated as errors" in build.message
    assert build.fix == (f"set prepare.pin_kernel so the host stage pins {OLD} with proxmox-boot-tool, "
                         f"or install a driver that supports {NEW}")
    assert "GPUs will be gone after the next reboot" in boot_module(found).message


def test_dkms_build_failed_with_pin_kernel_does_not_block() -> None:
    found = check_kernels(gather("dkms-build-failed"), pin_kernel=True)
    (build,) = named(found, "dkms_build")
    assert build.severity == "fail" and not build.blocking
    assert f"the host stage pins {OLD} with proxmox-boot-tool" in build.fix
    assert not any(f.blocking for f in found)


def test_dkms_build_failed_with_no_kernel_to_pin_blocks_anyway() -> None:
    facts = gather("dkms-build-failed")
    per_kernel(facts)[OLD]["module"] = "missing"  # no kernel has the module
    (build,) = named(check_kernels(facts, pin_kernel=True), "dkms_build")
    assert build.blocking and "no installed kernel has module" in build.fix
    assert not named(check_kernels(facts, pin_kernel=True), "kernel_support")


def test_kernel_support() -> None:
    (support,) = named(check_kernels(gather("dkms-build-failed"), pin_kernel=False), "kernel_support")
    assert support.severity == "fail" and not support.blocking
    assert support.message == (f"kernel {NEW} is newer than driver {DRIVER} supports "
                              f"(its DKMS build failed; {OLD} has the module)")


def test_pinned_kernel_warns_only() -> None:
    found = check_kernels(gather("pinned"), pin_kernel=False)
    assert not any(f.blocking for f in found) and {f.severity for f in found} == {"ok", "warn"}
    assert boot_module(found).message == f"module {DRIVER} built for {OLD} (boots next)"
    (other,) = [f for f in named(found, "kernel_module") if f.severity == "warn"]
    assert NEW in other.message and "dkms autoinstall -k " + NEW in other.fix


def test_no_dkms_tree_is_missing_and_blocks(tmp_path: Path) -> None:
    root = copy_case("new-kernel-without-module", tmp_path)
    shutil.rmtree(root / "var/lib/dkms")
    shutil.rmtree(root / "lib/modules")
    facts = gather(root)
    assert facts["dkms_registered"] is False
    assert {k["module"] for k in facts["kernels"]} == {"missing"}
    module = boot_module(check_kernels(facts, pin_kernel=True))
    assert module.severity == "fail" and module.blocking
    assert module.fix == f"install driver {DRIVER} with --dkms"
    assert "GPUs will be gone after the next reboot" in module.message


def test_no_kernel_image_warns(tmp_path: Path) -> None:
    (found,) = check_kernels(gather(tmp_path), pin_kernel=False)
    assert found.code == "kernel_module" and found.severity == "warn" and not found.blocking


def test_evaluate_checks_kernels_only_when_gathered() -> None:
    facts = json.loads((ROOT / "tests/fixtures/host/h200/host-facts.json").read_text())
    before = evaluate(facts, Expectations(driver_version=DRIVER))
    assert not [f for f in before if f.code.startswith(("kernel", "dkms"))]
    with_kernels = copy.deepcopy(facts)
    with_kernels["kernels"] = gather("dkms-build-failed")
    blocked = named(evaluate(with_kernels, Expectations(driver_version=DRIVER)), "dkms_build")
    assert blocked[0].blocking
    pinned = named(evaluate(with_kernels, Expectations(driver_version=DRIVER, pin_kernel=True)), "dkms_build")
    assert not pinned[0].blocking
    assert evaluate(facts, Expectations(driver_version=DRIVER)) == before


def test_pin_candidate_and_reboot_safety() -> None:
    from gpunode.stages.host.reboot import pin_candidate, reboot_safety

    def row(version: str, module: str, boots_next: bool = False) -> dict[str, object]:
        return {"version": version, "module": module, "boots_next": boots_next}

    broken = {"version": "580.159.04", "kernels": [row("6.8.12-8-pve", "installed"), row("6.8.12-9-pve", "installed"),
                                                   row("6.8.12-10-pve", "missing", boots_next=True)]}
    assert pin_candidate(broken) == "6.8.12-9-pve"
    assert reboot_safety(broken).startswith("NOT safe to reboot: 6.8.12-10-pve boots next and has no NVIDIA module")
    assert reboot_safety(broken, "6.8.12-9-pve") == "safe to reboot: pinned 6.8.12-9-pve, which has the NVIDIA module"
    healthy = {"kernels": [row("6.8.12-8-pve", "installed"), row("6.8.12-9-pve", "installed", boots_next=True)]}
    assert pin_candidate(healthy) is None
    assert reboot_safety(healthy) == "safe to reboot: 6.8.12-9-pve boots next and has the NVIDIA module"
    assert pin_candidate({"kernels": [row("6.8.12-9-pve", "missing", boots_next=True)]}) is None  # nothing to pin
    assert reboot_safety({"kernels": []}) == "no installed kernel found (/boot/vmlinuz-*)"


def test_the_failed_build_log_is_the_one_recorded_in_the_lab() -> None:
    here = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "kernels"
    recorded = (here / "recorded-make.log").read_text()
    assert recorded.startswith("DKMS make.log for nvidia-580.159.04 for kernel 6.1.0-50-rt-amd64 (x86_64)\n")
    assert "error: type defaults to" in recorded and "Error 2" in recorded
    case = here / "dkms-build-failed" / "var" / "lib" / "dkms" / "nvidia" / "580.159.04" / "build" / "make.log"
    assert case.read_text() == recorded.replace("6.1.0-50-rt-amd64", "6.8.12-9-pve")
