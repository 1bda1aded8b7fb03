"""The host stage's findings about the PCIe fabric under the GPUs (issue #35): acs, bar1, p2p_mode,
aspm, each with its fix, from module_utils/pci_fabric.py's facts (the ``fabric`` key).

Where they come from (local-inference-lab/rtx6kpro, FIELD-NOTES s13): ACS redirect on a switch's
downstream ports or on root ports sends peer traffic up through the root complex (P2P halved or
failing); a BAR1 of the legacy 256 MiB window (Above 4G decoding / Resizable BAR off in the
firmware) makes large peer mappings fail; on direct-attached GPUs (no PCIe switch between a pair)
the driver stages kernel-level P2P through system memory unless the nvidia module has the
registry keys below, which NCCL and cudaMemcpy peer copies do not show; PCIe link power management
is behind surprise link-down lockups.

Severity follows the topology: ACS on a switch's downstream port fails only when another GPU sits
under the same switch (their traffic is what it redirects); the registry keys matter only when a
pair of GPUs shares no switch. Nothing here blocks: the host stage repairs what ``prepare`` allows,
by files it owns, and the rest is advice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpunode.ansible_collections.gpunode.core.plugins.module_utils.pci_fabric import (
    BDF, LEGACY_BAR1, P2P_REGISTRY_DWORDS, direct_pairs, live_p2p_keys, missing_p2p_keys, parents, redirecting_bridges, registry_dwords,
    shared_switch_ports)
from gpunode.ground.finding import FAIL, OK, WARN, Finding
from gpunode.stages.host.vfio import release_cmdline

LINK_POWER_OFF = {"pcie_aspm": "off", "pcie_port_pm": "off"}
# ACS Control bits 2 and 3 (ReqRedir, CmpltRedir): the unit clears only these, keeping SrcValid and
# UpstreamFwd, which leaves 0x0011 where the kernel set 0x001d (rtx6kpro's disable-acs.service
# writes that 0x0011; tests/fixtures/host/fabric holds a real machine's lspci after it).
ACS_CLEAR_MASK = 0x000C
MIN_BAR1 = 64 * 2**30  # below every card gpunode serves (RTX PRO 6000 96 GB, H200 141 GB): maps a part only


@dataclass(frozen=True)
class FabricExpectations:
    """What ``prepare`` lets the host stage change about the fabric (each off unless the host file says)."""

    clear_acs: bool = False  # an owned unit clears ACS redirect at boot (setpci)
    p2p_registry: bool = False  # an owned modprobe.d file gives the nvidia module the P2P keys
    link_power_off: bool = False  # pcie_aspm=off pcie_port_pm=off on the kernel command line


def unread_bridges(gpus: list[dict[str, Any]]) -> list[str]:
    """Bridges whose ACS could not be read (a config space of 256 bytes or less: read without root)."""
    return sorted({p["address"] for gpu in gpus for p in parents(gpu)
                   if p.get("acs") is None and int(p.get("config_bytes") or 0) <= 256})


def check_acs(fabric: dict[str, Any], expect: FabricExpectations) -> Finding:
    gpus = list(fabric.get("gpus") or [])
    redirect = redirecting_bridges(gpus)
    shared = shared_switch_ports(gpus)
    failing = [address for address in sorted(redirect) if address in shared]
    if redirect:
        named = "; ".join(f"{address} ({entry['port_type'] or 'bridge'}: {'+ '.join(entry['bits'])}+, above "
                          f"{', '.join(entry['gpus'])})" for address, entry in sorted(redirect.items()))
        if failing:
            fix = ("the host stage clears ReqRedir and CmpltRedir on " + ", ".join(failing) + " at each boot with "
                   "setpci (gpunode-pcie-acs.service, prepare.clear_acs); reboot, or start the unit, to clear it now"
                   if expect.clear_acs else
                   "set prepare.clear_acs so the host stage clears it at boot with setpci, or turn ACS off in the "
                   "firmware")
            return Finding("acs", FAIL, f"ACS redirects peer traffic through the root complex between GPUs under one "
                           f"PCIe switch (P2P halved or failing): {named}", fix=fix)
        return Finding("acs", WARN, f"ACS redirect on bridges above the GPUs (peer traffic goes up to the root "
                       f"complex): {named}", fix="gpunode clears ACS only on the downstream ports of a switch shared "
                       "by GPUs; turn it off in the firmware if these GPUs must reach each other directly")
    unread = unread_bridges(gpus)
    if unread:
        return Finding("acs", WARN, f"cannot read ACS on {', '.join(unread)} (config space of 256 bytes: read as "
                       "root to see the extended capabilities)", fix="run the host stage as root on the Proxmox host")
    bridges = {p["address"] for gpu in gpus for p in parents(gpu)}
    if not bridges:
        return Finding("acs", OK, "no bridge above the GPUs (on the root bus): nothing to redirect peer traffic")
    return Finding("acs", OK, f"no ACS redirect on the {len(bridges)} bridge(s) above the GPUs")


def _mib(size: int) -> str:
    return f"{size // 2**30} GiB" if size >= 2**30 else f"{size // 2**20} MiB"


def check_bar1(fabric: dict[str, Any]) -> Finding:
    gpus = list(fabric.get("gpus") or [])
    sizes = {str(g["address"]): g.get("bar1_bytes") for g in gpus}
    unknown = [a for a, size in sizes.items() if not isinstance(size, int)]
    small = {a: size for a, size in sizes.items() if isinstance(size, int) and size < MIN_BAR1}
    fix = ("turn on Above 4G Decoding and Resizable BAR in the firmware (a reboot through its setup); gpunode "
           "cannot change it from the host")
    if small:
        named = ", ".join(f"{a} {_mib(size)}" for a, size in sorted(small.items()))
        if any(size <= LEGACY_BAR1 for size in small.values()):
            return Finding("bar1", FAIL, f"BAR1 is the legacy {_mib(LEGACY_BAR1)} window, not the card's memory "
                           f"(Resizable BAR off): large peer mappings fail: {named}", fix=fix)
        return Finding("bar1", WARN, f"BAR1 smaller than the card's memory: {named}", fix=fix)
    if unknown:
        return Finding("bar1", WARN, f"BAR1 size unknown for {', '.join(unknown)} (no sysfs resource file)",
                       fix="read the host stage's facts on the Proxmox host itself")
    if not gpus:
        return Finding("bar1", WARN, "no GPU in the fabric facts", fix="check `lspci -d 10de:` on the host")
    return Finding("bar1", OK, "BAR1 " + ", ".join(sorted({_mib(int(s)) for s in sizes.values()})) + " on "
                   f"{len(gpus)} GPU(s): Resizable BAR is on")


def configured_registry(modprobe: list[dict[str, Any]]) -> dict[str, str]:
    """The RegistryDwords keys an ``options nvidia NVreg_RegistryDwords=...`` line in modprobe.d sets
    (the last line wins, as for modprobe)."""
    found: dict[str, str] = {}
    for item in modprobe:
        words = str(item.get("line") or "").split()
        if len(words) < 3 or words[0] != "options" or words[1] != "nvidia":
            continue
        for word in words[2:]:
            key, sep, value = word.partition("=")
            if sep and key == "NVreg_RegistryDwords":
                found = registry_dwords(value.strip("\"'"))
    return found


def check_p2p_mode(fabric: dict[str, Any], modprobe: list[dict[str, Any]], expect: FabricExpectations) -> Finding:
    gpus = list(fabric.get("gpus") or [])
    if len(gpus) < 2:
        return Finding("p2p_mode", OK, f"{len(gpus)} GPU: no peer to reach")
    pairs = direct_pairs(gpus)
    if not pairs:
        return Finding("p2p_mode", OK, "every pair of GPUs shares a PCIe switch: kernel-level P2P is direct")
    live = live_p2p_keys(fabric)
    if not fabric.get("driver_params"):
        return Finding("p2p_mode", WARN, f"{len(pairs)} pair(s) of GPUs share no PCIe switch (e.g. {pairs[0][0]} and "
                       f"{pairs[0][1]}); the nvidia module is not loaded, so its P2P keys cannot be read",
                       fix="load the driver, then run the host stage again")
    missing = missing_p2p_keys(live)
    if not missing:
        return Finding("p2p_mode", OK, f"{len(pairs)} direct-attached pair(s); the nvidia module has the P2P keys")
    pending = not missing_p2p_keys(configured_registry(modprobe))
    detail = (f"{len(pairs)} pair(s) of GPUs share no PCIe switch (e.g. {pairs[0][0]} and {pairs[0][1]}) and the "
              f"loaded nvidia module lacks {', '.join(missing)}: the driver stages kernel-level P2P through system "
              "memory (custom all-reduce about 15x slower; NCCL and cudaMemcpy peer copies look healthy)")
    if pending:
        return Finding("p2p_mode", WARN, detail + "; modprobe.d has the keys, not yet in effect",
                       fix="reload the nvidia module (stop what uses the GPUs) or reboot: gpunode does neither unasked")
    fix = (f"the host stage writes NVreg_RegistryDwords=\"{P2P_REGISTRY_DWORDS}\" to /etc/modprobe.d "
           "(prepare.p2p_registry); then reload the nvidia module or reboot" if expect.p2p_registry else
           f"set prepare.p2p_registry, or add options nvidia NVreg_RegistryDwords=\"{P2P_REGISTRY_DWORDS}\" "
           "to /etc/modprobe.d yourself; then reload the nvidia module or reboot")
    return Finding("p2p_mode", WARN, detail, fix=fix)


def check_aspm(fabric: dict[str, Any], expect: FabricExpectations) -> Finding:
    power = fabric.get("link_power") or {}
    on = [f"{key}={power.get(key) or '(kernel default)'}" for key, want in LINK_POWER_OFF.items()
          if power.get(key) != want]
    if not on:
        return Finding("aspm", OK, "pcie_aspm=off pcie_port_pm=off on the running kernel's command line")
    fix = ("the host stage adds pcie_aspm=off pcie_port_pm=off to the kernel command line (prepare.link_power_off); "
           "it takes effect at the next reboot" if expect.link_power_off else
           "set prepare.link_power_off so the host stage adds pcie_aspm=off pcie_port_pm=off to the kernel command "
           "line; then reboot")
    return Finding("aspm", WARN, f"PCIe link power management is on ({', '.join(on)}): behind surprise link-down "
                   "lockups of GPUs", fix=fix)


def evaluate_fabric(fabric: dict[str, Any], modprobe: list[dict[str, Any]], expect: FabricExpectations) -> list[Finding]:
    return [check_acs(fabric, expect), check_bar1(fabric), check_p2p_mode(fabric, modprobe, expect),
            check_aspm(fabric, expect)]


def acs_to_clear(fabric: dict[str, Any]) -> list[str]:
    """The ports on which the host stage clears ACS redirect at each boot (prepare.clear_acs): the
    downstream ports of switches shared by GPUs, whatever their bits are now (a stable list, so the
    unit is not rewritten once it has done its work). Root ports are left to the firmware."""
    return sorted(shared_switch_ports(list(fabric.get("gpus") or [])))


def wants_p2p_registry(fabric: dict[str, Any]) -> bool:
    """Whether some pair of GPUs is direct-attached, so the nvidia module needs the P2P keys."""
    return bool(direct_pairs(list(fabric.get("gpus") or [])))


# -- what the host stage writes (files it owns; text in, text out) -------------------------------
_GRUB_ANY = re.compile(r"^\s*(export\s+)?GRUB_[A-Z_]+=")
_GRUB_DEFAULT = re.compile(r"^\s*(export\s+)?GRUB_CMDLINE_LINUX_DEFAULT=")
# One value, double- or single-quoted (no quote of its kind inside) or bare, then only blanks.
_GRUB_LINE = re.compile(r"""^(?P<head>\s*(?:export\s+)?GRUB_CMDLINE_LINUX_DEFAULT=)"""
                        r"""(?:"(?P<dq>[^"\\$`]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s"'#;&|$`\\]*))[ \t]*\Z""")


def acs_unit(bridges: list[str]) -> str:
    """The systemd unit that clears ACS redirect on ``bridges`` at each boot, before anything uses
    the GPUs: ``setpci -s BDF ECAP_ACS+0x6.w=0000:000c`` (setpci's value:mask writes only the masked
    bits; ECAP_ACS finds the capability wherever the port keeps it). Addresses are checked: each
    becomes one argument of setpci, never anything else."""
    bad = [b for b in bridges if not isinstance(b, str) or not BDF.match(b)]
    if bad or not bridges:
        raise ValueError(f"not PCI addresses: {bad}" if bad else "no bridge to clear ACS on")
    lines = "\n".join(f"ExecStart=/usr/bin/setpci -s {bdf} ECAP_ACS+0x6.w=0000:{ACS_CLEAR_MASK:04x}"
                      for bdf in sorted(set(bridges)))
    return ("# Managed by gpunode (prepare.clear_acs): ACS redirect on the downstream ports of switches shared\n"
            "# by GPUs sends their peer traffic through the root complex (P2P halved or failing).\n"
            "[Unit]\nDescription=Clear PCIe ACS redirect above the GPUs (gpunode)\nDefaultDependencies=no\n"
            "After=sysinit.target\nBefore=nvidia-persistenced.service pve-guests.service\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=true\n{lines}\n\n[Install]\nWantedBy=multi-user.target\n")


def _power_off_words(words: list[str]) -> list[str]:
    kept = [w for w in words if w.partition("=")[0] not in LINK_POWER_OFF]
    return kept + [f"{key}={value}" for key, value in LINK_POWER_OFF.items()]


def _has_power_off(words: list[str]) -> bool:
    return [w for w in words if w.partition("=")[0] in LINK_POWER_OFF] == [f"{k}={v}" for k, v in LINK_POWER_OFF.items()]


def with_link_power_off(text: str) -> str:
    """A kernel command line file with pcie_aspm=off pcie_port_pm=off (other values of those two
    replaced): /etc/kernel/cmdline (one line of words), or /etc/default/grub (its
    GRUB_CMDLINE_LINUX_DEFAULT, which must be one quoted value with nothing after it). Unchanged
    when they are already there, so a re-run writes nothing. A grub file gpunode cannot edit safely
    (no such line, a value it cannot read as one) raises ValueError naming why: never a guess."""
    lines = text.splitlines(keepends=True)
    if any(_GRUB_ANY.match(line) or line.lstrip().startswith("#") for line in lines):
        out, edited = [], False
        for line in lines:
            if not _GRUB_DEFAULT.match(line):
                out.append(line)
                continue
            match = _GRUB_LINE.match(line.rstrip("\n"))
            if match is None:
                raise ValueError(f"cannot add pcie_aspm=off pcie_port_pm=off to {line.strip()!r}: not one quoted "
                                 "value with nothing after it; edit it by hand")
            edited = True
            quote = "'" if match.group("sq") is not None else '"'  # the operator's quoting, kept
            words = next(v for v in match.group("dq", "sq", "bare") if v is not None).split()
            if not _has_power_off(words):
                line = f"{match.group('head')}{quote}{' '.join(_power_off_words(words))}{quote}\n"
            out.append(line)
        if not edited:
            raise ValueError("no GRUB_CMDLINE_LINUX_DEFAULT line to add pcie_aspm=off pcie_port_pm=off to; add it by hand")
        return "".join(out)
    if not text.strip():
        return text
    words = text.split()
    return text if _has_power_off(words) else " ".join(_power_off_words(words)) + "\n"


def edit_cmdline(text: str, release_vfio: bool, link_power_off: bool) -> str:
    """What the host stage writes to a kernel command line file: NVIDIA GPUs released from vfio-pci
    (prepare.release_vfio), link power management off (prepare.link_power_off)."""
    edited = release_cmdline(text) if release_vfio else text
    return with_link_power_off(edited) if link_power_off else edited
