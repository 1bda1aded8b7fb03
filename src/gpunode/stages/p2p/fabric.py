"""The PCIe fabric's causes in the p2p verdict (issue #35, item 3): measurements and fabric facts
(module_utils/pci_fabric.py, the host's view) together name why a pair is slow or broken.

- ``acs``: a pair of GPUs under one PCIe switch is below expectation or has no P2P, and the port
  right below that switch in either GPU's chain (where their traffic enters and leaves it)
  redirects requests or completions (ACSCtl ReqRedir+/CmpltRedir+): the switch sends their
  traffic up to the root complex instead of across.
- ``bar1``: a failing pair with a GPU whose BAR1 is the legacy 256 MiB window (Resizable BAR off):
  large peer mappings fail.
- ``p2p_mode``: direct-attached pairs (no switch above both) while the loaded nvidia module lacks
  the P2P registry keys. A warning from the facts alone: the driver then stages kernel-level P2P
  (custom all-reduce) through system memory, which cudaMemcpy peer copies and NCCL, and so this
  check's own numbers, do not show.
- ``write_collapse``: a flat fabric (no root switch) where one PCIe switch holds two or more GPUs
  and GPUs outside it sit behind two or more other root ports: concurrent posted writes from that
  switch to those roots collapsed by 75-93 % on some switch and CPU combinations (rtx6kpro
  hardware/collapse-report.md, lines 3, 219-224, 253-258, 281-284). A warning from the facts
  alone: a one-pair-at-a-time matrix, uni or bidirectional, does not show it (the collapsing
  Broadcom rig's pair matrices are healthy, hardware/asus-esc8000a-e13p-broadcom-switches.md
  lines 205-217, 274-286), and it did not reproduce on one rig after a BIOS, kernel and driver
  update (hardware/wrx90-cpayne-16gpu-4switch.md, lines 329-336).
- ``fabric-unread``: the facts are incomplete (read without root, or no sysfs here), so nothing
  above is said. An info, never a cause guessed from half the chain.

Stdlib only, with pci_fabric beside it: this runs in the server image (p2p/stage.py ships both).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpunode.ansible_collections.gpunode.core.plugins.module_utils.pci_fabric import (
    BDF, LEGACY_BAR1, P2P_REGISTRY_DWORDS, REDIRECT_BITS, live_p2p_keys, missing_p2p_keys, parents, shape_problem, switches)
from gpunode.stages.p2p.topology import Topology
from gpunode.stages.p2p.findings import Finding, PairVerdict, pair_name

CAUSES = ("acs", "bar1", "p2p_mode", "write_collapse")  # the first three: the host stage's names too
SHORT_CONFIG = 64  # a config space this short is only the header: no capability was read
TROUBLED = ("below-expectation", "p2p-unavailable", "not-measured")
ACS_FIX = ("set prepare.clear_acs in the host file so the host stage clears ReqRedir and CmpltRedir on these ports at "
           "each boot (an owned setpci unit), or turn ACS off in the firmware; then run gpunode p2p again")
BAR1_FIX = ("turn on Above 4G Decoding and Resizable BAR in the firmware (a reboot through its setup); gpunode cannot "
            "change it from the host")
COLLAPSE_FIX = ("test it with concurrent writes from two GPUs of that switch to GPUs behind two other root ports "
                "(rtx6kpro scripts/collapse_repro.py); where it collapses, a fabric with a root switch above the "
                "switches avoids it and NCCL's ring all-reduce does not trigger it (tree, all-to-all and broadcast do); "
                "iommu=on masks it at a cost (collapse-report.md lines 324-332)")
P2P_MODE_FIX = (f"set prepare.p2p_registry in the host file (the host stage writes NVreg_RegistryDwords="
                f"\"{P2P_REGISTRY_DWORDS}\" to a modprobe.d file it owns), then reload the nvidia module or reboot")


def _size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def fabric_address(pci_bus_id: str) -> str:
    """NVML's bus id (``00000000:01:00.0``, an 8-digit domain) as sysfs names it (``0000:01:00.0``)."""
    return pci_bus_id.strip().lower()[-12:]


def unread(fabric: Any, topology: Topology) -> str | None:
    """Why the facts cannot carry a cause, or None when every GPU measured here and every bridge
    above it was read whole (other GPUs of the host do not matter: their chains are not judged)."""
    shape = shape_problem(fabric)
    if shape:
        return f"the facts are not pci_fabric's ({shape})"
    entries = {g["address"]: g for g in fabric["gpus"]}  # shape_problem: mappings with PCI addresses
    missing = [gpu.index for gpu in topology.gpus if fabric_address(gpu.pci_bus_id) not in entries]
    if not entries or missing:
        return ("the fabric facts list no GPU" if not entries else
                "the fabric facts lack " + ", ".join(f"GPU{i}" for i in missing))
    for gpu in topology.gpus:
        entry = entries[fabric_address(gpu.pci_bus_id)]
        chain = entry.get("parents", [])  # a list (shape_problem); of bridges, checked here
        if not all(isinstance(p, dict) for p in chain):
            return f"the facts of {entry['address']} are not pci_fabric's (its parents are not a list of bridges)"
        for function in [entry, *chain]:
            size, acs = function.get("config_bytes"), function.get("acs")
            if not BDF.match(str(function.get("address"))) or not isinstance(size, int) or isinstance(size, bool) \
                    or not (acs is None or isinstance(acs, dict)):
                return f"the facts of {entry['address']} are not pci_fabric's (a bridge without a PCI address or config)"
            if function.get("port_type") is None or size <= SHORT_CONFIG:
                return f"the config space of {function['address']} was not read (run as root on the host)"
    return None


def _redirect_below(entry: dict[str, Any], switch: str) -> list[str]:
    """The port right below ``switch`` in this GPU's chain, where its peer traffic enters and leaves
    the switch, if its ACS redirects that traffic (ports further down route upward anyway)."""
    chain = parents(entry)
    start = next(i for i, p in enumerate(chain) if p.get("address") == switch)
    port = chain[start + 1] if start + 1 < len(chain) else {}
    bits = [b for b in REDIRECT_BITS if (port.get("acs") or {}).get(b)]
    return [f"{port['address']} ({'+ '.join(bits)}+)"] if bits else []


def _root_port(entry: dict[str, Any]) -> str:
    """The top of a GPU's chain: the root port (or the GPU itself on the root bus)."""
    chain = parents(entry)
    return str(chain[0]["address"] if chain else entry["address"])


def collapse_switches(entries: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each switch with two or more GPUs beneath it whose outside GPUs (those sharing no switch with
    any of its GPUs, so their traffic crosses a CPU root port) sit behind two or more root ports
    other than its own: switch -> those root ports."""
    beneath: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        for switch in switches(entry):
            beneath.setdefault(switch, []).append(entry)
    out: dict[str, list[str]] = {}
    for switch, inside in sorted(beneath.items()):
        if len(inside) < 2:
            continue
        shared = {s for entry in inside for s in switches(entry)}
        own = {_root_port(entry) for entry in inside}
        roots = sorted({_root_port(e) for e in entries if e not in inside and not set(switches(e)) & shared} - own)
        if len(roots) >= 2:
            out[switch] = roots
    return out


def causes(fabric: Any, topology: Topology, pairs: list[PairVerdict],
           findings: list[Finding]) -> list[Finding]:
    """Node-level findings, one per fabric cause, naming the pairs it explains; each such pair gains
    the cause's code among its reasons, and its below-expectation finding leads with it."""
    if fabric is None:
        return []
    why = unread(fabric, topology)  # also: not a mapping at all
    if why:
        return [Finding("fabric-unread", "info", subject="node", message=f"PCIe fabric not judged: {why}",
                        category="info")]
    entries = {g["address"]: g for g in fabric["gpus"]}
    entry = {gpu.index: entries[fabric_address(gpu.pci_bus_id)] for gpu in topology.gpus}
    troubled = {f.subject for f in findings if f.code in TROUBLED}
    acs: dict[str, list[str]] = {}
    bar1: dict[str, list[str]] = {}
    direct: list[str] = []
    for pair in pairs:
        name = pair_name(pair.src, pair.dst)
        one, other = entry[pair.src], entry[pair.dst]
        shared = [s for s in switches(one) if s in switches(other)]
        if not shared and pair.link_class != "nvlink":  # NVLink peers do not cross PCIe
            direct.append(name)
        if name not in troubled:
            continue
        if shared:
            switch = shared[-1]  # the nearest switch above both: where their traffic should turn
            ports = sorted(set(_redirect_below(one, switch) + _redirect_below(other, switch)))
            if ports:
                acs[name] = ports
        small = [f"GPU{i} {entry[i]['bar1_bytes'] // 2**20} MiB" for i in (pair.src, pair.dst)
                 if _size(entry[i].get("bar1_bytes")) and entry[i]["bar1_bytes"] <= LEGACY_BAR1]
        if small:
            bar1[name] = small
    out = []
    if acs:
        ports = sorted({p for named in acs.values() for p in named})
        out.append(Finding("acs", "fail", subject="node",
                           message=f"ACS redirects peer traffic between GPUs under one PCIe switch up to the root "
                           f"complex ({', '.join(ports)}): explains {', '.join(acs)}",
                           cause="ACS ReqRedir/CmpltRedir on the switch's downstream ports sends every peer request "
                           "and completion through the root complex: P2P halved or failing (rtx6kpro "
                           "hardware/topology.md)",
                           fix=ACS_FIX, category="p2p"))
    if bar1:
        out.append(Finding("bar1", "fail", subject="node",
                           message="BAR1 is the legacy 256 MiB window "
                           f"({', '.join(sorted({s for v in bar1.values() for s in v}))}): explains {', '.join(bar1)}",
                           cause="without Resizable BAR the peer can map only 256 MiB of the card's memory: large peer "
                           "mappings fail", fix=BAR1_FIX, category="p2p"))
    missing = missing_p2p_keys(live_p2p_keys(fabric))
    if direct and fabric.get("driver_params") and missing:
        out.append(Finding("p2p_mode", "warn", subject="node",
                           message=f"{len(direct)} measured pair(s) share no PCIe switch ({', '.join(direct[:4])}"
                           f"{', ...' if len(direct) > 4 else ''}) and the loaded nvidia module lacks "
                           f"{', '.join(missing)}: kernel-level P2P is staged through system memory",
                           cause="custom all-reduce runs about 15x slower (rtx6kpro "
                           "optimization/pcie-oneshot-allreduce.md); cudaMemcpy peer copies and NCCL, and so the "
                           "numbers above, do not show it", fix=P2P_MODE_FIX, category="node"))
    nvlinked = {i for p in pairs if p.link_class == "nvlink" for i in (p.src, p.dst)}  # their peers use NVLink
    collapse = collapse_switches([e for i, e in entry.items() if i not in nvlinked])
    if collapse:
        named = "; ".join(f"switch {switch} to root ports {', '.join(roots)}" for switch, roots in collapse.items())
        out.append(Finding("write_collapse", "warn", subject="node",
                           message=f"the fabric has the posted-write collapse pattern: two or more GPUs under one PCIe "
                           f"switch writing concurrently to GPUs behind two or more other root ports ({named})",
                           cause="on some switch and CPU combinations such writes collapse by 75-93 % (Broadcom "
                           "PEX890xx + EPYC 9575F, Microchip PM50100 + TR Pro 7955WX; rtx6kpro "
                           "hardware/collapse-report.md); the pair-at-a-time numbers above cannot show it",
                           fix=COLLAPSE_FIX, category="node"))
    explained: dict[str, list[str]] = {"acs": list(acs), "bar1": list(bar1),
                                       "p2p_mode": direct if any(f.code == "p2p_mode" for f in out) else []}
    by_name = {pair_name(p.src, p.dst): p for p in pairs}
    for code, named in explained.items():
        for name in named:
            by_name[name].reasons.append(code)
            at = next((i for i, f in enumerate(findings) if f.subject == name and f.code == "below-expectation"), None)
            if at is not None and code != "p2p_mode":
                cause, below = next(f.cause for f in out if f.code == code), findings[at]
                findings[at] = replace(below, cause=f"{code}: {cause}" + (f"; {below.cause}" if below.cause else ""))
    return out
